"""The gateway's request handling: caller -> limits -> body -> media -> priority -> admission -> proxy.

One `Gateway` per app owns the controller, the background scheduler, the metrics and the upstream pool,
and runs two loops beside the requests: the controller's ticks and the poll of vLLM's /metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from copy import deepcopy
from typing import Any, Literal

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from visioncap.config.gateway import GatewayConfig
from visioncap.gateway.admission import AdmissionController, Decision
from visioncap.gateway.auth import Caller, KeyRing
from visioncap.gateway.bodies import BodyBudget, RequestBody
from visioncap.gateway.errors import ErrorType, GatewayError, RefusalReason, unauthorized
from visioncap.gateway.images import ImageTooLargeError, MediaRefusedError, downscale_messages, inspect_messages
from visioncap.gateway.metrics import GatewayMetrics
from visioncap.gateway.protocol import (
    AnyObjectView,
    ChatCompletionView,
    CompletionView,
    EmbeddingsView,
    ResponsesView,
    parse_body,
)
from visioncap.gateway.proxy import Outcome, ProxyResponse, Upstream, UpstreamResponse
from visioncap.gateway.scheduler import BackgroundScheduler, DeadlineExceededError, Grant, QueueFullError
from visioncap.gateway.sse import StreamObserver
from visioncap.gateway.upstream_metrics import UpstreamPoller, VllmLoad

log = logging.getLogger(__name__)

Endpoint = Literal["chat", "completions", "responses", "embeddings"]
CAMERA_HEADER = "x-visioncap-camera"
DEADLINE_HEADER = "x-visioncap-deadline-ms"
UPSTREAM_PATHS: dict[Endpoint, str] = {
    "chat": "/chat/completions",
    "completions": "/completions",
    "responses": "/responses",
    "embeddings": "/embeddings",
}
VIEWS = {
    "chat": ChatCompletionView,
    "completions": CompletionView,
    "responses": ResponsesView,
    "embeddings": EmbeddingsView,
}
# Where each endpoint keeps the messages whose images count (the Responses API's input items hold content parts
# of type input_image, which the image inspection knows).
MESSAGES_FIELD: dict[Endpoint, str] = {"chat": "messages", "responses": "input"}


class Gateway:
    """State and behaviour of one gateway; `start()`/`stop()` on the serving event loop."""

    def __init__(self, config: GatewayConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.metrics = GatewayMetrics()
        self.keys = KeyRing(config)
        self.controller = AdmissionController(
            config.objectives, config.background, config.controller, pacing=config.pacing
        )
        self.scheduler = BackgroundScheduler(
            caps=lambda: self.controller.caps(self.clock()),
            queue_size=config.background.queue_size,
            clock=clock,
            on_change=self.metrics.scheduler_changed,
        )
        self.bodies = BodyBudget(
            config.limits.max_waiting_body_bytes, self.scheduler.retry_after_s, self.metrics.waiting_body_bytes.set
        )
        self.upstream: Upstream | None = None
        self.poller: UpstreamPoller | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.ready = threading.Event()  # set once serving: lets a thread that started the server wait for it
        self._tasks: list[asyncio.Task[None]] = []
        self._record(self.controller.tick(clock(), 0))

    # -- lifecycle ------------------------------------------------------------------------------------

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        env = self.config.upstream.api_key_env
        self.upstream = Upstream(self.config.upstream, os.environ.get(env) if env else None)
        self._tasks.append(asyncio.create_task(self._control_loop(), name="gateway-controller"))
        if self.config.upstream.metrics_poll_s > 0:
            self.poller = UpstreamPoller(
                self.upstream.get_text,
                self.upstream.metrics_url,
                self.config.upstream.metrics_poll_s,
                self._upstream_load,
                clock=self.clock,
                busy=self._background_present,
                idle_interval_s=self.config.upstream.metrics_idle_poll_s,
            )
            self._tasks.append(asyncio.create_task(self.poller.run(), name="gateway-upstream-metrics"))
        self.ready.set()

    async def stop(self) -> None:
        self.ready.clear()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self.upstream is not None:
            await self.upstream.aclose()

    async def _control_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.controller.interval_s)
            self.control_step()

    def _background_present(self) -> bool:
        state = self.scheduler.state()
        return state.waiting + state.in_flight > 0

    def control_step(self) -> Decision:
        """One controller decision with the scheduler's counts, then admit what the new caps allow."""
        state = self.scheduler.state()
        decision = self.controller.tick(self.clock(), state.in_flight, state.waiting)
        self._record(decision)
        self._preempt()
        self.scheduler.dispatch()
        return decision

    def _preempt(self) -> None:
        background = self.config.background
        if background.preempt:
            asked = self.scheduler.preempt_excess(background.preempt_window_s)
            if asked:
                self.metrics.preemptions.inc(asked)

    def _record(self, decision: Decision) -> None:
        self.metrics.decision(decision)
        if decision.action == "decrease":
            log.debug(
                "background limit -> %.2f (%s; ttft p99 %s, itl p99 %s)",
                decision.limit,
                ",".join(decision.reasons),
                _ms(decision.ttft_p99_s),
                _ms(decision.itl_p99_s),
            )

    def _upstream_load(self, now: float, load: VllmLoad | None) -> None:
        self.metrics.upstream_up.set(1 if load is not None else 0)
        if load is not None:
            self.metrics.upstream_waiting.set(load.waiting)
            self.metrics.upstream_running.set(load.running)
            self.controller.observe_upstream(now, load.waiting, load.running)

    # -- requests -------------------------------------------------------------------------------------

    async def generate(self, request: Request, endpoint: Endpoint) -> Response:
        """POST /v1/chat/completions and /v1/completions."""
        started = self.clock()
        caller: Caller | None = None
        body_in = RequestBody(request)
        try:
            caller = self._authenticate(request)
            self._rate_limit(caller)
            if caller.interactive:
                raw = await body_in.read(self.config.limits.max_body_bytes)
                body, view, image_tokens = self._parse(raw, endpoint, caller)
                del raw
                payload = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
                stream = bool(getattr(view, "stream", False))
                return await self._forward_interactive(request, endpoint, caller, payload, stream, started)
            # Background bodies wait in memory: room in the queue and in the body budget is checked before a byte
            # is read, and only the parsed body is kept while it waits (encoded again once admitted).
            self.scheduler.check_room()
            with self.bodies.hold(request.headers.get("content-length")) as held:
                raw = await body_in.read(self.config.limits.max_background_body_bytes, held.grow)
                body, view, image_tokens = self._parse(raw, endpoint, caller)
                del raw
                _refuse_multiple_choices(body)
                named = request.headers.get(CAMERA_HEADER) or getattr(view, "user", None)
                if named is not None and caller.cameras is not None and named not in caller.cameras:
                    raise GatewayError(
                        403,
                        ErrorType.CAMERA_NOT_ALLOWED,
                        f"this key may not name camera {named[:64]!r}",
                        reason=RefusalReason.CAMERA_NOT_ALLOWED,
                        param=CAMERA_HEADER,
                    )
                camera = named or caller.camera or caller.name
                stream = bool(getattr(view, "stream", False))
                deadline_s = self._deadline_s(request)
                return await self._forward_background(
                    request, endpoint, caller, body, stream, started, camera, image_tokens, deadline_s
                )
        except QueueFullError as exc:
            return self._refuse(
                GatewayError(
                    429,
                    ErrorType.QUEUE_FULL,
                    str(exc),
                    reason=RefusalReason.QUEUE_FULL,
                    headers={"Retry-After": str(exc.retry_after_s)},
                ),
                caller,
                endpoint,
                body_in,
            )
        except GatewayError as exc:
            return self._refuse(exc, caller, endpoint, body_in)

    def _parse(self, raw: bytes, endpoint: Endpoint, caller: Caller) -> tuple[dict[str, Any], Any, int]:
        """The body, its checked view and its estimated image tokens; the key's class sets the priority."""
        body, view = parse_body(raw, VIEWS[endpoint])
        image_tokens = 0
        if endpoint in MESSAGES_FIELD:
            try:
                image_tokens = inspect_messages(body.get(MESSAGES_FIELD[endpoint]), self.config.images)
            except ImageTooLargeError as exc:
                raise GatewayError(
                    400, ErrorType.IMAGE_TOO_LARGE, str(exc), reason=RefusalReason.IMAGE_TOO_LARGE, param="messages"
                ) from exc
            except MediaRefusedError as exc:
                raise GatewayError(
                    400,
                    ErrorType.MEDIA_URL_NOT_ALLOWED,
                    str(exc),
                    reason=RefusalReason.MEDIA_URL_REFUSED,
                    param="messages",
                ) from exc
        body["priority"] = caller.traffic_class.priority  # the key decides, never the caller's body
        return body, view, image_tokens

    async def models(self, request: Request) -> Response:
        """GET /v1/models, passed through for any valid key."""
        caller: Caller | None = None
        try:
            caller = self._authenticate(request)
            assert self.upstream is not None
            upstream = await self.upstream.open("GET", "/models", incoming=dict(request.headers))
        except GatewayError as exc:
            return self._refuse(exc, caller, "models")

        def finish(outcome: Outcome) -> None:
            self.metrics.requests.labels(caller.class_name, "models", str(outcome.status)).inc()

        return ProxyResponse(upstream, finish)

    async def utility(self, request: Request, path: str) -> Response:
        """POST /tokenize and /detokenize (vLLM serves them beside /v1), passed through for any valid key: they
        take no engine step, so they are neither queued nor paced."""
        caller: Caller | None = None
        name = path.strip("/")
        body_in = RequestBody(request)
        try:
            caller = self._authenticate(request)
            self._rate_limit(caller)
            raw = await body_in.read(self.config.limits.max_body_bytes)
            parse_body(raw, AnyObjectView)  # the same hostile-input rules as everything else
            assert self.upstream is not None
            upstream = await self.upstream.open("POST", path, raw, incoming=dict(request.headers), root=True)
        except GatewayError as exc:
            return self._refuse(exc, caller, name, body_in, self.config.limits.max_body_bytes)

        def finish(outcome: Outcome) -> None:
            self.metrics.requests.labels(caller.class_name, name, str(outcome.status)).inc()

        return ProxyResponse(upstream, finish)

    def health(self, request: Request) -> Response:
        """Liveness and the admission state; where vLLM is and what went wrong there only for a valid key (an
        internal address and an error text tell an outsider more than whether the gateway is up)."""
        state = self.scheduler.state()
        now = self.clock()
        caps = self.controller.caps(now)
        poller = self.poller
        trusted = self.keys.identify(request.headers) is not None
        return JSONResponse(
            {
                "status": "ok",
                "upstream": {
                    "base_url": self.config.upstream.base_url if trusted else None,
                    "metrics": None
                    if poller is None
                    else {
                        "ok": poller.last is not None,
                        "error": poller.last_error if trusted else None,
                        "waiting": poller.last.waiting if poller.last else None,
                        "running": poller.last.running if poller.last else None,
                        # Read every metrics_poll_s while background work is present, else metrics_idle_poll_s.
                        "age_s": None if poller.last_at is None else round(now - poller.last_at, 3),
                    },
                },
                "background": {
                    "waiting": state.waiting,
                    "in_flight": state.in_flight,
                    "image_tokens_in_flight": state.image_tokens_in_flight,
                    "concurrency_cap": caps.concurrency,
                    "image_tokens_cap": caps.image_tokens,
                    "limit": round(self.controller.limit, 3),
                    "starts_per_s": (
                        None if self.controller.starts_per_s is None else round(self.controller.starts_per_s, 3)
                    ),
                },
                "interactive": {
                    "in_flight": self.controller.interactive_in_flight,
                    "active": caps.interactive_active,
                },
            }
        )

    # -- steps ----------------------------------------------------------------------------------------

    def _authenticate(self, request: Request) -> Caller:
        caller = self.keys.identify(request.headers)
        if caller is None:
            raise unauthorized()
        return caller

    def _rate_limit(self, caller: Caller) -> None:
        if caller.limiter is None:
            return
        wait_s = caller.limiter.take(self.clock())
        if wait_s is not None:
            raise GatewayError(
                429,
                ErrorType.RATE_LIMIT_EXCEEDED,
                f"key {caller.name!r} is over its request rate limit; retry in {wait_s:.2f} s",
                reason=RefusalReason.RATE_LIMITED,
                headers={"Retry-After": str(max(1, math.ceil(wait_s)))},
            )

    def _deadline_s(self, request: Request) -> float:
        deadline_s = self.config.background.deadline_s
        asked = request.headers.get(DEADLINE_HEADER)
        if asked is None:
            return deadline_s
        try:
            value = float(asked) / 1000
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0:
            raise GatewayError(
                400,
                ErrorType.INVALID_REQUEST,
                f"{DEADLINE_HEADER} must be milliseconds >= 0, not {asked!r}",
                reason=RefusalReason.BAD_REQUEST,
            )
        return min(deadline_s, value)

    async def _forward_interactive(
        self, request: Request, endpoint: Endpoint, caller: Caller, payload: bytes, stream: bool, started: float
    ) -> Response:
        class_name = caller.class_name
        handle = self.controller.interactive_started(started)
        self._preempt()  # the caps may have shrunk from the idle ceiling to the learned limit just now
        self.metrics.in_flight.labels(class_name).inc()
        self.metrics.queue_wait.labels(class_name).observe(0.0)

        def first_token() -> None:
            self.controller.interactive_first_token(handle)
            self.scheduler.dispatch()  # background held back for this chat's prefill may start now

        def done(outcome: Outcome) -> None:
            self.controller.interactive_finished(self.clock(), handle)
            self.scheduler.dispatch()  # with idle_after_s = 0 the caps may grow at once

        return await self._proxy(
            request, endpoint, class_name, payload, stream, started, done, measure=True, first_token=first_token
        )

    async def _forward_background(
        self,
        request: Request,
        endpoint: Endpoint,
        caller: Caller,
        body: dict[str, Any],
        stream: bool,
        started: float,
        camera: str,
        image_tokens: int,
        deadline_s: float,
    ) -> Response:
        class_name = caller.class_name
        preempted: Grant | None = None
        while True:
            remaining_s = deadline_s - (self.clock() - started)
            try:
                grant = await _unless_disconnected(
                    request, self.scheduler.acquire(camera, image_tokens, remaining_s, requeue_of=preempted)
                )
            except QueueFullError as exc:
                raise GatewayError(
                    429,
                    ErrorType.QUEUE_FULL,
                    str(exc),
                    reason=RefusalReason.QUEUE_FULL,
                    headers={"Retry-After": str(exc.retry_after_s)},
                ) from exc
            except DeadlineExceededError as exc:
                self.metrics.queue_wait.labels(class_name).observe(exc.waited_s)
                raise GatewayError(408, ErrorType.DEADLINE_EXCEEDED, str(exc), reason=RefusalReason.DEADLINE) from exc
            if grant is None:  # the caller left while waiting; nobody reads an answer
                self.metrics.rejections.labels(class_name, RefusalReason.CLIENT_GONE).inc()
                return Response(status_code=499)
            self.metrics.queue_wait.labels(class_name).observe(grant.waited_s)
            self.metrics.in_flight.labels(class_name).inc()
            self.metrics.image_tokens.labels(class_name).inc(grant.tokens)
            if grant.max_tokens_per_image is not None and grant.tokens < image_tokens and endpoint == "chat":
                sent = await self._downscaled(body, grant.max_tokens_per_image, class_name)
            else:  # off the event loop: a body of megabytes takes milliseconds to encode
                sent = await asyncio.to_thread(_encode, body)

            def done(outcome: Outcome, grant: Grant = grant) -> None:
                grant.release()

            if stream or not self.config.background.preempt:  # a stream's head arrives at once: nothing to redo
                return await self._proxy(request, endpoint, class_name, sent, stream, started, done, measure=False)
            response = await self._proxy(
                request, endpoint, class_name, sent, stream, started, done, measure=False, grant=grant
            )
            if response is not None:
                return response
            preempted = grant  # cancelled at vLLM to make way for interactive work: queue again, at the head

    async def _downscaled(self, body: dict[str, Any], max_tokens: int, class_name: str) -> bytes:
        """The body with its images shrunk to `max_tokens` each (off the event loop: JPEG work takes ms)."""

        def shrink() -> tuple[bytes, int]:
            copy = deepcopy(body)
            count = downscale_messages(copy.get("messages"), max_tokens, self.config.images)
            return json.dumps(copy, separators=(",", ":"), ensure_ascii=False).encode("utf-8"), count

        sent, count = await asyncio.to_thread(shrink)
        if count:
            self.metrics.downscaled.labels(class_name).inc(count)
        return sent

    async def _proxy(
        self,
        request: Request,
        endpoint: Endpoint,
        class_name: str,
        payload: bytes,
        stream: bool,
        started: float,
        done: Callable[[Outcome], None],
        measure: bool,
        grant: Grant | None = None,
        first_token: Callable[[], None] | None = None,
    ) -> Response | None:
        """Open the upstream request; `done` runs exactly once when the exchange is over, however it ends.

        With a `grant`, the request may be preempted until vLLM's answer head arrives (for a non-streaming
        request: until it is complete): then vLLM's request is cancelled, `done` runs, and None is returned.
        """
        finish = self._finisher(endpoint, class_name, started, done)
        try:
            upstream = await self._open_upstream(request, endpoint, payload, stream, grant)
        except GatewayError as exc:
            finish(Outcome(exc.status, completed=False, error=exc.message), answered=False)
            raise
        except BaseException as exc:  # cancelled: the caller or the server went away
            finish(Outcome(499, completed=False, error=type(exc).__name__))
            raise
        if upstream == "caller_gone":
            finish(Outcome(499, completed=False, disconnected=True))
            return Response(status_code=499)
        if upstream == "preempted":
            finish(Outcome(499, completed=False), answered=False)
            return None
        observer = None
        if stream and upstream.status_code == 200:
            observer = self._stream_observer(class_name, started, measure, first_token)
        return ProxyResponse(upstream, finish, observer)

    def _finisher(
        self, endpoint: Endpoint, class_name: str, started: float, done: Callable[[Outcome], None]
    ) -> Callable[[Outcome, bool], None]:
        """The end of one exchange: its metrics and log line, then `done`."""

        def finish(outcome: Outcome, answered: bool = True) -> None:
            now = self.clock()
            self.metrics.in_flight.labels(class_name).dec()
            if answered:  # refusals raised from here are counted where they become responses
                self.metrics.requests.labels(class_name, endpoint, str(outcome.status)).inc()
                self.metrics.duration.labels(class_name).observe(now - started)
                self.metrics.ends.labels(class_name, outcome.how).inc()
            if outcome.error:
                if outcome.how != "gateway_error":  # the gateway's own faults are logged with their traceback
                    self.metrics.upstream_errors.labels(class_name).inc()
                log.warning("%s request (%s) ended with an error: %s", class_name, endpoint, outcome.error)
            done(outcome)

        return finish

    async def _open_upstream(
        self, request: Request, endpoint: Endpoint, payload: bytes, stream: bool, grant: Grant | None
    ) -> UpstreamResponse | Literal["caller_gone", "preempted"]:
        """vLLM's answer head, unless the caller left first or the `grant` was preempted meanwhile."""
        assert self.upstream is not None
        opening = asyncio.ensure_future(
            self.upstream.open("POST", UPSTREAM_PATHS[endpoint], payload, incoming=dict(request.headers))
        )
        if grant is not None:
            grant.preempt = opening.cancel  # closing the connection makes vLLM abort the request
        # A non-streaming answer's head comes only when vLLM has finished: watch the caller meanwhile, so a
        # caller that leaves frees vLLM (and a background slot) at once instead of after the whole answer.
        watcher = asyncio.ensure_future(_disconnected(request)) if not stream else None
        try:
            await asyncio.wait({opening} if watcher is None else {opening, watcher}, return_when="FIRST_COMPLETED")
        except asyncio.CancelledError:
            opening.cancel()
            raise
        finally:
            if grant is not None:
                grant.preempt = None
            if watcher is not None:
                watcher.cancel()
        if not opening.done():  # the caller disconnected
            opening.cancel()
            with contextlib.suppress(BaseException):
                await opening
            return "caller_gone"
        if opening.cancelled() and grant is not None and grant.preempted:
            return "preempted"
        return opening.result()

    def _stream_observer(
        self, class_name: str, started: float, measure: bool, first_token: Callable[[], None] | None
    ) -> StreamObserver:
        """Times a stream's first token and the gaps between tokens, for the metrics and (`measure`) the
        controller."""
        ttft = self.metrics.ttft.labels(class_name)
        itl = self.metrics.itl.labels(class_name)

        def on_first(now: float, seconds: float) -> None:
            ttft.observe(seconds)
            if measure:
                self.controller.observe_ttft(now, seconds)
            if first_token is not None:
                first_token()

        def on_gap(now: float, seconds: float) -> None:  # one per token: see visioncap.gateway.sse
            itl.observe(seconds)
            if measure:
                self.controller.observe_itl(now, seconds)

        # No `reads`: each piece aiohttp hands over is what the network delivered since the previous one.
        return StreamObserver(started, self.clock, on_first, on_gap)

    def _refuse(
        self,
        exc: GatewayError,
        caller: Caller | None,
        endpoint: str,
        body: RequestBody | None = None,
        body_limit: int | None = None,
    ) -> Response:
        """The refusal's answer; one to a caller still sending its `body` reads the rest of it, up to `body_limit`
        (the route's limit for the caller: by default the generation routes')."""
        class_name = caller.class_name if caller is not None else "unknown"
        self.metrics.rejections.labels(class_name, exc.reason).inc()
        self.metrics.requests.labels(class_name, endpoint, str(exc.status)).inc()
        if body is None:
            return exc.response()
        limits = self.config.limits
        if body_limit is None:
            if caller is None:  # not known yet: the largest body a generation route takes from anyone
                body_limit = max(limits.max_body_bytes, limits.max_background_body_bytes)
            else:
                body_limit = limits.max_body_bytes if caller.interactive else limits.max_background_body_bytes
        return body.answer(exc.response(), body_limit, limits.refused_body_drain_s)


def _refuse_multiple_choices(body: dict[str, Any]) -> None:
    """Background requests ask for one answer: `n` or `best_of` above 1 would be that many requests in one slot."""
    for name in ("n", "best_of"):
        value = body.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 1:
            raise GatewayError(
                400,
                ErrorType.INVALID_REQUEST,
                f"{name} above 1 is not allowed for background keys (send separate requests)",
                reason=RefusalReason.BAD_REQUEST,
                param=name,
            )


def _encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


async def _disconnected(request: Request) -> None:
    """Returns once the caller has disconnected (the request body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(request: Request, waiting: Any) -> Grant | None:
    """Await admission, or give up the place in the queue (None) when the caller disconnects meanwhile."""
    admission = asyncio.ensure_future(waiting)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({admission, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not admission.done():
            admission.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await admission
    if admission.cancelled():
        return None
    return admission.result()


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"
