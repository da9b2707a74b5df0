"""The start rate that the inter-token objective allows, learnt from measured gaps and the frames that caused them.

Pure logic, no clock of its own (the controller feeds it time-stamped measurements, so recorded sequences replay
exactly). An engine step that runs a frame's vision encoder and a prefill chunk is longer than a decode step, and
every chat stream waits for the whole step: the gap it measures there may exceed the objective. Chat alone also
has gaps above the objective now and then (the host stalls whatever the load). So the share of gaps above the
objective is

    share = base + excess,   excess proportional to the frame start rate (frames per chat-streaming second),

and the p99 objective holds while `share <= 1 %`. The model measures both terms over the last `window_s`:

- a gap is *near a frame* when a background request started within `spike_window_s` before the gap ended (the
  frame's encoder and prefill run within a few engine steps of its start; this many seconds covers vLLM's input
  processing and queue in front of them);
- `base` is the share above the objective among the gaps near no frame: the host's own (taken as 0 while fewer
  than a quarter of `min_gaps` are near no frame, which charges every miss to the frames: a lower rate);
- `excess` is what the gaps near frames add beyond `base`, over all gaps: the frames' share at the start rate of
  the window.

The rate that meets `target_share` is then the window's start rate scaled by `(target_share - base) / excess`:
the excess is linear in the rate (each start brings its encoder step, the same steps at any rate while the pacer
keeps starts apart). When the host's own share already reaches the target (a gateway hop on a CPU the engine
shares, a noisy neighbour), no start rate meets the objective, and the model does not cap: holding frames back
lost half the captions without helping chat in the run that showed it (`benchmarks/mixed/README.md`, 2026-12-03
10:50). Nor does it cap when the frames add nothing measurable. The target sits below 1 % so that the
p99 measured over a few thousand gaps stays within the objective at the upper end of its noise, not only on
average.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class MissEstimate:
    """What the model measured over its window, and the rate it allows (None: it does not limit the rate)."""

    gaps: int
    gaps_near_frames: int
    frames: int
    base_share: float  # share above the objective among gaps near no frame
    excess_share: float  # share over all gaps that frames add beyond the base
    frames_per_s: float  # background starts per second of interactive activity in the window
    rate_per_s: float | None


class MissModel:
    """Learns the start rate at which the share of inter-token gaps above the objective stays at `target_share`.

    Bounded: at most `max_gaps` gaps and `max_starts` starts are held (older ones leave first), whatever the load.
    """

    def __init__(
        self,
        objective_s: float,
        target_share: float,
        window_s: float,
        spike_window_s: float,
        min_frames: int,
        min_gaps: int,
        max_gaps: int = 50_000,
        max_starts: int = 10_000,
    ) -> None:
        self.objective_s = objective_s
        self.target_share = target_share
        self.window_s = window_s
        self.spike_window_s = spike_window_s
        self.min_frames = min_frames
        self.min_gaps = min_gaps
        # Gaps as (end time, above the objective, near a frame), classified once when they arrive.
        self._gaps: deque[tuple[float, bool, bool]] = deque(maxlen=max_gaps)
        self._starts: deque[float] = deque(maxlen=max_starts)  # background starts during interactive activity
        self._active: deque[tuple[float, float]] = deque(maxlen=max_gaps)  # (tick time, seconds active since last)
        self._counts = [0, 0, 0, 0]  # gaps near no frame, of them above; gaps near a frame, of them above

    def observe_start(self, now: float) -> None:
        """A background request started while interactive traffic was active."""
        self._starts.append(now)

    def observe_gap(self, now: float, seconds: float) -> None:
        """An interactive inter-token gap that ended at `now`."""
        first = bisect.bisect_left(self._starts, now - seconds - self.spike_window_s)
        near = first < len(self._starts) and self._starts[first] <= now
        above = seconds > self.objective_s
        if len(self._gaps) == self._gaps.maxlen:
            self._forget(self._gaps[0])
        self._gaps.append((now, above, near))
        self._counts[2 * near] += 1
        self._counts[2 * near + 1] += above

    def observe_active(self, now: float, seconds: float) -> None:
        """`seconds` of interactive activity ended at `now` (the controller's tick while chat is active)."""
        self._active.append((now, seconds))

    def estimate(self, now: float) -> MissEstimate | None:
        """The window's measurements and the rate they allow; None while the window holds too little evidence."""
        self._prune(now)
        far, far_above, near, near_above = self._counts
        gaps = far + near
        frames = len(self._starts)
        active_s = sum(seconds for _, seconds in self._active)
        if frames < self.min_frames or gaps < self.min_gaps or active_s <= 0:
            return None
        # Too few gaps near no frame to tell the host's share: count every miss as the frames' (a lower rate).
        base = far_above / far if far >= self.min_gaps // 4 else 0.0
        excess = max(0.0, (near_above - base * near) / gaps)
        frames_per_s = frames / active_s
        room = self.target_share - base
        # No cap when the host alone uses the target up (no start rate meets the objective then: the rate is AIMD's)
        # or when frames add too little to measure.
        rate: float | None = None
        if room > 0 and excess > 0.1 * room:
            rate = frames_per_s * room / excess
        return MissEstimate(gaps, near, frames, base, excess, frames_per_s, rate)

    def _prune(self, now: float) -> None:
        horizon = now - self.window_s
        while self._gaps and self._gaps[0][0] < horizon:
            self._forget(self._gaps.popleft())
        while self._starts and self._starts[0] < horizon:
            self._starts.popleft()
        while self._active and self._active[0][0] < horizon:
            self._active.popleft()

    def _forget(self, gap: tuple[float, bool, bool]) -> None:
        _, above, near = gap
        self._counts[2 * near] -= 1
        self._counts[2 * near + 1] -= above
