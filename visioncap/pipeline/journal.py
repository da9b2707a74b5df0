"""The outbox's journal: frames and outcomes the database has not taken yet, on local disk until it does.

While the database is away (restarting, unreachable, out of space) the pipeline keeps reading, detecting,
selecting and captioning. What it would have written goes here instead, one small JSON file per frame, written
and flushed to disk before the outbox goes on, so a process that dies meanwhile loses nothing: the next one
loads the journal and writes it when the database answers again. One entry per frame holds everything still
owed for it (the row to insert, the latest outcome to record), so replaying it is one insert and one update,
in order, however many times the frame changed state during the outage.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from visioncap.frames import Caption, SelectionReason
from visioncap.store import CaptionStatus, NewCaption

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of a frame (or of one attempt at it, `pending` with the error), as the row must record it."""

    status: CaptionStatus
    attempts: int = 0
    caption: Caption | None = None
    error: str | None = None
    image_removed: bool = False  # its image was deleted (coalesced away): the row must stop pointing at it

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        caption = data.get("caption")
        return cls(
            status=CaptionStatus(data["status"]),
            attempts=int(data.get("attempts", 0)),
            caption=Caption(**caption) if caption else None,
            error=data.get("error"),
            image_removed=bool(data.get("image_removed", False)),
        )


@dataclass(slots=True)
class JournalEntry:
    """Everything still owed to the database for one frame."""

    key: str  # the frame's image path (unique per selected frame) or `#<row id>`
    seq: int  # creation time in nanoseconds (comparable across processes): entries are replayed oldest first
    new: NewCaption | None = None  # the row to insert; None once the database has it
    row_id: int | None = None
    outcome: Outcome | None = None
    version: int = field(default=0, compare=False)  # bumped on each change, so a replay can tell it raced one
    durable: bool = field(default=False, compare=False)  # on disk (False: the disk refused; kept in memory)

    def to_json(self) -> dict[str, Any]:
        new = None
        if self.new is not None:
            new = asdict(self.new)
            new["captured_at"] = self.new.captured_at.isoformat()
        return {
            "key": self.key,
            "seq": self.seq,
            "row_id": self.row_id,
            "new": new,
            "outcome": None if self.outcome is None else self.outcome.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JournalEntry:
        new = data.get("new")
        if new is not None:
            captured_at = datetime.fromisoformat(new["captured_at"])
            new = NewCaption(**{**new, "captured_at": captured_at, "reason": SelectionReason(new["reason"])})
        outcome = data.get("outcome")
        return cls(
            key=str(data["key"]),
            seq=int(data["seq"]),
            new=new,
            row_id=data.get("row_id"),
            outcome=None if outcome is None else Outcome.from_json(outcome),
            durable=True,
        )


# Slots per pipeline for workers sharing one data folder: a bound on the folders a starting worker tries.
MAX_SLOTS = 256


class JournalSlotsFull(OSError):
    """Every slot of the pipeline's journal is held by a live process."""


def _take_slot(pipeline_dir: Path) -> tuple[Path, int]:
    """The first slot folder whose lock this process can take, and the lock's descriptor (held open)."""
    for index in range(MAX_SLOTS):
        slot = pipeline_dir / f"slot-{index}"
        slot.mkdir(parents=True, exist_ok=True)
        fd = os.open(slot / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        except OSError:
            os.close(fd)
            raise
        return slot, fd
    raise JournalSlotsFull(f"all {MAX_SLOTS} journal slots under {pipeline_dir} are held by live processes")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "_"


class Journal:
    """One folder per pipeline under `DATA_DIR/journal/`; not thread-safe (the outbox holds its lock).

    `shared` (a `visioncap worker`, whose data folder other workers may share: one volume mounted on every GPU
    node): the folder is `DATA_DIR/journal/PIPELINE/slot-N/`, the first slot no live process holds. A slot is
    held by an exclusive `flock` on its `lock` file for the life of the process; the kernel (or the NFS server,
    within its lease) lets go of it when the process dies, however it dies, so the next worker to start takes the
    dead one's slot and replays what it left. Workers never read or delete each other's entries.
    """

    def __init__(self, data_dir: Path, pipeline: str | None, *, shared: bool = False) -> None:
        self.root = data_dir / "journal" / _safe(pipeline or "default")
        self._lock_fd: int | None = None
        if shared:
            self.root, self._lock_fd = _take_slot(self.root)

    def close(self) -> None:
        """Let go of the slot (a worker stopping); its entries stay for whoever takes it next."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def _path(self, key: str) -> Path:
        return self.root / f"{hashlib.sha1(key.encode()).hexdigest()[:24]}.json"

    def save(self, entry: JournalEntry) -> bool:
        """Write the entry and flush it to disk; False (and the entry stays in memory only) when the disk refuses."""
        target = self._path(entry.key)
        partial = target.with_suffix(".part")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with partial.open("w", encoding="utf-8") as handle:
                json.dump(entry.to_json(), handle, separators=(",", ":"))
                handle.flush()
                os.fsync(handle.fileno())
            partial.replace(target)
        except OSError as exc:
            partial.unlink(missing_ok=True)
            log.warning("journal: cannot write %s (%s); the entry is kept in memory", target, exc)
            entry.durable = False
            return False
        entry.durable = True
        return True

    def remove(self, key: str) -> None:
        try:
            self._path(key).unlink(missing_ok=True)
        except OSError as exc:  # a stale entry is replayed harmlessly (the row is found by its instant)
            log.warning("journal: cannot remove the entry of %s (%s)", key, exc)

    def load(self) -> list[JournalEntry]:
        """The entries a previous process left, oldest first; unreadable files are reported and kept aside."""
        if not self.root.is_dir():
            return []
        entries = []
        for path in sorted(self.root.glob("*.json")):
            try:
                entries.append(JournalEntry.from_json(json.loads(path.read_text(encoding="utf-8"))))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                # A file cut short by a crash mid-write never replaced its target (write, fsync, rename), so this
                # is damage from elsewhere: keep it for a person to look at, never replay half an entry.
                log.error("journal: %s is unreadable (%s); renamed to .bad", path, exc)
                path.replace(path.with_suffix(".bad"))
        entries.sort(key=lambda entry: entry.seq)
        return entries
