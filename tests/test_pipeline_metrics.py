"""Pipeline metrics live in a registry per pipeline: nothing registers on import, two pipelines never clash, and
the health port serves the registry it was given."""

from __future__ import annotations

import subprocess
import sys

import httpx
from helpers import REPO

from visioncap.pipeline.health import HealthServer
from visioncap.pipeline.metrics import PipelineMetrics

# Every visioncap module imported in a fresh interpreter (`__main__` modules run a CLI when imported).
IMPORT_ALL = """
import importlib, pkgutil, prometheus_client, visioncap
for module in pkgutil.walk_packages(visioncap.__path__, "visioncap."):
    if not module.name.endswith(".__main__"):
        importlib.import_module(module.name)
print(sorted(n for n in prometheus_client.REGISTRY._names_to_collectors if n.startswith("visioncap_")))
"""


def test_importing_every_module_registers_no_visioncap_metric_in_the_default_registry() -> None:
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL], cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_two_pipelines_in_one_process_keep_their_own_series() -> None:
    first, second = PipelineMetrics(), PipelineMetrics()
    first.captions.labels("door").inc()
    first.retention.sweeps.labels("ok").inc()
    assert first.registry.get_sample_value("visioncap_captions_total", {"camera": "door"}) == 1
    assert second.registry.get_sample_value("visioncap_captions_total", {"camera": "door"}) is None
    assert second.registry.get_sample_value("visioncap_retention_sweeps_total", {"outcome": "ok"}) is None


def test_the_health_port_serves_the_pipeline_metrics_it_was_given() -> None:
    served, other = PipelineMetrics(), PipelineMetrics()
    served.outbox_depth.set(3)
    other.outbox_depth.set(7)
    with HealthServer(lambda: (True, {}), served) as server:
        text = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10).text
    assert "visioncap_outbox_depth 3.0" in text
    assert "visioncap_outbox_depth 7.0" not in text
    # The process series the default registry used to add are still there (the soak bench reads them).
    assert "process_resident_memory_bytes" in text
    assert "python_info" in text
