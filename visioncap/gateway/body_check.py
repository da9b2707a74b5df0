"""Request bodies checked where they cannot stop the event loop: `check_body` parses, walks and validates a body,
inspects its media, applies the background rules and encodes it again (with the key's priority); `BodyChecker` runs
it in the caller for small bodies and in worker processes for large ones.

Why processes and not threads: nearly all the work is json's C and pydantic's Rust, which hold the GIL for a whole
call, so in a thread it stops the event loop just the same (measured on the 2-core machine, an 8 MiB body: 0.1-0.2 s
to parse, 1.2 s to validate 280,000 messages, 0.2 s to encode again, and the walk in Python seconds). A worker
process costs the body's bytes copied there and back. Bodies up to `INLINE_BYTES` stay on the loop: at most a few
milliseconds even for the densest JSON (two bytes a value), less than the trip to a worker, and most chats are
that small.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pickle
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from visioncap.config.gateway import ImagesConfig
from visioncap.gateway.errors import ErrorType, GatewayError, RefusalReason, invalid_request
from visioncap.gateway.images import (
    MEDIA_FIELDS,
    ImageTooLargeError,
    MediaRefusedError,
    downscale_messages,
    inspect_media,
)
from visioncap.gateway.protocol import _View, parse_body

log = logging.getLogger(__name__)

# Bodies up to this size are checked on the event loop; larger ones in a worker process.
INLINE_BYTES = 16 * 1024
# Worker processes, and so bodies checked at once (the others wait their turn). One: a camera frame's check takes a
# few milliseconds, and a flood of large bodies then takes at most one core from vLLM.
WORKERS = 1
# The workers' nice value: a flood of large bodies takes CPU from vLLM and the loop only at a tenth of their weight,
# while a camera frame's check (a few ms) still finds a core at once.
WORKER_NICE = 10


@dataclass(frozen=True)
class Rules:
    """How one route and key check a body."""

    view: type[_View]  # the part of the body the gateway reads
    priority: int | None  # written into the body (the key's class decides, never the body); None: left as sent
    one_answer: bool  # a background key: one answer a request (n, best_of, prompt lists)
    # Where a list is that many prompts, each a request of vLLM's own (completions' `prompt`, embeddings' `input`).
    prompt_field: str | None
    images: ImagesConfig


@dataclass(frozen=True)
class Checked:
    """A body that passed: what is sent to vLLM, and what the gateway reads of it."""

    payload: bytes
    stream: bool
    user: str | None
    image_tokens: int
    images: int = 0  # image parts: each a vision encoder pass, what background pacing counts


def check_body(raw: bytes, rules: Rules) -> Checked:
    """The checked body, or a GatewayError (400/422) naming what is wrong; a pure function (it runs in workers)."""
    body, view = parse_body(raw, rules.view)
    if rules.one_answer:
        _refuse_several_answers(body, rules.prompt_field)
    try:
        media = inspect_media(body, rules.images)
    except ImageTooLargeError as exc:
        raise GatewayError(
            400, ErrorType.IMAGE_TOO_LARGE, str(exc), reason=RefusalReason.IMAGE_TOO_LARGE, param=_media_field(body)
        ) from exc
    except MediaRefusedError as exc:
        raise GatewayError(
            400,
            ErrorType.MEDIA_URL_NOT_ALLOWED,
            str(exc),
            reason=RefusalReason.MEDIA_URL_REFUSED,
            param=_media_field(body),
        ) from exc
    if rules.priority is not None:
        body["priority"] = rules.priority
    stream = getattr(view, "stream", False)
    user = getattr(view, "user", None)  # an extra field of a view without one may hold anything
    user = user if isinstance(user, str) else None
    return Checked(encode(body), stream is True, user, media.tokens, media.images)


def encode(body: dict[str, Any]) -> bytes:
    """The body as vLLM receives it; 400 for text UTF-8 cannot hold (a lone surrogate, sent as the JSON escape
    \\ud800 or as its three bytes, which Python's json decoder lets through)."""
    try:
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise invalid_request(
            f"request body holds text that cannot be encoded as UTF-8 ({exc.reason}: a lone surrogate such as \\ud800)"
        ) from exc


def downscale_body(payload: bytes, max_tokens: int, images: ImagesConfig) -> tuple[bytes, int]:
    """`payload` with each inline image of its messages shrunk to `max_tokens` tokens, and how many were shrunk."""
    body = json.loads(payload)
    count = downscale_messages(body.get("messages"), max_tokens, images)
    return (encode(body) if count else payload), count


def prompt_count(value: Any) -> int:
    """Requests a completions `prompt` (or embeddings `input`) makes at vLLM: a list of token ids is one prompt, any
    other list one per item."""
    if isinstance(value, list) and not all(isinstance(item, int) for item in value):
        return len(value)
    return 1


def _refuse_several_answers(body: dict[str, Any], prompt_field: str | None) -> None:
    """Background requests ask for one answer: `n` or `best_of` above 1, or several prompts, would be that many
    requests in one admission slot. Types as strict as the views: vLLM reads "5" and 5.0 as 5."""
    for name in ("n", "best_of"):
        value = body.get(name)
        if value is None:
            continue
        if type(value) is not int:
            raise invalid_request(f"{name} must be an integer, not {type(value).__name__}", param=name)
        if value > 1:
            raise invalid_request(
                f"{name} above 1 is not allowed for background keys (send separate requests)", param=name
            )
    if prompt_field is not None:
        count = prompt_count(body.get(prompt_field))
        if count > 1:
            raise invalid_request(
                f"{prompt_field} holds {count} prompts: a background key sends one prompt a request (send separate "
                "requests)",
                param=prompt_field,
            )


def _media_field(body: dict[str, Any]) -> str:
    return next((name for name in MEDIA_FIELDS if isinstance(body.get(name), list)), MEDIA_FIELDS[0])


class _Worker:
    """One worker process (`serve()` below), fed one call at a time over its stdin and answering on its stdout:
    frames of an 8-byte length and a pickle. Its own process, started with `python -c`, not multiprocessing's:
    spawn imports the embedding program's main module again in the child (a script without a main guard would run
    twice), and the imports run before any code of ours could leave a SCHED_FIFO inherited from the loop."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, nice: int) -> _Worker:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _LAUNCH.format(nice=nice),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=FRAME_READ_BYTES,
        )
        return cls(process)

    async def call(self, name: str, args: tuple[Any, ...]) -> Any:
        assert self.process.stdin is not None and self.process.stdout is not None
        request = pickle.dumps((name, args), protocol=pickle.HIGHEST_PROTOCOL)
        self.process.stdin.write(len(request).to_bytes(8, "big"))
        self.process.stdin.write(request)
        del request
        await self.process.stdin.drain()
        size = int.from_bytes(await self.process.stdout.readexactly(8), "big")
        ok, value = pickle.loads(await self.process.stdout.readexactly(size))
        if not ok:
            raise value
        return value

    def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()


# The worker's start: ordinary scheduling (the gateway's loop may run SCHED_FIFO, which the child inherits) at a
# lower priority, before the imports (half a second of CPU).
_LAUNCH = """import os
if os.sched_getscheduler(0) != os.SCHED_OTHER:
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
os.nice(max(0, {nice} - os.nice(0)))
from visioncap.gateway.body_check import serve
serve()
"""
# The pieces the gateway reads a worker's answer in (an answer is as large as the body).
FRAME_READ_BYTES = 1024 * 1024
_CALLS: dict[str, Callable[..., Any]] = {"check": check_body, "downscale": downscale_body}


def serve() -> None:
    """A worker's loop: one call at a time from stdin, its answer (or the GatewayError it raised) to stdout, until
    stdin ends (the gateway stopped or died)."""
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a stray print goes to the log, never into the frames
    requests = sys.stdin.buffer
    while len(header := requests.read(8)) == 8:
        name, args = pickle.loads(requests.read(int.from_bytes(header, "big")))
        try:
            answer: tuple[bool, Any] = (True, _CALLS[name](*args))
        except GatewayError as exc:
            answer = (False, exc)
        except Exception as exc:  # a fault of the gateway's own: the caller logs it as such
            answer = (False, RuntimeError(f"body check failed: {exc!r}"))
        frame = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        answers.write(len(frame).to_bytes(8, "big"))
        answers.write(frame)
        answers.flush()


class BodyChecker:
    """Checks bodies for one gateway: small ones at once, large ones in up to WORKERS processes, one body each at
    a time.

    The workers start with the gateway (`start()`, before it serves): starting a process holds the calling thread
    until the child has exec'd, and under load that was seen to hold the loop for a quarter of a second. One that
    dies is replaced when the next large body comes. A body waiting for a worker holds only its bytes, which the
    route's body limit bounds (and the body budget, for background keys)."""

    def __init__(self, workers: int = WORKERS, inline_bytes: int = INLINE_BYTES, nice: int = WORKER_NICE) -> None:
        self.workers = workers
        self.inline_bytes = inline_bytes
        self.nice = nice
        self._idle: list[_Worker] = []
        self._started: set[_Worker] = set()
        self._turns: asyncio.Semaphore | None = None

    async def start(self) -> None:
        while len(self._started) < self.workers:
            worker = await _Worker.start(self.nice)
            self._started.add(worker)
            self._idle.append(worker)

    async def check(self, raw: bytes, rules: Rules) -> Checked:
        if len(raw) <= self.inline_bytes:
            return check_body(raw, rules)
        checked: Checked = await self._in_worker("check", raw, rules)
        return checked

    async def downscale(self, payload: bytes, max_tokens: int, images: ImagesConfig) -> tuple[bytes, int]:
        """`downscale_body` in a worker: JPEG work takes milliseconds, the body's parsing more."""
        shrunk: tuple[bytes, int] = await self._in_worker("downscale", payload, max_tokens, images)
        return shrunk

    async def _in_worker(self, name: str, *args: Any) -> Any:
        if self._turns is None:
            self._turns = asyncio.Semaphore(self.workers)
        async with self._turns:  # so at most `workers` exist, idle or busy
            if self._idle:
                worker = self._idle.pop()
            else:
                worker = await _Worker.start(self.nice)
                self._started.add(worker)
            try:
                result = await worker.call(name, args)
            except GatewayError:
                self._idle.append(worker)
                raise
            except (OSError, EOFError, asyncio.IncompleteReadError) as exc:  # it died (killed for memory?)
                self._drop(worker)
                log.error("a body-check worker failed: %r", exc)
                raise GatewayError(
                    503,
                    ErrorType.INTERNAL,
                    "the gateway could not check this body (a worker failed); retry",
                    reason=RefusalReason.INTERNAL,
                    headers={"Retry-After": "1"},
                ) from exc
            except BaseException:  # cancelled halfway through a frame, or a fault: its state is unknown
                self._drop(worker)
                raise
            self._idle.append(worker)
            return result

    def _drop(self, worker: _Worker) -> None:
        worker.kill()
        self._started.discard(worker)

    @property
    def started(self) -> int:
        """Worker processes running now."""
        return len(self._started)

    def close(self) -> None:
        """Stop the workers."""
        for worker in self._started:
            worker.kill()
        self._started.clear()
        self._idle.clear()
