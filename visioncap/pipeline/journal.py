"""The outbox's journal: frames and outcomes the database has not taken yet, on local disk until it does.

While the database is away (restarting, unreachable, out of space) the pipeline keeps reading, detecting,
selecting and captioning. What it would have written goes here instead, one small JSON file per frame, written
and flushed to disk before the outbox goes on, so a process that dies meanwhile loses nothing: the next one
loads the journal and writes it when the database answers again. One entry per frame holds everything still
owed for it (the row to insert, the latest outcome to record), so replaying it is one insert and one update,
in order, however many times the frame changed state during the outage.

The disk the journal writes to may be the one that is full (the database's too, a SQLite file beside the frames):
then the records of the frames a full disk cost have nowhere to go but the journal, and the journal nowhere to
write them. So each journal keeps a reserve: a file of `reserve_bytes` allocated when it starts (`reserve.bin`),
into which an entry the disk refuses is written instead, over space the file already holds. The reserve is an
append-only log of entries and removals, read back by `load` before the entry files (an entry written to the
reserve removes its file, so a file found is newer than the reserve's record of it); once every entry it holds is
settled, it is zeroed and used from its start again. Only when the reserve is used up too is an entry kept in
memory alone (`JournalEntry.durable` False), and the outbox names every such entry at exit.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
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


# Space allocated for entries the disk refuses: about a thousand entries of a frame or an outcome; on a small
# file system no more than this share of its free space at start, so the reserve never starts a shortage itself.
RESERVE_BYTES = 1024 * 1024
RESERVE_SHARE_OF_FREE = 1 / 16
RESERVE_NAME = "reserve.bin"
_ZEROS = bytes(64 * 1024)

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

    def __init__(
        self, data_dir: Path, pipeline: str | None, *, shared: bool = False, reserve_bytes: int = RESERVE_BYTES
    ) -> None:
        self.root = data_dir / "journal" / _safe(pipeline or "default")
        self._lock_fd: int | None = None
        if shared:
            self.root, self._lock_fd = _take_slot(self.root)
        # A file object, not a bare descriptor: a journal dropped without close() (a test's outbox) lets go of it.
        self._reserve: io.FileIO | None = None
        self.reserve_size = 0  # bytes the reserve holds on disk
        self._reserve_used = 0  # where its next record goes
        self._in_reserve: set[str] = set()  # keys with a record in the reserve, not removed since
        self._open_reserve(reserve_bytes)

    def close(self) -> None:
        """Let go of the slot (a worker stopping); its entries stay for whoever takes it next."""
        self.close_reserve()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    # -- the reserve: space held for the entries the disk refuses ---------------------------------------------

    def close_reserve(self) -> None:
        if self._reserve is not None:
            self._reserve.close()
            self._reserve = None

    def _open_reserve(self, size: int) -> None:
        """Open the reserve (what an earlier run left in it stays, for `load`) and allocate it up to `size` bytes
        (or its share of the free space) with written zeros, so that writing into it later takes no new space. A
        disk full already at start makes a smaller reserve, logged: the run goes on."""
        if size <= 0:
            return
        path = self.root / RESERVE_NAME
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            stats = os.statvfs(self.root)
            size = min(size, int(stats.f_bavail * stats.f_frsize * RESERVE_SHARE_OF_FREE))
            self._reserve = io.FileIO(os.open(path, os.O_RDWR | os.O_CREAT, 0o644), "r+")
            fd = self._reserve.fileno()
            have = os.fstat(fd).st_size
            self._reserve_used = self._scan_reserve(have)
        except OSError as exc:
            log.warning("journal: no reserve at %s (%s): an entry the disk refuses is kept in memory only", path, exc)
            self.close_reserve()
            return
        self.reserve_size = have
        try:
            while self.reserve_size < size:
                chunk = _ZEROS[: size - self.reserve_size]
                self.reserve_size += os.pwrite(fd, chunk, self.reserve_size)
            os.fsync(fd)
        except OSError as exc:
            with contextlib.suppress(OSError):  # what a failed write may have taken beyond what it reports
                os.ftruncate(fd, self.reserve_size)
            log.warning("journal: reserve %s has %d of %d bytes (%s)", path, self.reserve_size, size, exc)

    def _scan_reserve(self, size: int) -> int:
        """The end of the last whole record; a record cut short by a crash after it is zeroed, so that a shorter
        record written over it later cannot leave a tail of it behind."""
        assert self._reserve is not None
        data = os.pread(self._reserve.fileno(), size, 0)
        end = data.find(b"\0")
        end = size if end < 0 else end
        used = 0
        for line in data[:end].split(b"\n")[:-1]:
            try:
                json.loads(line)
            except ValueError:
                break
            used += len(line) + 1
        if used < end:
            os.pwrite(self._reserve.fileno(), bytes(end - used), used)
        return used

    def _append(self, record: dict[str, Any]) -> bool:
        """One record into the reserve's allocated space, flushed to disk; False when it does not fit (or the
        write fails)."""
        if self._reserve is None:
            return False
        line = json.dumps(record, separators=(",", ":")).encode() + b"\n"  # ASCII: never a zero byte
        if self._reserve_used + len(line) > self.reserve_size:
            return False
        try:
            os.pwrite(self._reserve.fileno(), line, self._reserve_used)
            os.fdatasync(self._reserve.fileno())
        except OSError as exc:
            log.error("journal: cannot write to the reserve (%s)", exc)
            return False
        self._reserve_used += len(line)
        return True

    def _reset_reserve(self) -> None:
        """Every entry of the reserve is settled: zero what was used, and use it from its start again."""
        assert self._reserve is not None
        try:
            for start in range(0, self._reserve_used, len(_ZEROS)):
                os.pwrite(self._reserve.fileno(), _ZEROS[: self._reserve_used - start], start)
            os.fdatasync(self._reserve.fileno())
        except OSError as exc:  # its records are all settled: replaying them finds the rows stored already
            log.warning("journal: cannot clear the reserve (%s)", exc)
            return
        self._reserve_used = 0

    @property
    def reserve_free(self) -> int:
        return self.reserve_size - self._reserve_used if self._reserve is not None else 0

    # -- entries ---------------------------------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        return self.root / f"{hashlib.sha1(key.encode()).hexdigest()[:24]}.json"

    def save(self, entry: JournalEntry) -> bool:
        """Write the entry and flush it to disk: in its file, or in the reserve when the disk refuses the file;
        False (and the entry stays in memory only) when neither takes it."""
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
            if self._append({"save": entry.to_json()}):
                # The reserve's record is the newest now: an older file of the entry must not win at `load`.
                self._unlink(target)
                self._in_reserve.add(entry.key)
                log.debug("journal: %s written to the reserve (%s)", entry.key, exc)
                entry.durable = True
                return True
            log.error("journal: cannot write %s (%s) and the reserve is used up; the entry is kept in memory only",
                      target, exc)  # fmt: skip
            entry.durable = False
            return False
        entry.durable = True
        return True

    def _unlink(self, path: Path) -> bool:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:  # a stale entry is replayed harmlessly (the row is found by its instant)
            log.warning("journal: cannot remove %s (%s)", path, exc)
            return False
        return True

    def remove(self, key: str) -> None:
        self._unlink(self._path(key))
        if key not in self._in_reserve:
            return
        self._in_reserve.discard(key)
        if not self._in_reserve:
            self._reset_reserve()
        elif not self._append({"remove": key}):
            # Replayed again at the next start, harmlessly: the row is found by its instant, the outcome rewritten.
            log.warning("journal: no room in the reserve to record that %s is settled", key)

    def load(self) -> list[JournalEntry]:
        """The entries a previous process left, oldest first; unreadable files are reported and kept aside."""
        if not self.root.is_dir():
            return []
        by_key = self._load_reserve()
        for path in sorted(self.root.glob("*.json")):
            try:
                entry = JournalEntry.from_json(json.loads(path.read_text(encoding="utf-8")))
                by_key[entry.key] = entry
            except (OSError, ValueError, KeyError, TypeError) as exc:
                # A file cut short by a crash mid-write never replaced its target (write, fsync, rename), so this
                # is damage from elsewhere: keep it for a person to look at, never replay half an entry.
                log.error("journal: %s is unreadable (%s); renamed to .bad", path, exc)
                path.replace(path.with_suffix(".bad"))
        entries = sorted(by_key.values(), key=lambda entry: entry.seq)
        return entries

    def _load_reserve(self) -> dict[str, JournalEntry]:
        """The entries the reserve holds, by key (its records in order: the last of a key wins, a removal drops
        it)."""
        if self._reserve is None or not self._reserve_used:
            return {}
        entries: dict[str, JournalEntry] = {}
        data = os.pread(self._reserve.fileno(), self._reserve_used, 0)
        for line in data.split(b"\n")[:-1]:
            record = json.loads(line)  # whole records only: `_scan_reserve` stopped before any other
            try:
                if "remove" in record:
                    entries.pop(str(record["remove"]), None)
                else:
                    entry = JournalEntry.from_json(record["save"])
                    entries[entry.key] = entry
            except (ValueError, KeyError, TypeError) as exc:
                log.error("journal: a record of the reserve is unreadable (%s); skipped", exc)
        self._in_reserve = set(entries)
        if not entries:
            self._reset_reserve()
        return entries
