"""Prometheus metrics of the alerts process, in an injected registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class AlertMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.fired = Counter("visioncap_alerts_fired_total", "Alerts fired, by rule.", ["rule"], registry=self.registry)
        self.deliveries = Counter(
            "visioncap_alert_deliveries_total",
            "Delivery attempts by destination and outcome: delivered (acknowledged), retry (failed, sent again "
            "later), failed (given up or refused for good).",
            ["destination", "outcome"],
            registry=self.registry,
        )
