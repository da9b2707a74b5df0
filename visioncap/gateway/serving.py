"""The gateway's request handling: caller -> limits -> body -> media -> priority -> replica -> admission -> proxy.

One `Gateway` per app owns the keys, the metrics and its replicas (`visioncap.gateway.replicas`: per upstream a
pool, a controller, a background scheduler, health checks and a poll of vLLM's /metrics), and runs the
controllers' ticks beside the requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from enum import Enum
from typing import Any, Literal, Protocol, cast

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from visioncap import __version__
from visioncap.config.gateway import GatewayConfig
from visioncap.gateway.admission import Decision
from visioncap.gateway.auth import Caller, KeyRing
from visioncap.gateway.bodies import BodyBudget, RequestBody
from visioncap.gateway.body_check import BodyChecker, Rules
from visioncap.gateway.errors import ErrorType, GatewayError, RefusalReason, unauthorized
from visioncap.gateway.metrics import GatewayMetrics
from visioncap.gateway.protocol import (
    AnyObjectView,
    ChatCompletionView,
    CompletionView,
    EmbeddingsView,
    ResponsesView,
    _View,
)
from visioncap.gateway.proxy import Outcome, ProxyResponse, Upstream, UpstreamRefusedError, UpstreamResponse
from visioncap.gateway.replicas import Replica, rank_for_chat
from visioncap.gateway.scheduler import DeadlineExceededError, Grant, QueueFullError
from visioncap.gateway.sse import StreamObserver

log = logging.getLogger(__name__)

Endpoint = Literal["chat", "completions", "responses", "embeddings"]


class Abandoned(Enum):
    """Why a request to vLLM ended before its answer head was read (no status code says it)."""

    CALLER_GONE = "caller_gone"  # the caller disconnected while vLLM worked on a non-streaming answer
    PREEMPTED = "preempted"  # a background request's grant was taken back for chat


CAMERA_HEADER = "x-visioncap-camera"
DEADLINE_HEADER = "x-visioncap-deadline-ms"
UPSTREAM_PATHS: dict[Endpoint, str] = {
    "chat": "/chat/completions",
    "completions": "/completions",
    "responses": "/responses",
    "embeddings": "/embeddings",
}


class Finish(Protocol):
    """The end of one exchange (`_finisher`): `answered` False for a refusal counted where it becomes a response."""

    def __call__(self, outcome: Outcome, answered: bool = True) -> None: ...


VIEWS: dict[str, type[_View]] = {
    "chat": ChatCompletionView,
    "completions": CompletionView,
    "responses": ResponsesView,
    "embeddings": EmbeddingsView,
}
# Where a list is that many prompts, each a request of vLLM's own (a background key sends one).
PROMPT_FIELD: dict[Endpoint, str] = {"completions": "prompt", "embeddings": "input"}


class RetryElsewhereError(Exception):
    """A chat's replica failed before the first byte of its answer: send it to the next one."""


class Gateway:
    """State and behaviour of one gateway; `start()`/`stop()` on the serving event loop."""

    def __init__(self, config: GatewayConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.metrics = GatewayMetrics([upstream.name for upstream in config.upstreams])
        self.keys = KeyRing(config)
        self.replicas = [Replica(upstream, config, self.metrics, clock) for upstream in config.upstreams]
        self._by_name = {replica.name: replica for replica in self.replicas}
        # One budget for all replicas: it bounds the gateway's memory, which they share.
        self.bodies = BodyBudget(
            config.limits.max_waiting_body_bytes,
            lambda: max(replica.scheduler.retry_after_s() for replica in self.replicas),
            self.metrics.waiting_body_bytes.set,
        )
        # Parsing and checking bodies: large ones in worker processes, off the event loop that streams every answer.
        self.checker = BodyChecker()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.ready = threading.Event()  # set once serving: lets a thread that started the server wait for it
        self._tasks: list[asyncio.Task[None]] = []

    def replica(self, name: str) -> Replica:
        return self._by_name[name]

    # -- lifecycle ------------------------------------------------------------------------------------

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        await self.checker.start()
        for replica in self.replicas:
            self._tasks.extend(replica.start())
        self._tasks.append(asyncio.create_task(self._control_loop(), name="gateway-controller"))
        self.ready.set()

    async def stop(self) -> None:
        self.ready.clear()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        for replica in self.replicas:
            await replica.aclose()
        self.checker.close()

    async def _control_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.controller.interval_s)
            self.control_step()

    def control_step(self) -> list[Decision]:
        """One decision of each replica's controller, in the configured order."""
        return [replica.control_step() for replica in self.replicas]

    @property
    def is_ready(self) -> bool:
        """At least one replica is in."""
        return any(replica.up for replica in self.replicas)

    def chat_order(self) -> list[Replica]:
        """The replicas a chat may go to, best predicted time to first token first (`rank_for_chat`): those in,
        or all while none is (the health checks may lag a replica that came back)."""
        now = self.clock()
        candidates = [replica for replica in self.replicas if replica.up] or self.replicas
        return [candidates[index] for index in rank_for_chat([replica.load(now) for replica in candidates])]

    def background_replica(self, caller: Caller) -> Replica:
        """The key's own replica (frames stay on their box), or while it is out the least occupied one in; its
        own when none is in (the pipeline's outbox retries what fails there)."""
        own = self._by_name[caller.upstream] if caller.upstream is not None else self.replicas[0]
        if own.up:
            return own
        spill = [replica for replica in self.replicas if replica.up]
        if not spill:
            return own

        def occupied(replica: Replica) -> int:
            state = replica.scheduler.state()
            return state.waiting + state.in_flight

        return min(spill, key=occupied)

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
                checked = await self.checker.check(raw, self._rules(endpoint, caller))
                del raw
                return await self._forward_interactive(
                    request, endpoint, caller, checked.payload, checked.stream, started
                )
            # Background bodies wait in memory: room in the queue and in the body budget is checked before a byte
            # is read, and only the checked body, encoded as it is sent, is kept while it waits.
            replica = self.background_replica(caller)
            replica.scheduler.check_room(caller.urgent)
            with self.bodies.hold(request.headers.get("content-length")) as held:
                raw = await body_in.read(self.config.limits.max_background_body_bytes, held.grow)
                checked = await self.checker.check(raw, self._rules(endpoint, caller))
                del raw
                named = request.headers.get(CAMERA_HEADER) or checked.user
                if named is not None and caller.cameras is not None and named not in caller.cameras:
                    raise GatewayError(
                        403,
                        ErrorType.CAMERA_NOT_ALLOWED,
                        f"this key may not name camera {named[:64]!r}",
                        reason=RefusalReason.CAMERA_NOT_ALLOWED,
                        param=CAMERA_HEADER,
                    )
                camera = named or caller.camera or caller.name
                deadline_s = self._deadline_s(request, caller)
                return await self._forward_background(
                    request,
                    replica,
                    endpoint,
                    caller,
                    checked.payload,
                    checked.stream,
                    started,
                    camera,
                    checked.image_tokens,
                    deadline_s,
                    checked.images,
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

    def _rules(self, endpoint: Endpoint | None, caller: Caller) -> Rules:
        """How a body of `endpoint` (None: /tokenize and /detokenize) is checked for the key; the key's class sets
        the priority of what generates, never the caller's body."""
        if endpoint is None:
            return Rules(AnyObjectView, None, one_answer=False, prompt_field=None, images=self.config.images)
        return Rules(
            VIEWS[endpoint],
            caller.traffic_class.priority,
            one_answer=not caller.interactive,
            prompt_field=PROMPT_FIELD.get(endpoint),
            images=self.config.images,
        )

    async def models(self, request: Request) -> Response:
        """GET /v1/models, passed through for any valid key."""
        caller: Caller | None = None
        try:
            caller = self._authenticate(request)
            upstream = await self._utility_upstream().open("GET", "/models", incoming=request.headers)
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
            # The same checks as every route: hostile input, and media (vLLM's /tokenize renders a conversation's
            # images, fetching their URLs).
            checked = await self.checker.check(raw, self._rules(None, caller))
            del raw
            upstream = await self._utility_upstream().open(
                "POST", path, checked.payload, incoming=request.headers, root=True
            )
        except GatewayError as exc:
            return self._refuse(exc, caller, name, body_in, self.config.limits.max_body_bytes)

        def finish(outcome: Outcome) -> None:
            self.metrics.requests.labels(caller.class_name, name, str(outcome.status)).inc()

        return ProxyResponse(upstream, finish)

    def _utility_upstream(self) -> Upstream:
        """Where a request that takes no engine step goes: the best replica for a chat."""
        upstream = self.chat_order()[0].upstream
        assert upstream is not None  # started
        return upstream

    def health(self, request: Request) -> Response:
        """Liveness and each replica's state; where vLLM is and what went wrong there only for a valid key (an
        internal address and an error text tell an outsider more than whether the gateway is up)."""
        trusted = self.keys.identify(request.headers) is not None
        return JSONResponse(
            {
                "status": "ok",
                "version": __version__,
                "ready": self.is_ready,
                "upstreams": {replica.name: self._replica_state(replica, trusted) for replica in self.replicas},
            }
        )

    def readiness(self, request: Request) -> Response:
        """200 while at least one replica is in, else 503; which are in for anyone (names only)."""
        ready = self.is_ready
        return JSONResponse(
            {
                "status": "ready" if ready else "unavailable",
                "version": __version__,
                "upstreams": {replica.name: "in" if replica.up else "out" for replica in self.replicas},
            },
            status_code=200 if ready else 503,
        )

    def _replica_state(self, replica: Replica, trusted: bool) -> dict[str, Any]:
        state = replica.scheduler.state()
        now = self.clock()
        controller = replica.controller
        caps = controller.caps(now)
        poller = replica.poller
        return {
            "up": replica.up,
            "base_url": replica.config.base_url if trusted else None,
            "health_error": replica.health_error if trusted else None,
            "ttft_estimate_s": None if replica.ttft_s is None else round(replica.ttft_s, 4),
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
            "background": {
                "waiting": state.waiting,
                "in_flight": state.in_flight,
                "image_tokens_in_flight": state.image_tokens_in_flight,
                "concurrency_cap": caps.concurrency,
                "image_tokens_cap": caps.image_tokens,
                "limit": round(controller.limit, 3),
                "starts_per_s": None if controller.starts_per_s is None else round(controller.starts_per_s, 3),
                "learnt": _learnt(controller.last_decision),
            },
            # The alert classes' line (served before background's, within the same caps and pacing; its figures
            # are part of background's above too).
            "alert": {
                "waiting": state.waiting_urgent,
                "in_flight": state.in_flight_urgent,
                "started_last_60_s": replica.scheduler.started_within(60.0, urgent=True),
            },
            "interactive": {"in_flight": controller.interactive_in_flight, "active": caps.interactive_active},
        }

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

    def _deadline_s(self, request: Request, caller: Caller) -> float:
        deadline_s = caller.traffic_class.deadline_s or self.config.background.deadline_s
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
        """To the best replica; once more to the next best when that one fails before the first byte of its
        answer (refused, reset, or a 5xx head), never after: then the caller has part of an answer already."""
        self.metrics.queue_wait.labels(caller.class_name).observe(0.0)
        best, *others = self.chat_order()
        if others:
            try:
                return await self._chat_on(best, request, endpoint, caller, payload, stream, started, retryable=True)
            except RetryElsewhereError as exc:
                self.metrics.retries.labels(best.name).inc()
                log.warning("chat sent again, to upstream %s: %s failed (%s)", others[0].name, best.name, exc)
                best = others[0]
        return await self._chat_on(best, request, endpoint, caller, payload, stream, started, retryable=False)

    async def _chat_on(
        self,
        replica: Replica,
        request: Request,
        endpoint: Endpoint,
        caller: Caller,
        payload: bytes,
        stream: bool,
        started: float,
        retryable: bool,
    ) -> Response:
        class_name = caller.class_name
        controller = replica.controller
        handle = controller.interactive_started(self.clock(), streams=stream)
        replica.preempt()  # the caps may have shrunk from the idle ceiling to the learned limit just now
        self.metrics.in_flight.labels(class_name).inc()

        def first_token() -> None:
            controller.interactive_first_token(handle)
            replica.scheduler.dispatch()  # background held back for this chat's prefill may start now

        def done(outcome: Outcome) -> None:
            controller.interactive_finished(self.clock(), handle)
            replica.scheduler.dispatch()  # with idle_after_s = 0 the caps may grow at once

        response = await self._proxy(
            request,
            replica,
            endpoint,
            class_name,
            payload,
            stream,
            started,
            done,
            measure=True,
            first_token=first_token,
            retryable=retryable,
        )
        assert response is not None  # only a preempted background request has none
        return response

    async def _forward_background(
        self,
        request: Request,
        replica: Replica,
        endpoint: Endpoint,
        caller: Caller,
        payload: bytes,
        stream: bool,
        started: float,
        camera: str,
        image_tokens: int,
        deadline_s: float,
        images: int = 1,
    ) -> Response:
        class_name = caller.class_name
        preempted: Grant | None = None
        while True:
            remaining_s = deadline_s - (self.clock() - started)
            try:
                grant = await _unless_disconnected(
                    request,
                    replica.scheduler.acquire(
                        camera, image_tokens, remaining_s, requeue_of=preempted, images=images, urgent=caller.urgent
                    ),
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
            if grant.borrowed:
                self.metrics.borrowed_starts.labels(replica.name, class_name).inc(grant.borrowed)
            replica.controller.background_started(self.clock())
            self.metrics.in_flight.labels(class_name).inc()
            self.metrics.image_tokens.labels(class_name).inc(grant.tokens)
            try:
                sent = payload
                if grant.max_tokens_per_image is not None and grant.tokens < image_tokens and endpoint == "chat":
                    sent = await self._downscaled(payload, grant.max_tokens_per_image, class_name)
            except BaseException:  # the grant is the proxy's to release from here on; until then it is this one's
                self.metrics.in_flight.labels(class_name).dec()
                grant.release()
                raise

            def done(outcome: Outcome, grant: Grant = grant) -> None:
                grant.release()

            # Not retried elsewhere when the replica fails: the pipeline's outbox sends it again.
            if stream or not self.config.background.preempt:  # a stream's head arrives at once: nothing to redo
                unpreempted = await self._proxy(
                    request, replica, endpoint, class_name, sent, stream, started, done, measure=False
                )
                assert unpreempted is not None  # None only for a preempted grant, and none was given
                return unpreempted
            response = await self._proxy(
                request, replica, endpoint, class_name, sent, stream, started, done, measure=False, grant=grant
            )
            if response is not None:
                return response
            preempted = grant  # cancelled at vLLM to make way for interactive work: queue again, at the head

    async def _downscaled(self, payload: bytes, max_tokens: int, class_name: str) -> bytes:
        """The body with its images shrunk to `max_tokens` each (in a worker: JPEG work takes ms)."""
        sent, count = await self.checker.downscale(payload, max_tokens, self.config.images)
        if count:
            self.metrics.downscaled.labels(class_name).inc(count)
        return sent

    async def _proxy(
        self,
        request: Request,
        replica: Replica,
        endpoint: Endpoint,
        class_name: str,
        payload: bytes,
        stream: bool,
        started: float,
        done: Callable[[Outcome], None],
        measure: bool,
        grant: Grant | None = None,
        first_token: Callable[[], None] | None = None,
        retryable: bool = False,
    ) -> Response | None:
        """Open the upstream request on `replica`; `done` runs exactly once when the exchange is over, however
        it ends.

        With a `grant`, the request may be preempted until vLLM's answer head arrives (for a non-streaming
        request: until it is complete): then vLLM's request is cancelled, `done` runs, and None is returned.
        When `retryable`, a failure before the answer's head (refused, reset, a 5xx status) raises
        RetryElsewhereError instead of answering: nothing has reached the caller yet.
        """
        finish = self._finisher(endpoint, class_name, started, done)
        self.metrics.upstream_requests.labels(replica.name, class_name).inc()
        try:
            upstream = await self._open_upstream(request, replica, endpoint, payload, stream, grant)
        except GatewayError as exc:
            if isinstance(exc, UpstreamRefusedError):
                replica.unreachable(exc.message)
            finish(Outcome(exc.status, completed=False, error=exc.message), answered=False)
            if retryable and exc.status == 502:
                raise RetryElsewhereError(exc.message) from exc
            raise
        except BaseException as exc:  # cancelled: the caller or the server went away
            finish(Outcome(499, completed=False, error=type(exc).__name__))
            raise
        if upstream is Abandoned.CALLER_GONE:
            finish(Outcome(499, completed=False, disconnected=True))
            return Response(status_code=499)
        if upstream is Abandoned.PREEMPTED:
            finish(Outcome(499, completed=False), answered=False)
            return None
        if retryable and upstream.status_code >= 500:
            upstream.release()
            error = f"upstream {replica.name} answered {upstream.status_code}"
            finish(Outcome(upstream.status_code, completed=False, error=error), answered=False)
            raise RetryElsewhereError(error)
        observer = None
        if stream and upstream.status_code == 200:
            observer = self._stream_observer(replica, class_name, started, measure, first_token)
        return ProxyResponse(upstream, finish, observer)

    def _finisher(self, endpoint: Endpoint, class_name: str, started: float, done: Callable[[Outcome], None]) -> Finish:
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
        self,
        request: Request,
        replica: Replica,
        endpoint: Endpoint,
        payload: bytes,
        stream: bool,
        grant: Grant | None,
    ) -> UpstreamResponse | Abandoned:
        """vLLM's answer head, unless the caller left first or the `grant` was preempted meanwhile."""
        assert replica.upstream is not None
        if stream and grant is None:
            # Nothing to watch meanwhile (a stream's head comes at once): no task and no wait on the first token's
            # path. A caller that leaves now is seen by the response's own disconnect watch.
            return await replica.upstream.open("POST", UPSTREAM_PATHS[endpoint], payload, incoming=request.headers)
        opening = asyncio.ensure_future(
            replica.upstream.open("POST", UPSTREAM_PATHS[endpoint], payload, incoming=request.headers)
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
            return Abandoned.CALLER_GONE
        if opening.cancelled() and grant is not None and grant.preempted:
            return Abandoned.PREEMPTED
        return opening.result()

    def _stream_observer(
        self,
        replica: Replica,
        class_name: str,
        started: float,
        measure: bool,
        first_token: Callable[[], None] | None,
    ) -> StreamObserver:
        """Times a stream's first token and the gaps between tokens, for the metrics and (`measure`) the
        controller."""
        ttft = self.metrics.ttft.labels(class_name)
        itl = self.metrics.itl.labels(class_name)

        def on_first(now: float, seconds: float) -> None:
            ttft.observe(seconds)
            if measure:
                replica.controller.observe_ttft(now, seconds)
                replica.observe_ttft(seconds)
            if first_token is not None:
                first_token()

        def on_gap(now: float, seconds: float) -> None:  # one per token: see visioncap.gateway.sse
            itl.observe(seconds)
            if measure:
                replica.controller.observe_itl(now, seconds)

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
    return cast(Grant | None, admission.result())


def _learnt(decision: Decision | None) -> dict[str, Any] | None:
    """The learnt model's last estimate for /healthz (None: off, or too little evidence yet)."""
    learnt = None if decision is None else decision.learnt
    if learnt is None:
        return None
    return {
        "gaps": learnt.gaps,
        "frames": learnt.frames,
        "base_share": round(learnt.base_share, 5),
        "excess_share": round(learnt.excess_share, 5),
        "frames_per_s": round(learnt.frames_per_s, 3),
        "rate_per_s": None if learnt.rate_per_s is None else round(learnt.rate_per_s, 3),
    }
