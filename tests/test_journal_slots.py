"""Workers sharing one data folder (one volume on every GPU node) keep their journals apart: each holds a slot of
its own by a real `flock`, never reads or deletes another's entries, and a worker that died, however it died, leaves
its slot and entries to the next one to start.

Real parts: the filesystem, and a second process killed with SIGKILL (the kernel lets go of its lock).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from visioncap.pipeline.journal import Journal, JournalEntry, Outcome
from visioncap.store import CaptionStatus

WAIT_S = 60.0  # a bound on a broken test, never a measurement


def entry(key: str) -> JournalEntry:
    return JournalEntry(key=key, seq=1, row_id=7, outcome=Outcome(CaptionStatus.FAILED, attempts=3, error="x"))


def test_two_workers_on_one_data_folder_hold_slots_of_their_own(tmp_path: Path) -> None:
    first, second = Journal(tmp_path, "p", shared=True), Journal(tmp_path, "p", shared=True)
    try:
        assert first.root != second.root
        assert first.save(entry("frames/a/1.jpg")) and second.save(entry("frames/b/2.jpg"))
        assert [e.key for e in first.load()] == ["frames/a/1.jpg"]
        assert [e.key for e in second.load()] == ["frames/b/2.jpg"]
    finally:
        first.close()
        second.close()


def test_a_slot_let_go_is_taken_by_the_next_worker_with_its_entries(tmp_path: Path) -> None:
    leaving = Journal(tmp_path, "p", shared=True)
    leaving.save(entry("frames/a/1.jpg"))
    leaving.close()
    successor = Journal(tmp_path, "p", shared=True)
    try:
        assert successor.root == leaving.root
        assert [e.key for e in successor.load()] == ["frames/a/1.jpg"]
    finally:
        successor.close()


def test_a_killed_workers_slot_and_entries_go_to_the_next_worker_to_start(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from pathlib import Path
            from visioncap.pipeline.journal import Journal, JournalEntry, Outcome
            from visioncap.store import CaptionStatus
            journal = Journal(Path({str(tmp_path)!r}), "p", shared=True)
            journal.save(JournalEntry(key="frames/dead/1.jpg", seq=1, row_id=7,
                                      outcome=Outcome(CaptionStatus.FAILED, attempts=1, error="x")))
            print(journal.root, flush=True)
            time.sleep(3600)
        """)],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        held = Path(holder.stdout.readline().strip())  # its slot, its entry on disk
        live = Journal(tmp_path, "p", shared=True)
        assert live.root != held and live.load() == [], "a live worker's slot is never shared"
        holder.send_signal(signal.SIGKILL)
        holder.wait(WAIT_S)
        restarted = Journal(tmp_path, "p", shared=True)
        assert restarted.root == held
        assert [e.key for e in restarted.load()] == ["frames/dead/1.jpg"]
        live.close()
        restarted.close()
    finally:
        holder.kill()
        holder.wait(WAIT_S)


def test_a_single_box_run_keeps_the_pipelines_folder(tmp_path: Path) -> None:
    assert Journal(tmp_path, "p").root == tmp_path / "journal" / "p"
