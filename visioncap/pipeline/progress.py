"""Live status of a run: a rich table on a terminal, a periodic log line per camera for services."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import TracebackType

from rich.console import Console
from rich.live import Live
from rich.table import Table

from visioncap.pipeline.runner import RunSummary

log = logging.getLogger("visioncap.progress")


def status_table(summary: RunSummary, depth: int) -> Table:
    table = Table(title=f"{summary.pipeline}: outbox {depth} waiting", title_justify="left")
    for column in ("camera", "state", "fps", "people", "events", "selected"):
        table.add_column(column, justify="left" if column in ("camera", "state") else "right")
    for stats in summary.cameras.values():
        state = stats.state if not stats.error else f"[red]{stats.state}[/red]"
        table.add_row(
            stats.camera,
            state,
            f"{stats.fps:.1f}",
            str(stats.people_in_view),
            str(stats.events),
            str(stats.selected),
        )
    return table


class Progress:
    """Shows the run's status until the `with` block ends; mode `rich`, `log` or `none`."""

    def __init__(self, mode: str, summary: RunSummary, depth: Callable[[], int], every_s: float = 10.0) -> None:
        self._mode = mode
        self._summary = summary
        self._depth = depth
        self._every_s = every_s
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._live: Live | None = None

    def __enter__(self) -> Progress:
        if self._mode == "rich":
            self._live = Live(
                status_table(self._summary, 0), console=Console(stderr=True), refresh_per_second=2, transient=False
            )
            self._live.start()
            self._thread = threading.Thread(target=self._refresh_rich, name="progress", daemon=True)
            self._thread.start()
        elif self._mode == "log":
            self._thread = threading.Thread(target=self._refresh_log, name="progress", daemon=True)
            self._thread.start()
        return self

    def _refresh_rich(self) -> None:
        assert self._live is not None
        while not self._done.wait(0.5):
            self._live.update(status_table(self._summary, self._depth()))

    def _refresh_log(self) -> None:
        while not self._done.wait(self._every_s):
            for s in self._summary.cameras.values():
                log.info(
                    "camera %s: %s, %.1f fps analysed, %d people in view, %d events, %d selected; outbox %d",
                    s.camera,
                    s.state,
                    s.fps,
                    s.people_in_view,
                    s.events,
                    s.selected,
                    self._depth(),
                )

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._live is not None:
            self._live.update(status_table(self._summary, self._depth()))
            self._live.stop()
