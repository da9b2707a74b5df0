"""Prometheus metrics of the gateway, in a registry of its own (served at the gateway's /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from visioncap.gateway.admission import Action, Decision, Violation
from visioncap.gateway.scheduler import SchedulerState

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75, 1, 2.5, 5, 10, 30)
GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5)
WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class GatewayMetrics:
    """All gateway series; one instance per app, so several gateways can live in one process (tests).

    What belongs to one replica (its controller, background queue, load and health) is labelled `upstream`;
    every replica's series exist from the start, so a scrape shows a replica that never answered.
    """

    def __init__(self, upstreams: list[str]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "visioncap_gateway_requests_total",
            "Requests answered, by class, endpoint and HTTP status (the gateway's own refusals included).",
            ["traffic_class", "endpoint", "status"],
            registry=r,
        )
        self.rejections = Counter(
            "visioncap_gateway_rejections_total",
            "Requests the gateway refused itself, by class and reason.",
            ["traffic_class", "reason"],
            registry=r,
        )
        self.preemptions = Counter(
            "visioncap_gateway_preemptions_total",
            "Background requests cancelled at vLLM to make way for interactive work and queued again.",
            ["upstream"],
            registry=r,
        )
        self.downscaled = Counter(
            "visioncap_gateway_downscaled_images_total",
            "Background images the gateway shrank to the per-image token cap while interactive traffic was active.",
            ["traffic_class"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "visioncap_gateway_upstream_errors_total",
            "Forwarded requests that failed on vLLM's side after being sent (unreachable, timeout, stream broken "
            "or an error event inside a stream), by class.",
            ["traffic_class"],
            registry=r,
        )
        self.ends = Counter(
            "visioncap_gateway_responses_ended_total",
            "Forwarded answers by how they ended: completed (the whole body reached the caller), caller_gone (the "
            "caller disconnected first), upstream_error (vLLM broke off or sent an error event) or gateway_error.",
            ["traffic_class", "how"],
            registry=r,
        )
        self.ttft = Histogram(
            "visioncap_gateway_ttft_seconds",
            "Time from the request reaching the gateway to the first network read that brought streamed output.",
            ["traffic_class"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "visioncap_gateway_inter_token_seconds",
            "Inter-token gap of streamed output: the time between two network reads that brought output, shared "
            "equally by the tokens of the later one (visioncap.gateway.sse); one observation per token.",
            ["traffic_class"],
            buckets=GAP_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "visioncap_gateway_queue_wait_seconds",
            "Time a request waited in the gateway before being forwarded (0 for interactive).",
            ["traffic_class"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.duration = Histogram(
            "visioncap_gateway_request_seconds",
            "Time from the request reaching the gateway to the end of its answer.",
            ["traffic_class"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "visioncap_gateway_in_flight",
            "Requests forwarded and not yet finished, by class.",
            ["traffic_class"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "visioncap_gateway_queue_depth",
            "Background requests waiting, by upstream (the alert line's included).",
            ["upstream"],
            registry=r,
        )
        self.alert_queue_depth = Gauge(
            "visioncap_gateway_alert_queue_depth",
            "Requests of alert classes waiting in their own line (served before background's), by upstream.",
            ["upstream"],
            registry=r,
        )
        self.waiting_body_bytes = Gauge(
            "visioncap_gateway_waiting_body_bytes",
            "Bytes of background request bodies the gateway holds (read or waiting for admission); bounded by "
            "limits.max_waiting_body_bytes.",
            registry=r,
        )
        self.image_tokens_in_flight = Gauge(
            "visioncap_gateway_image_tokens_in_flight",
            "Estimated image tokens of background requests in flight, by upstream.",
            ["upstream"],
            registry=r,
        )
        self.image_tokens = Counter(
            "visioncap_gateway_image_tokens_total",
            "Estimated image tokens forwarded, by class.",
            ["traffic_class"],
            registry=r,
        )
        self.cap_concurrency = Gauge(
            "visioncap_gateway_background_concurrency_cap",
            "Background requests allowed in flight now.",
            ["upstream"],
            registry=r,
        )
        self.cap_limit = Gauge(
            "visioncap_gateway_background_concurrency_limit",
            "The controller's adaptive concurrency limit (applies while interactive traffic is active).",
            ["upstream"],
            registry=r,
        )
        self.starts_per_s = Gauge(
            "visioncap_gateway_background_starts_per_second",
            "The paced rate at which background requests start while interactive traffic is active "
            "(NaN under the concurrency-limit policy).",
            ["upstream"],
            registry=r,
        )
        self.borrowed_starts = Counter(
            "visioncap_gateway_borrowed_starts_total",
            "Starts of pacer credit taken before the pacer gave them (a request of several frames spends one a frame; "
            "an alert may start up to two ahead), paid back by the background starts after it.",
            ["upstream", "traffic_class"],
            registry=r,
        )
        self.learnt_share = Gauge(
            "visioncap_gateway_learnt_gap_share",
            "The learnt model's share of interactive inter-token gaps above the objective: `base` among gaps near "
            "no frame start (the host's own), `excess` what frames add over all gaps (NaN: too little evidence).",
            ["upstream", "part"],
            registry=r,
        )
        self.learnt_rate = Gauge(
            "visioncap_gateway_learnt_starts_per_second",
            "The start rate the learnt model allows at the target share (NaN: no limit, or too little evidence).",
            ["upstream"],
            registry=r,
        )
        self.cap_image_tokens = Gauge(
            "visioncap_gateway_background_image_tokens_cap",
            "Background image tokens allowed in flight now.",
            ["upstream"],
            registry=r,
        )
        self.interactive_active = Gauge(
            "visioncap_gateway_interactive_active",
            "1 while interactive traffic to the upstream counts as active.",
            ["upstream"],
            registry=r,
        )
        self.window_p99 = Gauge(
            "visioncap_gateway_interactive_p99_seconds",
            "Interactive latency p99 over the controller's sliding window.",
            ["upstream", "series"],
            registry=r,
        )
        self.decisions = Counter(
            "visioncap_gateway_controller_decisions_total",
            "Controller steps by action.",
            ["upstream", "action"],
            registry=r,
        )
        self.decreases = Counter(
            "visioncap_gateway_controller_decreases_total",
            "Controller decreases by the objective whose miss asked for them (one decision may count several).",
            ["upstream", "reason"],
            registry=r,
        )
        self.upstream_waiting = Gauge(
            "visioncap_gateway_upstream_requests_waiting",
            "vllm:num_requests_waiting at the last poll.",
            ["upstream"],
            registry=r,
        )
        self.upstream_running = Gauge(
            "visioncap_gateway_upstream_requests_running",
            "vllm:num_requests_running at the last poll.",
            ["upstream"],
            registry=r,
        )
        self.upstream_up = Gauge(
            "visioncap_gateway_upstream_up",
            "1 while the upstream is in (its health checks pass), 0 while it is out.",
            ["upstream"],
            registry=r,
        )
        self.upstream_requests = Counter(
            "visioncap_gateway_upstream_requests_total",
            "Requests sent to each upstream, by class (a retried chat counts at both).",
            ["upstream", "traffic_class"],
            registry=r,
        )
        self.retries = Counter(
            "visioncap_gateway_retries_total",
            "Chats sent again to another upstream because this one failed before the first byte of its answer.",
            ["upstream"],
            registry=r,
        )
        # Closed label sets start at zero, so a scrape shows every series before the first step that counts one.
        for upstream in upstreams:
            for action in Action:
                self.decisions.labels(upstream, action)
            for violation in Violation:
                self.decreases.labels(upstream, violation)
            self.preemptions.labels(upstream)
            self.retries.labels(upstream)
            self.upstream_up.labels(upstream).set(0)
            self.queue_depth.labels(upstream).set(0)
            self.alert_queue_depth.labels(upstream).set(0)
            self.image_tokens_in_flight.labels(upstream).set(0)

    def scheduler_changed(self, upstream: str, state: SchedulerState) -> None:
        self.queue_depth.labels(upstream).set(state.waiting)
        self.alert_queue_depth.labels(upstream).set(state.waiting_urgent)
        self.image_tokens_in_flight.labels(upstream).set(state.image_tokens_in_flight)

    def decision(self, upstream: str, decision: Decision) -> None:
        self.decisions.labels(upstream, decision.action).inc()
        if decision.action is Action.DECREASE:
            for reason in decision.reasons:
                self.decreases.labels(upstream, reason).inc()
        nan = float("nan")
        self.cap_limit.labels(upstream).set(decision.limit)
        self.starts_per_s.labels(upstream).set(decision.starts_per_s if decision.starts_per_s is not None else nan)
        learnt = decision.learnt
        self.learnt_share.labels(upstream, "base").set(nan if learnt is None else learnt.base_share)
        self.learnt_share.labels(upstream, "excess").set(nan if learnt is None else learnt.excess_share)
        rate = None if learnt is None else learnt.rate_per_s
        self.learnt_rate.labels(upstream).set(nan if rate is None else rate)
        self.cap_concurrency.labels(upstream).set(decision.caps.concurrency)
        self.cap_image_tokens.labels(upstream).set(decision.caps.image_tokens)
        self.interactive_active.labels(upstream).set(1 if decision.caps.interactive_active else 0)
        self.window_p99.labels(upstream, "ttft").set(decision.ttft_p99_s if decision.ttft_p99_s is not None else nan)
        self.window_p99.labels(upstream, "itl").set(decision.itl_p99_s if decision.itl_p99_s is not None else nan)

    def render(self) -> bytes:
        return generate_latest(self.registry)
