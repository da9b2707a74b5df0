"""Camera leases (PostgreSQL): which worker runs which camera, and the fencing check on its caption writes.

A lease has an owner, an expiry in the database's clock and a fencing token raised on every new claim. Workers
heartbeat with their capacity; each takes free or expired leases up to its fair share (`FOR UPDATE SKIP LOCKED`,
so two claimers never wait on, or take, the same camera) and gives back what is beyond it. Every caption write of
a worker locks its lease row (`FOR SHARE`) and checks it still holds that token: a claim by another worker waits
for the write, or the write sees the new token and is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import Connection, Engine, text


class FencedOut(Exception):
    """A write for a camera whose lease this worker no longer holds with its token: refused, never retried."""

    def __init__(self, camera: str) -> None:
        super().__init__(f"camera {camera}: the lease is no longer held with this token; write refused")
        self.camera = camera


class Fence(Protocol):
    """What the caption store asks of the leases before a write (the worker's lease manager)."""

    @property
    def owner(self) -> str: ...

    def token(self, camera: str) -> int | None:
        """The token this worker holds for `camera`, or None when it holds none."""
        ...

    def refused(self, camera: str) -> None:
        """A write for `camera` was fenced out: the camera must stop at once."""
        ...


@dataclass(frozen=True, slots=True)
class Round:
    """What one round of lease keeping left this worker with."""

    held: dict[str, int]  # camera -> token
    fair_share: int


# A worker row unheard of for this long is deleted by any live worker's round: workers that died without leaving
# (kill -9, a lost node) would otherwise pile up, one row per process ever started. Far past any lease (a worker
# counts as live for one lease time only), so that what an operator reads in `workers` stays recent history.
FORGET_WORKER_S = 3600.0


def heartbeat(conn: Connection, worker: str, pipeline: str, capacity: int) -> None:
    conn.execute(
        text(
            "INSERT INTO workers (id, pipeline, capacity, heartbeat_at) VALUES (:id, :pipeline, :capacity, now()) "
            "ON CONFLICT (id) DO UPDATE SET pipeline = :pipeline, capacity = :capacity, heartbeat_at = now()"
        ),
        {"id": worker, "pipeline": pipeline, "capacity": capacity},
    )


def forget_dead_workers(conn: Connection, older_than_s: float = FORGET_WORKER_S) -> int:
    """Delete the rows of workers unheard of for `older_than_s`; how many went."""
    deleted = conn.execute(
        text("DELETE FROM workers WHERE heartbeat_at < now() - make_interval(secs => :s)"), {"s": older_than_s}
    )
    return int(deleted.rowcount or 0)


def renew(conn: Connection, worker: str, pipeline: str, held: dict[str, int], lease_s: float) -> dict[str, int]:
    """Extend the leases still held with their tokens; returns those (a lapsed or taken one is gone, and so is a
    camera removed or moved to another pipeline: its lease is left to lapse)."""
    if not held:
        return {}
    rows = conn.execute(
        text(
            "UPDATE camera_leases SET expires_at = now() + make_interval(secs => :lease), renewed_at = now() "
            "WHERE owner = :me AND expires_at > now() AND camera = ANY(:cameras) "
            "AND camera IN (SELECT camera FROM camera_configs WHERE pipeline = :p) RETURNING camera, token"
        ),
        {"me": worker, "lease": lease_s, "cameras": list(held), "p": pipeline},
    )
    return {camera: token for camera, token in rows if held.get(camera) == token}


def fair_share(conn: Connection, pipeline: str, capacity: int, live_s: float) -> int:
    """ceil(cameras * my capacity / capacity of the live workers), capped by my capacity."""
    total = conn.scalar(text("SELECT count(*) FROM camera_configs WHERE pipeline = :p"), {"p": pipeline}) or 0
    live = conn.scalar(
        text(
            "SELECT coalesce(sum(capacity), 0) FROM workers "
            "WHERE pipeline = :p AND heartbeat_at > now() - make_interval(secs => :live)"
        ),
        {"p": pipeline, "live": live_s},
    )
    live = max(int(live or 0), capacity)  # this worker counts even before its first heartbeat is seen
    return min(capacity, math.ceil(int(total) * capacity / live))


def claim(conn: Connection, worker: str, pipeline: str, count: int, lease_s: float) -> dict[str, int]:
    """Take up to `count` free or expired leases of `pipeline`'s cameras; returns camera -> new token."""
    if count <= 0:
        return {}
    conn.execute(
        text(
            "INSERT INTO camera_leases (camera, owner, token, expires_at, renewed_at) "
            "SELECT camera, NULL, 0, now(), now() FROM camera_configs WHERE pipeline = :p "
            "ON CONFLICT (camera) DO NOTHING"
        ),
        {"p": pipeline},
    )
    free = conn.scalars(
        text(
            "SELECT l.camera FROM camera_leases l JOIN camera_configs c ON c.camera = l.camera "
            "WHERE c.pipeline = :p AND (l.owner IS NULL OR l.expires_at <= now()) "
            "ORDER BY l.camera LIMIT :n FOR UPDATE OF l SKIP LOCKED"
        ),
        {"p": pipeline, "n": count},
    ).all()
    if not free:
        return {}
    rows = conn.execute(
        text(
            "UPDATE camera_leases SET owner = :me, token = token + 1, renewed_at = now(), "
            "expires_at = now() + make_interval(secs => :lease) WHERE camera = ANY(:cameras) RETURNING camera, token"
        ),
        {"me": worker, "lease": lease_s, "cameras": list(free)},
    )
    return {camera: token for camera, token in rows}


def release(conn: Connection, worker: str, cameras: list[str]) -> None:
    """Give leases back at once (the cameras were stopped first): another worker may take them now."""
    if cameras:
        conn.execute(
            text("UPDATE camera_leases SET owner = NULL, expires_at = now() WHERE owner = :me AND camera = ANY(:c)"),
            {"me": worker, "c": cameras},
        )


def keep_leases(
    engine: Engine, worker: str, pipeline: str, held: dict[str, int], capacity: int, lease_s: float
) -> Round:
    """One round: heartbeat, renew what is held, then claim up to the fair share or give back what is beyond
    it. The renewal commits on its own, so that a failed claim never costs the leases already held."""
    with engine.begin() as conn:
        heartbeat(conn, worker, pipeline, capacity)
        held = renew(conn, worker, pipeline, held, lease_s)
        forget_dead_workers(conn, max(FORGET_WORKER_S, 10 * lease_s))
    with engine.begin() as conn:
        share = fair_share(conn, pipeline, capacity, live_s=lease_s)
        if len(held) < share:
            held = {**held, **claim(conn, worker, pipeline, share - len(held), lease_s)}
    return Round(held=held, fair_share=share)


def leave(engine: Engine, worker: str, cameras: list[str]) -> None:
    """A worker stopping cleanly: its leases go back and it no longer counts as live."""
    with engine.begin() as conn:
        release(conn, worker, cameras)
        conn.execute(text("DELETE FROM workers WHERE id = :id"), {"id": worker})


def lease_held(conn: Connection, fence: Fence, camera: str) -> bool:
    """Whether `fence` holds `camera` with its token, unexpired in the database's clock; the lease row stays
    locked (shared) until the caller's transaction ends, so no claim can slip in before its write."""
    token = fence.token(camera)
    if token is None:
        return False
    found: int | None = conn.scalar(
        text("SELECT token FROM camera_leases WHERE camera = :c AND owner = :me AND expires_at > now() FOR SHARE"),
        {"c": camera, "me": fence.owner},
    )
    return found == token


def check_lease(conn: Connection, fence: Fence, camera: str) -> None:
    """Raises FencedOut unless `lease_held`, and tells the fence (its camera must stop)."""
    if not lease_held(conn, fence, camera):
        fence.refused(camera)
        raise FencedOut(camera)


def camera_of(conn: Connection, caption_id: int) -> str | None:
    camera: str | None = conn.scalar(text("SELECT camera FROM captions WHERE id = :id"), {"id": caption_id})
    return camera
