"""Cameras as data: the `camera_configs` rows that say what each worker runs, and the pipeline-file seed.

Every write bumps the row's `config_version`; a running worker polls (camera, version) pairs and restarts only
the cameras whose version moved. Rows never hold a secret: URLs reference them as `${NAME}`, and a pipeline
file's inline credentials are stored masked (the worker takes them from its file, see `seed_cameras`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, cast

from pydantic import ValidationError
from sqlalchemy import CursorResult, Engine, delete, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from visioncap.config.cameras import CameraConfig, has_inline_secret
from visioncap.config.sources import SourceConfig, StreamSourceConfig
from visioncap.redact import mask_credentials
from visioncap.store.records import CameraConfigRecord, CameraOrigin, PipelineSeedRecord, utcnow

log = logging.getLogger(__name__)


class CameraExists(Exception):
    """A camera with this id is configured already."""


@dataclass(frozen=True, slots=True)
class StoredCamera:
    """One configured camera as read back."""

    config: CameraConfig
    origin: CameraOrigin
    version: int
    created_at: datetime
    updated_at: datetime

    @property
    def camera(self) -> str:
        return self.config.camera


def stored_source(source: SourceConfig) -> SourceConfig:
    """`source` as it may be stored: a URL with inline credentials masked (a pipeline file's: the worker keeps
    them), one whose secrets are all `${NAME}` references as it is (the worker resolves them)."""
    if isinstance(source, StreamSourceConfig) and has_inline_secret(source.url):
        return source.model_copy(update={"url": mask_credentials(source.url)})
    return source


def _stored(row: CameraConfigRecord) -> StoredCamera:
    config = CameraConfig.model_validate({**row.config, "paused": row.paused})
    return StoredCamera(config, row.origin, row.config_version, row.created_at, row.updated_at)


def _config_json(config: CameraConfig) -> dict[str, object]:
    data = config.model_dump(mode="json")
    data["source"] = stored_source(config.source).model_dump(mode="json")
    del data["paused"]  # its own column, so that pausing reads and writes no JSON
    return data


def list_cameras(engine: Engine, pipeline: str | None = None) -> list[StoredCamera]:
    """Configured cameras by id, of one pipeline or all."""
    statement = select(CameraConfigRecord).order_by(CameraConfigRecord.camera)
    if pipeline is not None:
        statement = statement.where(CameraConfigRecord.pipeline == pipeline)
    with Session(engine) as session:
        rows = list(session.scalars(statement))
    cameras = []
    for row in rows:
        try:
            cameras.append(_stored(row))
        except ValidationError as exc:
            # Stored by an older version that this one refuses (a NUL in its pipeline's name, say): one such row
            # must not hide every camera from the API and the workers. It can still be deleted by id.
            log.error("cameras: stored camera %r is not valid any more, left out (delete it): %s", row.camera, exc)
    return cameras


def camera_versions(engine: Engine, pipeline: str) -> dict[str, int]:
    """(camera, version) of every camera of `pipeline`: what a worker polls."""
    statement = select(CameraConfigRecord.camera, CameraConfigRecord.config_version).where(
        CameraConfigRecord.pipeline == pipeline
    )
    with Session(engine) as session:
        return {camera: version for camera, version in session.execute(statement)}


def get_camera(engine: Engine, camera: str) -> StoredCamera | None:
    with Session(engine) as session:
        row = session.get(CameraConfigRecord, camera)
        return None if row is None else _stored(row)


def add_camera(engine: Engine, config: CameraConfig, origin: CameraOrigin = CameraOrigin.API) -> StoredCamera:
    """A new camera; CameraExists when its id is taken."""
    now = utcnow()
    row = CameraConfigRecord(
        camera=config.camera,
        pipeline=config.pipeline,
        config=_config_json(config),
        paused=config.paused,
        origin=origin,
        config_version=1,
        created_at=now,
        updated_at=now,
    )
    try:
        with Session(engine, expire_on_commit=False) as session, session.begin():
            session.add(row)
    except IntegrityError:
        raise CameraExists(config.camera) from None
    return _stored(row)


def update_camera(engine: Engine, config: CameraConfig, expected_version: int | None = None) -> StoredCamera | None:
    """Replace a camera's config, bumping its version; None when it is gone (or its version is no longer
    `expected_version`: someone else changed it meanwhile)."""
    with Session(engine, expire_on_commit=False) as session, session.begin():
        row = session.get(CameraConfigRecord, config.camera, with_for_update=True)
        if row is None or (expected_version is not None and row.config_version != expected_version):
            return None
        row.pipeline = config.pipeline
        row.config = _config_json(config)
        row.paused = config.paused
        row.config_version += 1
        row.updated_at = utcnow()
    return _stored(row)


def remove_camera(engine: Engine, camera: str) -> bool:
    """Delete a camera's config (its captions and reported state stay); False when there was none."""
    with Session(engine) as session, session.begin():
        deleted = session.execute(delete(CameraConfigRecord).where(CameraConfigRecord.camera == camera))
        return cast(CursorResult[Any], deleted).rowcount > 0


def _seed_hash(source: SourceConfig) -> str:
    return hashlib.sha256(json.dumps(source.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()


class SeedOutcome(StrEnum):
    """What a pipeline file's seed did."""

    APPLIED = "applied"  # a version new to the table (or applied on purpose): its cameras are the rows now
    CURRENT = "current"  # the newest version already: rows written only where its entries differ (see the rule)
    STALE = "stale"  # a version seen before that is not the newest: nothing written


# Versions of one pipeline's file remembered; an older one than these would seed again (a file that old is gone).
SEED_HISTORY = 64


def _lock_seeds(session: Session, pipeline: str) -> None:
    """Seeds of one pipeline (workers that start together) take turns, so each sees the rows the one before it
    wrote and none inserts a row twice."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(hashtext(:key))"), {"key": f"visioncap-seed:{pipeline}"})
    else:
        # A write statement first: SQLite's write lock is taken before anything is read (a deferred transaction
        # would read, then wait for the other writer and insert what it just inserted).
        session.execute(
            update(PipelineSeedRecord)
            .where(PipelineSeedRecord.pipeline == pipeline)
            .values(generation=PipelineSeedRecord.generation)
        )


def seed_cameras(engine: Engine, pipeline: str, sources: list[SourceConfig], *, force: bool = False) -> SeedOutcome:
    """Put a pipeline file's cameras into the table (origin `file`).

    Versions: workers of one pipeline may run different versions of its file for a while (a rollout; a pod that
    crash-loops on the old one). A version is known by the digest of its camera entries. One new to the table is
    applied and becomes the newest; the newest applies again (idempotent); one seen before that is not the newest
    is stale and writes nothing, so an old file never reverts a newer one. `force` (`visioncap cameras apply`, and
    `visioncap run`, whose file is the one box's own) applies any version and makes it the newest.

    The rule for the rows of an applied version: a file camera's row is written when it is missing or when the
    file's entry changed since this file last seeded it (or, for a file camera, when another pipeline now runs it);
    otherwise the row stays as it is (changes made through the API survive a restart). A camera the API created
    under the same id is taken over only once the file's entry changes. File cameras of this pipeline that the file
    no longer lists are removed; cameras added through the API are never removed here.
    """
    now = utcnow()
    wanted = {source.camera: source for source in sources}
    digests = {camera: _seed_hash(source) for camera, source in wanted.items()}
    version = hashlib.sha256(json.dumps(sorted(digests.items())).encode()).hexdigest()
    with Session(engine) as session, session.begin():
        _lock_seeds(session, pipeline)
        seen = {
            record.digest: record
            for record in session.scalars(select(PipelineSeedRecord).where(PipelineSeedRecord.pipeline == pipeline))
        }
        newest = max(seen.values(), key=lambda record: record.generation, default=None)
        if version in seen and not force and newest is not None and newest.digest != version:
            return SeedOutcome.STALE
        outcome = SeedOutcome.CURRENT if newest is not None and newest.digest == version else SeedOutcome.APPLIED
        generation = 1 + (newest.generation if newest is not None else 0)
        if version not in seen:
            session.add(PipelineSeedRecord(pipeline=pipeline, digest=version, generation=generation, seeded_at=now))
        elif outcome is SeedOutcome.APPLIED:
            seen[version].generation, seen[version].seeded_at = generation, now
        for old in sorted(seen.values(), key=lambda record: record.generation, reverse=True)[SEED_HISTORY - 1 :]:
            if old.digest != version:
                session.delete(old)
        _apply_seed(session, pipeline, wanted, digests, now)
    return outcome


def _apply_seed(
    session: Session, pipeline: str, wanted: dict[str, SourceConfig], digests: dict[str, str], now: datetime
) -> None:
    rows = {row.camera: row for row in session.scalars(select(CameraConfigRecord)).all()}
    for row in rows.values():
        if row.pipeline == pipeline and row.origin is CameraOrigin.FILE and row.camera not in wanted:
            session.delete(row)
    for camera, source in wanted.items():
        digest = digests[camera]
        existing = rows.get(camera)
        config = _config_json(CameraConfig(pipeline=pipeline, source=source))
        if existing is None:
            session.add(
                CameraConfigRecord(
                    camera=camera,
                    pipeline=pipeline,
                    config=config,
                    paused=False,
                    origin=CameraOrigin.FILE,
                    seed_hash=digest,
                    config_version=1,
                    created_at=now,
                    updated_at=now,
                )
            )
        elif existing.origin is CameraOrigin.API and existing.seed_hash is None:
            existing.seed_hash = digest  # an API camera the file names too: the file's later changes win
        elif existing.seed_hash != digest or (existing.origin is CameraOrigin.FILE and existing.pipeline != pipeline):
            # Changed in the file, or the same file camera now run by another pipeline: the file wins.
            existing.pipeline, existing.config, existing.paused = pipeline, config, False
            existing.origin, existing.seed_hash = CameraOrigin.FILE, digest
            existing.config_version += 1
            existing.updated_at = now
