"""Background requests wait here, not inside vLLM: per-camera round robin, a deadline, a bounded queue.

Runs on the gateway's event loop (no locks: every method is called from that loop). A request is admitted
when the controller's caps allow one more in flight: concurrency below the cap, and its estimated image
tokens fit under the image-token cap (a request always fits when nothing is in flight, so an image larger
than the cap still runs, alone). Waiting requests are served one camera at a time in turn, oldest first
within a camera; a camera whose turn comes waits for room rather than being overtaken (no starvation of
large images).

Pacing: while the caps carry a start rate, a request may start only when the pacer has a whole start of
credit (credit grows at the rate and holds at most one start, so starts after a quiet spell are spread, not
bunched into one engine step), and not before the caps' `hold_until`, unless the start is due under the rate's
floor (`min_starts_per_s`: one interval after the last start, or after the request arrived if later; a start
the floor let through counts from when it was due, so the floor's rate is kept however late timers fire): a hold
renewed by every new chat would otherwise stop background for as long as chat keeps coming. A request held back
only by the pacer is woken by a timer at the moment it may start; one held back by room waits for a release or a
caps change.

Alerts: requests of an alert class (`urgent`) wait in a line of their own, served before background's (cameras in
turn within it too) under the same caps, hold and pacer, with a larger share of the pacer: an alert may start on
credit the pacer has not yet given, up to ALERT_BORROW_STARTS starts ahead, and the background starts after it
wait until that debt is paid. So an alert does not wait for the next paced start (the bench measured that wait as
most of what the third class lost beside chat), while starts over any stretch of time stay at the pacer's rate:
alerts take them from background, never from chat's objectives, and cannot run ahead of the rate themselves (the
next alert waits once the debt is ALERT_BORROW_STARTS). Each line holds `queue_size` at most, so a background
backlog never refuses an alert. Alerts are not preempted: the request is on a deadline and little.

Preemption: when the caps shrink below what is in flight (interactive traffic arrived, or the controller cut
the limit), or, under pacing (which keeps the cap), when a chat arrives to find grants admitted unpaced moments
before, the newest preemptible grants beyond the cap (or of that burst) are asked to give their place back; the gateway
cancels their vLLM request and queues them again at the head of their camera's line, with their first
enqueue time, so the deadline still counts from the original arrival.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from visioncap.gateway.admission import Caps

# Starts of pacer credit an alert may borrow (see the module's docstring).
ALERT_BORROW_STARTS = 2.0


class QueueFullError(Exception):
    """The line holds `queue_size` requests already."""

    def __init__(self, retry_after_s: int, line: str = "background") -> None:
        super().__init__(f"the {line} queue is full; retry in {retry_after_s} s")
        self.retry_after_s = retry_after_s


class DeadlineExceededError(Exception):
    """The request waited its whole deadline without being admitted."""

    def __init__(self, waited_s: float) -> None:
        super().__init__(f"waited {waited_s:.1f} s in the gateway's background queue without being admitted")
        self.waited_s = waited_s


@dataclass(frozen=True)
class SchedulerState:
    waiting: int  # both lines
    in_flight: int
    image_tokens_in_flight: int
    waiting_by_camera: dict[str, int]
    waiting_urgent: int = 0  # of `waiting`, in the alert line
    in_flight_urgent: int = 0


@dataclass(eq=False)
class Grant:
    """An admitted request; `release()` it exactly once (later calls do nothing)."""

    scheduler: BackgroundScheduler
    camera: str
    tokens: int
    enqueued_at: float
    admitted_at: float = 0.0
    images: int = 1  # image parts: a paced start of k images spends k starts' credit (k encoder passes)
    urgent: bool = False  # an alert class's: waits in the line served first, never preempted
    # Images larger than this many tokens must be downscaled before sending (the caps at admission); None: as sent.
    max_tokens_per_image: int | None = None
    # Set by the holder while its request may still be cancelled and redone; called at most once.
    preempt: Callable[[], object] | None = field(default=None, repr=False)
    preempted: bool = False
    paced: bool = False  # admitted at the pacer's rate beside chat (not in an unpaced burst while chat was idle)
    # Pacer credit not yet given that this start took (a multi-frame request's frames beyond its first, an alert
    # ahead of its turn); the starts after it pay it back.
    borrowed: float = 0.0
    _released: bool = False

    @property
    def waited_s(self) -> float:
        return self.admitted_at - self.enqueued_at

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.scheduler._release(self)


@dataclass(eq=False)
class _Waiter:
    grant: Grant
    future: asyncio.Future[None] = field(repr=False)


class BackgroundScheduler:
    """Admission of background requests under caps that the controller may change at any moment."""

    def __init__(
        self,
        caps: Callable[[], Caps],
        queue_size: int,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[SchedulerState], None] | None = None,
    ) -> None:
        self._caps = caps
        self.queue_size = queue_size
        self._clock = clock
        self._on_change = on_change
        # The alert line, then background's: each camera -> its waiters, oldest first, cameras in turn.
        self._lines: tuple[OrderedDict[str, deque[_Waiter]], OrderedDict[str, deque[_Waiter]]] = (
            OrderedDict(),
            OrderedDict(),
        )
        self._waiting = 0
        self._waiting_urgent = 0
        self._in_flight_urgent = 0
        self._in_flight = 0
        self._tokens = 0
        self._service_s = 1.0  # moving average of admitted requests' time in flight, for Retry-After
        self._granted: list[Grant] = []  # in flight, oldest admission first
        self._watchers: list[tuple[Callable[[SchedulerState], bool], asyncio.Future[None]]] = []
        # Admission times of the newest grants, for checks of the pacing (tests, tools); bounded.
        self.recent_starts: deque[float] = deque(maxlen=256)
        self._recent_urgent: deque[float] = deque(maxlen=256)  # the same, of the alert line
        self._credit = 1.0  # paced starts allowed now (at most one)
        self._last_start = -math.inf  # admission time of the newest grant: the rate's floor counts from it
        # When the floor would let the head of the line through a hold: the time its start was due (see _admit).
        self._floor_due: float | None = None
        self._credit_at = clock()
        self._wake: asyncio.TimerHandle | None = None
        self._wake_at = math.inf

    # -- public ---------------------------------------------------------------------------------------

    def state(self) -> SchedulerState:
        by_camera: dict[str, int] = {}
        for line in self._lines:
            for camera, queue in line.items():
                by_camera[camera] = by_camera.get(camera, 0) + len(queue)
        return SchedulerState(
            waiting=self._waiting,
            in_flight=self._in_flight,
            image_tokens_in_flight=self._tokens,
            waiting_by_camera=by_camera,
            waiting_urgent=self._waiting_urgent,
            in_flight_urgent=self._in_flight_urgent,
        )

    async def acquire(
        self,
        camera: str,
        tokens: int,
        deadline_s: float,
        requeue_of: Grant | None = None,
        images: int = 1,
        urgent: bool = False,
    ) -> Grant:
        """Wait for admission; raises QueueFullError at once or DeadlineExceededError after `deadline_s`.

        `urgent`: an alert class's request, in the line served first. `images`: the request's image parts. The
        pacer's rate is a rate of frames (what the cost model's ceiling counts: one vision encoder pass and its
        prefill each), so a request of several spends as many starts' credit, and the starts after it wait for
        them.

        `requeue_of`: a preempted grant whose request comes back; it goes to the head of its camera's line
        (ahead of the queue limit: it held a place already) and keeps its first enqueue time.
        """
        now = self._clock()
        grant = Grant(self, camera, tokens, enqueued_at=now if requeue_of is None else requeue_of.enqueued_at)
        grant.images, grant.urgent = images, urgent
        caps = self._caps()
        # Nothing waits ahead of it: nothing at all, or (an alert) no other alert.
        ahead = self._waiting_urgent if urgent else self._waiting
        if ahead == 0 and self._fits(grant, caps) and self._pace_wait(caps, now, now, urgent) <= 0:
            self._admit(grant, caps)
            self._changed()
            return grant
        in_line = self._waiting_urgent if urgent else self._waiting - self._waiting_urgent
        if requeue_of is None and in_line >= self.queue_size:
            raise QueueFullError(self._retry_after_s(), "alert" if urgent else "background")
        waiter = _Waiter(grant, asyncio.get_running_loop().create_future())
        line = self._line(grant)
        if requeue_of is None:
            line.setdefault(camera, deque()).append(waiter)
        else:
            line.setdefault(camera, deque()).appendleft(waiter)
            line.move_to_end(camera, last=False)
        self._waiting += 1
        self._waiting_urgent += urgent
        self._changed()
        self.dispatch()  # arms the pacer's timer when only the pacer holds it back
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), timeout=max(0.0, deadline_s))
        except TimeoutError:
            if waiter.future.done():  # admitted in the same loop turn as the timeout fired
                return grant
            self._remove(waiter)
            raise DeadlineExceededError(self._clock() - grant.enqueued_at) from None
        except asyncio.CancelledError:
            if waiter.future.done():
                grant.release()  # admitted, but the caller went away before using it
            else:
                self._remove(waiter)
            raise
        return grant

    def started_within(self, seconds: float, urgent: bool = False) -> int:
        """Requests admitted in the last `seconds` (of the alert line only with `urgent`; at most 256 counted)."""
        since = self._clock() - seconds
        return sum(1 for at in (self._recent_urgent if urgent else self.recent_starts) if at >= since)

    def check_room(self, urgent: bool = False) -> None:
        """Raise QueueFullError when a new request could not wait (checked before its body is read, too)."""
        in_line = self._waiting_urgent if urgent else self._waiting - self._waiting_urgent
        if in_line >= self.queue_size:
            raise QueueFullError(self._retry_after_s(), "alert" if urgent else "background")

    def retry_after_s(self) -> int:
        """Seconds after which a refused request may find room, from recent service times."""
        return self._retry_after_s()

    def dispatch(self) -> None:
        """Admit waiting requests while the caps allow: the alert line first, then background's, camera by camera
        in turn within each. Background never overtakes an alert that waits for room or for the pacer."""
        admitted = False
        caps = self._caps()
        now = self._clock()
        for line in self._lines:
            while line:
                camera, queue = next(iter(line.items()))
                waiter = queue[0]
                if not self._fits(waiter.grant, caps):
                    break  # a release or a change of the caps dispatches again
                wait_s = self._pace_wait(caps, now, waiter.grant.enqueued_at, waiter.grant.urgent)
                if wait_s > 0:
                    self._wake_in(wait_s, now)
                    break
                queue.popleft()
                self._waiting -= 1
                self._waiting_urgent -= waiter.grant.urgent
                if queue:
                    line.move_to_end(camera)
                else:
                    del line[camera]
                self._admit(waiter.grant, caps)
                waiter.future.set_result(None)
                admitted = True
            if line:
                break  # its head waits: the line after it waits behind
        if admitted:
            self._changed()

    def preempt_excess(self, max_age_s: float) -> int:
        """Ask the newest preemptible grants beyond the concurrency cap to give way; returns how many were asked.

        Only grants admitted within `max_age_s` qualify: older requests are probably decoding already, and
        finishing them costs interactive traffic less than redoing their prefill. Under pacing the concurrency
        cap stays where it was while chat was idle, so what a chat arriving after idle meets is the unpaced
        burst admitted just before it: those grants are the excess (they go back to the head of their line and
        start again at the pacer's rate); grants the pacer started beside chat stay.
        """
        caps = self._caps()
        now = self._clock()
        paced = caps.starts_per_s is not None
        excess = self._in_flight - caps.concurrency
        if paced:
            burst = sum(1 for grant in self._granted if not grant.paced and now - grant.admitted_at <= max_age_s)
            excess = max(excess, burst)
        if excess <= 0:
            return 0
        asked = 0
        for grant in reversed(self._granted):
            if asked >= excess or now - grant.admitted_at > max_age_s:
                break
            if grant.preempt is None or grant.preempted or grant.urgent or (paced and grant.paced):
                continue
            grant.preempted = True
            preempt, grant.preempt = grant.preempt, None
            preempt()
            asked += 1
        return asked

    async def wait_until(self, predicate: Callable[[SchedulerState], bool], timeout: float) -> SchedulerState:
        """Wait until the state satisfies `predicate` (checked now and after every change); for tests, tools."""
        state = self.state()
        if predicate(state):
            return state
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (predicate, future)
        self._watchers.append(entry)
        try:
            await asyncio.wait_for(future, timeout)
        finally:
            if entry in self._watchers:
                self._watchers.remove(entry)
        return self.state()

    # -- internals ------------------------------------------------------------------------------------

    @staticmethod
    def _sent_tokens(grant: Grant, caps: Caps) -> int:
        """Image tokens as they will be sent: each image downscaled to the per-image cap when there is one (at
        most the cap times the images; the request's total when that is less)."""
        if caps.max_tokens_per_image is None:
            return grant.tokens
        return min(grant.tokens, max(1, grant.images) * caps.max_tokens_per_image)

    def _fits(self, grant: Grant, caps: Caps) -> bool:
        if self._in_flight >= caps.concurrency:
            return False
        return self._in_flight == 0 or self._tokens + self._sent_tokens(grant, caps) <= caps.image_tokens

    def _pace_wait(self, caps: Caps, now: float, enqueued_at: float, urgent: bool = False) -> float:
        """Seconds until the pacer and the hold let one more request start (the head of the line, waiting since
        `enqueued_at`; an alert's with `urgent`, which may borrow credit); 0: now."""
        if caps.starts_per_s is None:
            self._credit, wait_s = 1.0, 0.0
        else:
            self._credit = min(1.0, self._credit + max(0.0, now - self._credit_at) * caps.starts_per_s)
            needed = 1.0 - ALERT_BORROW_STARTS if urgent else 1.0
            # A hair of slack: a timer that fires a few microseconds early must not be re-armed for nothing.
            wait_s = 0.0 if self._credit >= needed - 1e-6 else (needed - self._credit) / caps.starts_per_s
        self._credit_at = now
        self._floor_due = None
        if caps.hold_until is not None:
            hold_until = caps.hold_until
            if caps.min_starts_per_s is not None:
                floor_due = max(self._last_start, enqueued_at) + 1.0 / caps.min_starts_per_s
                if floor_due < hold_until:
                    hold_until, self._floor_due = floor_due, floor_due
            wait_s = max(wait_s, hold_until - now)
        return max(0.0, wait_s)

    def _wake_in(self, wait_s: float, now: float) -> None:
        """Dispatch again in `wait_s` (one timer; an earlier wake-up replaces a later one)."""
        at = now + wait_s
        if self._wake is not None and self._wake_at <= at + 1e-4:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous caller, tests): the next dispatch re-checks
            return
        if self._wake is not None:
            self._wake.cancel()
        self._wake_at = at
        self._wake = loop.call_later(wait_s, self._woken)

    def _woken(self) -> None:
        self._wake, self._wake_at = None, math.inf
        self.dispatch()

    def _admit(self, grant: Grant, caps: Caps) -> None:
        if caps.starts_per_s is not None:
            # Into debt for a request of several frames: the starts after it wait until the pacer's rate of frames
            # has paid for each.
            spent = max(1, grant.images)
            grant.borrowed = spent - min(float(spent), max(0.0, self._credit))
            self._credit -= spent
        grant.admitted_at = self._clock()
        grant.paced = caps.starts_per_s is not None
        self._last_start = grant.admitted_at
        due, self._floor_due = self._floor_due, None
        # A start the floor let through a hold counts from when it was due, so that the lateness of each timer does
        # not add up and the floor's rate is kept; one far behind (it waited for room) counts from itself.
        floor = caps.min_starts_per_s
        if due is not None and floor is not None and 0 <= grant.admitted_at - due <= 0.5 / floor:
            self._last_start = due
        self.recent_starts.append(grant.admitted_at)
        if grant.urgent:
            self._recent_urgent.append(grant.admitted_at)
        grant.max_tokens_per_image = caps.max_tokens_per_image
        grant.tokens = self._sent_tokens(grant, caps)
        self._in_flight += 1
        self._in_flight_urgent += grant.urgent
        self._tokens += grant.tokens
        self._granted.append(grant)

    def _release(self, grant: Grant) -> None:
        grant.preempt = None
        if grant in self._granted:
            self._granted.remove(grant)
        self._in_flight -= 1
        self._in_flight_urgent -= grant.urgent
        self._tokens -= grant.tokens
        took = max(0.0, self._clock() - grant.admitted_at)
        self._service_s = 0.8 * self._service_s + 0.2 * took
        self._changed()
        self.dispatch()

    def _line(self, grant: Grant) -> OrderedDict[str, deque[_Waiter]]:
        return self._lines[0] if grant.urgent else self._lines[1]

    def _remove(self, waiter: _Waiter) -> None:
        line = self._line(waiter.grant)
        queue = line.get(waiter.grant.camera)
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            self._waiting -= 1
            self._waiting_urgent -= waiter.grant.urgent
            if not queue:
                del line[waiter.grant.camera]
            self._changed()
            # The head of the line may have changed to a request that fits.
            self.dispatch()

    def _retry_after_s(self) -> int:
        per_slot = max(1, self._caps().concurrency)
        return max(1, min(3600, math.ceil(self._service_s * (self._waiting + 1) / per_slot)))

    def _changed(self) -> None:
        state = self.state()
        if self._on_change is not None:
            self._on_change(state)
        for predicate, future in list(self._watchers):
            if not future.done() and predicate(state):
                future.set_result(None)
