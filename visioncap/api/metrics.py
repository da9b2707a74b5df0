"""Prometheus metrics of the API, in a registry of its own (one per app, so apps in one process never clash)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from visioncap.store.retention import RetentionMetrics


class ApiMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "visioncap_api_requests_total",
            "HTTP requests answered, by route template and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "visioncap_api_request_seconds",
            "Time to the response headers, by route template.",
            ["route"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=self.registry,
        )
        self.streams = Gauge("visioncap_api_streams", "Open /v1/stream connections.", registry=self.registry)
        self.stream_events = Counter(
            "visioncap_api_stream_events_total", "Captions sent on /v1/stream.", registry=self.registry
        )
        self.captions = Gauge(
            "visioncap_api_captions", "Stored rows by status (at the last scrape).", ["status"], registry=self.registry
        )
        self.retention = RetentionMetrics(self.registry)  # the sweeps this API process runs

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MetricsMiddleware:
    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()

        async def record(message: Message) -> None:
            if message["type"] == "http.response.start":
                route = scope.get("route")
                template = getattr(route, "path", None) or "unmatched"
                self.metrics.requests.labels(scope["method"], template, str(message["status"])).inc()
                self.metrics.latency.labels(template).observe(time.perf_counter() - start)
            await send(message)

        await self.app(scope, receive, record)
