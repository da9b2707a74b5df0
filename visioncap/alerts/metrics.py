"""Prometheus metrics of the alerts process, in an injected registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

# A watch rule's answer takes a VLM prefill of its frames: tens of ms on a GPU alone, seconds behind a busy one.
QUESTION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


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
        self.questions = Counter(
            "visioncap_alert_questions_total",
            "Watch rules' questions to the VLM, by rule and answer: match, no_match, or error (no answer: the VLM "
            "unreachable, an HTTP error, the deadline passed, an answer not of the schema).",
            ["rule", "answer"],
            registry=self.registry,
        )
        self.question_seconds = Histogram(
            "visioncap_alert_question_seconds",
            "From a watch rule's question to the VLM's answer, by rule (answers only; errors are counted above).",
            ["rule"],
            buckets=QUESTION_BUCKETS,
            registry=self.registry,
        )

    def question(self, rule: str, match: bool | None, latency_ms: float | None) -> None:
        """One question asked and how it ended."""
        answer = "error" if match is None else "match" if match else "no_match"
        self.questions.labels(rule, answer).inc()
        if match is not None and latency_ms is not None:
            self.question_seconds.labels(rule).observe(latency_ms / 1000)
