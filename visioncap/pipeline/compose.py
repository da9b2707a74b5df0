"""The one place where a pipeline's parts are wired together: store, retention, VLM client (and, on request, the
vLLM server it talks to), detector, runner and health endpoint.

`visioncap run`, tests and workers that run pipelines build them here, so that every caller gets the same
pipeline; callers only decide how to show its progress and what to do with its summary.
"""

from __future__ import annotations

import logging
import signal
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from visioncap.caption.client import VlmCaptioner, check_vlm_ready
from visioncap.config.pipeline import PipelineConfig
from visioncap.config.settings import Settings
from visioncap.config.worker import WorkerConfig
from visioncap.detect.yolo import PersonDetector
from visioncap.errors import ConfigError, VisioncapError
from visioncap.pipeline.health import HealthServer
from visioncap.pipeline.lease_keeper import LeaseKeeper
from visioncap.pipeline.metrics import PipelineMetrics
from visioncap.pipeline.runner import PipelineRunner, RunSummary
from visioncap.store import CaptionStore, create_db_engine
from visioncap.store.camera_configs import SeedOutcome, seed_cameras
from visioncap.store.retention import RetentionJob

if TYPE_CHECKING:
    from visioncap.serve import VllmServer

log = logging.getLogger(__name__)


class Pipeline:
    """A pipeline ready to run, with everything it uses started; `close()` (or the end of a `with` block) stops
    those in reverse order. Made by `build_pipeline`."""

    def __init__(self, runner: PipelineRunner, metrics: PipelineMetrics, resources: ExitStack) -> None:
        self._runner = runner
        self._resources = resources
        self.metrics = metrics

    @property
    def summary(self) -> RunSummary:
        """Counts of the run so far; complete once `run()` has returned."""
        return self._runner.summary

    @property
    def outbox_depth(self) -> int:
        """Selected frames waiting for their caption."""
        return self._runner.outbox.depth

    def run(self) -> RunSummary:
        """Runs until every source has ended (files, folders) or `stop()` is called (live streams)."""
        return self._runner.run()

    def stop(self) -> None:
        """Asks the run to end, from any thread: sources stop, what is pending stays pending for the next run."""
        self._runner.stop()

    def close(self) -> None:
        self._resources.close()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(
        self, _type: type[BaseException] | None, _value: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.close()


def build_pipeline(
    config: PipelineConfig,
    settings: Settings,
    *,
    base_dir: Path | None = None,
    serve: str | None = None,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    check_vlm: bool = True,
    metrics: PipelineMetrics | None = None,
    worker: WorkerConfig | None = None,
) -> Pipeline:
    """Wires and starts everything `config` needs around its runner; nothing reads frames before `run()`.

    `base_dir` is where relative detector weights are looked up (the pipeline file's folder). `serve` names a
    model profile whose vLLM server is started for the pipeline's lifetime (on a free port) and captions instead
    of `vlm.base_url`. `metrics_port` serves /metrics, /healthz and /readyz on `metrics_host`. `check_vlm` fails
    here, before the detector loads, when the VLM endpoint is down or does not serve `vlm.model`; without it
    the run starts anyway and its captions wait in the outbox until the endpoint answers. `metrics` is the
    registry the pipeline records into (a new one by default: each pipeline in a process keeps its own series).
    `worker` makes this one of several workers sharing the pipeline's cameras by leases (PostgreSQL only): it
    runs the cameras it holds a lease on, and every caption write is fenced by the lease's token.

    Raises ConfigError or VlmUnavailableError (naming the configuration field or setting at fault); whatever
    was started by then is stopped again.
    """
    metrics = metrics or PipelineMetrics()
    with ExitStack() as stack:
        base_url = config.vlm.base_url or settings.vlm_base_url
        if serve is not None:
            server = _vllm_server(serve, settings)
            if server.profile.served_model_name != config.vlm.model:
                raise ConfigError(
                    f"pipeline {config.name}: vlm.model is {config.vlm.model!r} but model profile {serve!r} serves "
                    f"{server.profile.served_model_name!r}"
                )
            log.info("starting vLLM (profile %s) on %s; log in %s", serve, server.base_url, server.log_file)
            stack.enter_context(server)
            base_url = server.base_url
        # A worker's lease locks go with a session stalled a third of a lease (see create_db_engine).
        idle_s = worker.lease_s / 3 if worker is not None else None
        engine = create_db_engine(settings.resolved_database_url(), idle_transaction_s=idle_s)
        stack.callback(engine.dispose)
        if worker is not None:
            _check_shareable(engine)
        # The schema before anything that may fail (the VLM check, the detector): a failed start leaves a database
        # that answers, with nothing in it.
        CaptionStore(engine).create_schema()
        api_key = settings.vlm_api_key.get_secret_value()
        if check_vlm:
            check_vlm_ready(base_url, config.vlm.model, api_key)
        detector = PersonDetector(config.detector, base_dir=base_dir)
        # Before any camera lease: a worker that takes a camera over (its owner died) then analyses its first
        # frame at once, instead of paying the model's first-call cost (seconds on a CPU) inside the takeover.
        detector.warm_up()
        _seed(engine, config, own_file=worker is None)
        leases = None
        if worker is not None:
            leases = _lease_keeper(engine, config, worker, metrics)
            stack.callback(leases.stop)  # after the runner has stopped its cameras (the stack unwinds backwards)
        store = CaptionStore(engine, fence=leases)
        # Sweeps run here as well as in `visioncap api`: a pipeline alone keeps its database bounded too.
        retention = stack.enter_context(RetentionJob.from_settings(store.engine, settings, metrics.retention))
        captioner = VlmCaptioner(config.vlm, config.caption, base_url, api_key)
        # A frame that cannot be saved for lack of space wakes retention (VISIONCAP_RETENTION_MIN_FREE_MB).
        runner = PipelineRunner(
            config, detector, captioner, store, settings.data_dir, metrics, on_disk_full=retention.wake, leases=leases
        )
        if serve is not None:
            runner.watch_server(server)  # /readyz says whether vLLM answers; the run ends if it is gone for good
        if metrics_port is not None:
            stack.enter_context(HealthServer(runner.readiness, metrics, port=metrics_port, host=metrics_host))
        return Pipeline(runner, metrics, stack.pop_all())


def _check_shareable(engine: Engine) -> None:
    if engine.dialect.name != "postgresql":
        raise ConfigError(
            f"visioncap worker shares cameras between several workers through leases in PostgreSQL, and "
            f"VISIONCAP_DATABASE_URL points at {engine.dialect.name}: use a PostgreSQL database, or `visioncap run` "
            "for the one worker of a single box"
        )


def _seed(engine: Engine, config: PipelineConfig, own_file: bool) -> None:
    """The file's cameras into the database, where the runner reads what to run, and before a worker's first claim
    (which would find nothing to take). The one box's file is its own: applied whatever version it is."""
    if seed_cameras(engine, config.name, list(config.sources), force=own_file) is SeedOutcome.STALE:
        log.warning(
            "worker: this pipeline file is an older version of pipeline %s than the one its cameras follow (another "
            "worker started with a newer one): the cameras are left as they are; to go back to this version on "
            "purpose: `visioncap cameras apply FILE`",
            config.name,
        )


def _lease_keeper(
    engine: Engine, config: PipelineConfig, worker: WorkerConfig, metrics: PipelineMetrics
) -> LeaseKeeper:
    """Started, with a first round done, so that the runner starts with the cameras this worker holds.

    The schema (the lease tables among it) is already made by `build_pipeline`."""
    keeper = LeaseKeeper(engine, config.name, worker, metrics=metrics)
    try:
        keeper.step()
    except SQLAlchemyError as exc:
        raise VisioncapError(f"worker: cannot take camera leases: {exc}") from exc
    keeper.start()
    log.info("worker %s: %d cameras leased (capacity %d)", keeper.owner, len(keeper.cameras()), worker.capacity)
    return keeper


def stop_on_signals(pipeline: Pipeline) -> None:
    """Makes SIGTERM and SIGINT (Ctrl-C) stop `pipeline`, for the rest of the process.

    Not only while it runs: a signal while it shuts down (the outbox draining, a vLLM server stopping) must not
    cut that short. Python takes signal handlers in the main thread only.
    """

    def _stop(_signum: int, _frame: object) -> None:
        log.info("stopping: sources close, pending captions stay pending for the next run")
        pipeline.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)


def _vllm_server(profile_name: str, settings: Settings) -> VllmServer:
    from visioncap.config.serve import ServeOptions
    from visioncap.serve import free_port
    from visioncap.serve.command import planned_server

    port = free_port()
    options = ServeOptions(
        profile=profile_name, models_dir=settings.models_dir, python=settings.server_python, port=port
    )
    server = planned_server(options)
    server.log_file = settings.data_dir / "logs" / f"vllm-{server.profile.name}-{port}.log"
    server.run_dir = settings.data_dir / "run"  # its pid file beside its log, in these settings' data folder
    return server
