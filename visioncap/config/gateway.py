"""The priority gateway's file (`visioncap gateway --config FILE`): upstreams, classes, keys, admission control."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from visioncap.config.base import StrictModel
from visioncap.config.loading import load_yaml_model

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


class UpstreamConfig(StrictModel):
    """One vLLM server (replica) the gateway forwards to."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        max_length=64,
        description="The replica's name, unique in the file: keys name it in `upstream`, metrics label by it.",
    )
    base_url: str = Field(
        pattern=r"^https?://",
        description="vLLM's OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1.",
    )
    api_key_env: str | None = Field(
        default=None,
        min_length=1,
        description="Name of the environment variable holding the key vLLM was started with (--api-key or "
        "VLLM_API_KEY); `visioncap gateway` refuses to start while it is unset or empty. None sends no key. Callers' "
        "own keys are never forwarded.",
    )
    metrics_url: str | None = Field(
        default=None,
        pattern=r"^https?://",
        description="vLLM's Prometheus endpoint; None derives it from base_url (its root + /metrics).",
    )
    metrics_poll_s: float = Field(
        default=1.0,
        ge=0,
        description="Seconds between reads of vLLM's /metrics (num_requests_waiting/running) while background "
        "requests wait or run; 0 turns polling off.",
    )
    metrics_idle_poll_s: float = Field(
        default=10.0,
        gt=0,
        description="Seconds between reads of vLLM's /metrics while no background request waits or runs (the "
        "readings mostly steer background admission, and each costs vLLM's API server milliseconds of CPU that "
        "chats then wait for; the choice of replica for a chat uses them while younger than "
        "controller.upstream_stale_s, else the gateway's own counts). Never shorter than metrics_poll_s.",
    )
    connect_timeout_s: float = Field(default=5.0, gt=0, description="Seconds to open a connection to vLLM.")
    read_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="Longest silence, in seconds, between two pieces of a vLLM answer before the request fails.",
    )
    health_interval_s: float = Field(
        default=1.0,
        ge=0,
        description="Seconds between two health checks (GET vLLM's /health at the server's root); 0: no checks, "
        "the upstream always counts as in (a server that answers nothing but the requests it is sent).",
    )
    health_timeout_s: float = Field(
        default=1.0, gt=0, description="Seconds a health check may take before it counts as failed."
    )
    down_after_failures: int = Field(
        default=2,
        ge=1,
        description="Failed health checks in a row that take the replica out (no chat is routed to it and its "
        "background spills to others); one that passes brings it back. With the defaults a dead replica is out "
        "within 4 s. A request the replica refuses at connection takes it out at once.",
    )

    def resolved_metrics_url(self) -> str:
        if self.metrics_url:
            return self.metrics_url
        root = self.base_url.rstrip("/")
        root = root.removesuffix("/v1")
        return f"{root}/metrics"


class TrafficClassConfig(StrictModel):
    """A class of traffic: how the gateway admits it and which vLLM priority it runs at."""

    role: Literal["interactive", "background", "alert"] = Field(
        description="`interactive`: forwarded at once, its latency measured against the objectives; `background`: "
        "waits in the gateway for the admission controller (concurrency and image-token caps, per-camera round "
        "robin, deadline); `alert` (an alert rule's question to the VLM): waits as background does, in a line of "
        "its own served first (within the same pacing while chat is active, borrowing up to two starts of its "
        "credit, which background pays back: never above chat's objectives) and never preempted for chat."
    )
    priority: int = Field(
        ge=INT64_MIN,
        le=INT64_MAX,
        description="vLLM `priority` set on every request of this class, replacing the caller's (lower = sooner; "
        "needs vLLM's --scheduling-policy priority).",
    )
    deadline_s: float | None = Field(
        default=None,
        gt=0,
        le=86_400,
        description="Seconds a request of this class may wait in the gateway before it is refused (408); a shorter "
        "X-Visioncap-Deadline-Ms header wins. None: background.deadline_s. Interactive requests never wait.",
    )


class RateLimitConfig(StrictModel):
    """A token bucket: `requests_per_s` on average, up to `burst` at once."""

    requests_per_s: float = Field(gt=0, description="Sustained requests per second allowed for the key.")
    burst: int = Field(default=1, ge=1, description="Requests allowed at once after a quiet spell (bucket size).")


class ApiKeyConfig(StrictModel):
    """One caller key. Only its SHA-256 is stored (`visioncap.config.keys.hash_key`)."""

    name: str = Field(min_length=1, description="Name of the caller, used in logs and metrics.")
    sha256: str = Field(
        pattern=r"^[0-9a-fA-F]{64}$",
        description="Hex SHA-256 of the key as the caller sends it (Authorization: Bearer KEY).",
    )
    traffic_class: str = Field(min_length=1, description="Name of the traffic class (under `classes`) of this key.")
    rate_limit: RateLimitConfig | None = Field(default=None, description="Request rate limit; None: unlimited.")
    upstream: str | None = Field(
        default=None,
        min_length=1,
        description="Name of the upstream (under `upstreams`) that background requests of this key go to: the "
        "replica on the camera box's own GPU, so frames stay local. They spill to the other replicas only while "
        "it is out (failing its health checks). None: the first upstream. Background keys only: chat goes to "
        "the replica with the best predicted time to first token.",
    )
    camera: str | None = Field(
        default=None,
        min_length=1,
        description="Camera or tenant label: background requests of this key share one round-robin turn unless "
        "a request names its camera (X-Visioncap-Camera header or the `user` field).",
    )
    cameras: list[str] | None = Field(
        default=None,
        description="Cameras a background request of this key may name (X-Visioncap-Camera header or `user`); "
        "naming another is refused with 403, so a caller cannot claim more round-robin turns by inventing "
        "cameras. None: any name.",
    )

    @field_validator("sha256")
    @classmethod
    def _lower(cls, value: str) -> str:
        return value.lower()


class ObjectivesConfig(StrictModel):
    """What interactive traffic is promised; the controller shrinks background work when it is not met."""

    ttft_p99_ms: float = Field(
        default=500.0, gt=0, description="Target p99 time to first token of interactive streams."
    )
    itl_p99_ms: float = Field(
        default=100.0, gt=0, description="Target p99 gap between two streamed chunks of an interactive answer."
    )
    window_s: float = Field(
        default=10.0, gt=0, description="Sliding window: percentiles cover the samples of the last this many seconds."
    )
    window_max_samples: int = Field(
        default=4096, ge=1, description="Most samples kept per series in the window (the newest are kept)."
    )


class BackgroundConfig(StrictModel):
    """Caps and queue of background traffic."""

    max_concurrency: int = Field(
        default=8, ge=1, description="Background requests in flight at vLLM when no interactive request is active."
    )
    min_concurrency: int = Field(
        default=1, ge=0, description="Floor the controller never goes below, so background work keeps moving."
    )
    max_image_tokens_in_flight: int = Field(
        default=8192,
        ge=1,
        description="Estimated image tokens of background requests in flight at full concurrency; the cap shrinks "
        "with the concurrency cap. One request is always admitted when none is in flight.",
    )
    queue_size: int = Field(
        default=256, ge=0, description="Most background requests waiting in the gateway; more are answered 429."
    )
    preempt: bool = Field(
        default=True,
        description="When interactive traffic arrives or the cap shrinks, cancel non-streaming background requests "
        "admitted within `preempt_window_s` (still in vLLM's queue or prefill) and put them back at the head of "
        "their camera's queue: vLLM's priority policy cannot stop an image prefill that already runs.",
    )
    preempt_window_s: float = Field(
        default=1.5,
        ge=0,
        description="Only background requests admitted this recently are preempted; older ones are likely "
        "decoding already, when finishing costs chat less than starting over.",
    )
    active_max_image_tokens: int | None = Field(
        default=None,
        ge=1,
        description="While interactive traffic is active, background images estimated above this many tokens are "
        "downscaled by the gateway (re-encoded JPEG) to fit, so a caption keeps moving at a small cost per engine "
        "step; None: images pass as sent and wait for room instead.",
    )
    deadline_s: float = Field(
        default=30.0,
        gt=0,
        description="Longest wait in the gateway's queue; after it a request is answered 408 `deadline_exceeded` "
        "(a caller may ask for less with the X-Visioncap-Deadline-Ms header).",
    )

    @model_validator(mode="after")
    def _floor_below_ceiling(self) -> BackgroundConfig:
        if self.min_concurrency > self.max_concurrency:
            raise ValueError(
                f"min_concurrency ({self.min_concurrency}) is above max_concurrency ({self.max_concurrency})"
            )
        return self


class ControllerConfig(StrictModel):
    """How the background caps adapt: additive increase, multiplicative decrease."""

    interval_s: float = Field(default=0.25, gt=0, description="Seconds between two controller decisions.")
    additive_increase: float = Field(
        default=1.0, gt=0, description="Concurrency added per decision while the objectives are met."
    )
    decrease_factor: float = Field(
        default=0.5, gt=0, lt=1, description="Concurrency is multiplied by this when an objective is missed."
    )
    idle_after_s: float = Field(
        default=5.0,
        ge=0,
        description="Seconds without any interactive request after which background runs at max_concurrency "
        "(work-conserving); 0 switches at once. Chat arrives in sessions: a gap of a second or two between "
        "requests is still an active session, and full-size images started in it delay the next first token.",
    )
    increase_interval_s: float = Field(
        default=1.0,
        ge=0,
        description="Least seconds between two additive increases, so each step is judged on latency measured "
        "with the previous one in effect (an image's effect shows only when its prefill runs).",
    )
    upstream_waiting_limit: int = Field(
        default=0,
        ge=0,
        description="While interactive traffic is active, more than this many requests waiting inside vLLM "
        "(vllm:num_requests_waiting) counts as a missed objective.",
    )
    upstream_running_limit: int | None = Field(
        default=None,
        ge=1,
        description="While interactive traffic is active, more than this many requests running in vLLM "
        "(vllm:num_requests_running) counts as a missed objective; None: no limit.",
    )
    upstream_stale_s: float = Field(
        default=5.0, gt=0, description="vLLM metrics older than this are ignored (the poll failed or stalled)."
    )


class PacingConfig(StrictModel):
    """How background starts are spread while interactive traffic is active (instead of stopped).

    What costs a chat stream is an engine step that also runs a frame's vision encoder and prefill: vLLM never
    splits one image's encoder pass, and every stream waits for the whole step. A caption's decode beside chat
    costs little. So while chat is active the gateway limits how often background requests *start*, one at a
    time and evenly spread, so that few engine steps carry image work and no step carries several; the rate
    adapts to the objectives (multiplicative decrease when the fresh inter-token gaps miss the p99 objective,
    additive increase while they meet it and frames wait) and never falls below a floor, so frames keep moving.
    """

    enabled: bool = Field(
        default=True,
        description="Pace background starts while interactive traffic is active; false: the older policy, an "
        "adaptive concurrency limit that may reach `background.min_concurrency` (0 stops background).",
    )
    start_per_s: float = Field(
        default=1.8,
        gt=0,
        description="Background requests started per second while interactive traffic is active, before any "
        "measurement has moved it (kept across idle spells once learnt). The default is the cost model's "
        "ceiling for qwen2.5-vl-7b on an H200 at an inter-token p99 of 1.25x chat alone (1.84/s); `visioncap "
        "serve --profile P --gpu G --dry-run` prints it for other profiles and GPU classes (an L4: 0.16/s).",
    )
    min_per_s: float = Field(
        default=0.25,
        gt=0,
        description="Floor of the start rate: however chat fares, one background request starts at least this "
        "often while any wait, so frames are never held until their deadline by the controller alone.",
    )
    max_per_s: float = Field(
        default=50.0, gt=0, description="Ceiling of the start rate while interactive traffic is active."
    )
    increase_per_s: float = Field(
        default=0.25,
        gt=0,
        description="Starts per second added by one increase (at most one every `controller.increase_interval_s`).",
    )
    decrease_factor: float = Field(
        default=0.7, gt=0, lt=1, description="The start rate is multiplied by this when an objective is missed."
    )
    increase_factor: float = Field(
        default=1.25,
        ge=1,
        description="While chat's windowed p99s sit far inside their objectives (at most `headroom` of them) and the "
        "learnt model (`learn_rate`) has measured room for more frames, an increase multiplies the start rate by "
        "this instead of adding `increase_per_s`, so a loose objective is reached in seconds rather than minutes "
        "(additive steps of 0.25/s take a minute from 2 to 16 frames/s) while the learnt cap bounds the growth; "
        "near the objectives, and before the model has its evidence, increases stay additive (bench mixed "
        "2026-12-03 14:03, without that condition: at 1.25x a few seconds of gaps looked far inside while the rate "
        "overshot to 8.8/s, and chat's inter-token p99 missed). 1: additive only.",
    )
    headroom: float = Field(
        default=0.8,
        gt=0,
        le=1,
        description="Fraction of each objective that chat's windowed TTFT and inter-token p99s must stay within "
        "for an increase to be multiplicative (`increase_factor`).",
    )
    min_fresh_gaps: int = Field(
        default=100,
        ge=1,
        description="Inter-token gaps measured since the last decrease before the inter-token objective can ask "
        "for another: a p99 needs about a hundred samples to say anything.",
    )
    evidence_z: float = Field(
        default=2.0,
        ge=0,
        description="How sure a miss must be before the rate falls: the samples above an objective (inter-token "
        "gaps since the last decrease; first tokens since the last decrease, the newest 1,000) must exceed 1 % of "
        "them by this many standard errors (Poisson: z x sqrt(count above)); with 2, at least 5 above. Chat alone "
        "already puts about 1 % of its gaps near its own p99, so a bare count above 1 % of a hundred gaps is a coin "
        "toss, and one slow first token in a hundred is what the objective allows; 0: any count above 1 %.",
    )
    first_token_hold_s: float = Field(
        default=0.25,
        ge=0,
        description="While a streaming interactive request waits for its first token (at most this long), no "
        "background request starts, so the chat's prefill never shares its engine step with a frame's encoder; "
        "0: no hold. A start due under `min_per_s` goes ahead anyway (steady chat cannot stop captions), and "
        "non-streaming requests, whose callers see no first token, hold nothing.",
    )

    learn_rate: bool = Field(
        default=True,
        description="Cap the start rate by what the inter-token objective allows, learnt from measured gaps "
        "(`visioncap.gateway.miss_model`): the share of gaps above the objective near no frame (the host's own) "
        "and what gaps near frame starts add, over the last `model_window_s`; the rate that keeps the total at "
        "`target_share` (no cap when the host's own share reaches the target: no rate meets the objective then). "
        "Additive increase and multiplicative decrease still act below that cap; false: AIMD only.",
    )
    target_share: float = Field(
        default=0.007,
        gt=0,
        lt=0.01,
        description="Share of inter-token gaps the learnt rate lets exceed the objective. Below the 1 % a p99 "
        "allows, so that the p99 of a few thousand gaps stays within the objective at the upper end of its noise: "
        "over 3,000 gaps, 0.7 % above puts the p99's upper 95 % bound at about 1 % (21 + 2 x sqrt(21) = 30).",
    )
    model_window_s: float = Field(
        default=60.0,
        gt=0,
        description="Seconds of measurements the learnt rate rests on: long enough for thousands of gaps and "
        "tens of frame starts, short enough to follow a change of the host's speed within a minute.",
    )
    spike_window_s: float = Field(
        default=0.15,
        gt=0,
        description="A gap counts as near a frame when a background request started at most this long before "
        "the gap ended: a frame's encoder and prefill run within a few engine steps of its start, after vLLM's "
        "input processing and queue. Longer windows leave fewer gaps near no frame to measure the host by.",
    )
    model_min_frames: int = Field(
        default=20, ge=1, description="Frame starts in the window before the learnt rate applies."
    )
    model_min_gaps: int = Field(
        default=1000,
        ge=4,
        description="Inter-token gaps in the window before the learnt rate applies (a minute of one chat at a "
        "time is about 2,000): 10 gaps above in 1,000 are told from 5 by about 1.3 standard errors, and the "
        "estimate keeps improving as the window fills.",
    )

    @model_validator(mode="after")
    def _ordered(self) -> PacingConfig:
        if not self.min_per_s <= self.start_per_s <= self.max_per_s:
            raise ValueError(
                f"pacing rates must satisfy min_per_s <= start_per_s <= max_per_s "
                f"(got {self.min_per_s}, {self.start_per_s}, {self.max_per_s})"
            )
        return self


class ImagesConfig(StrictModel):
    """Image token estimates and which image URLs may pass."""

    token_size: int = Field(
        default=28,
        ge=1,
        description="Side in pixels of the square one image token covers: patch size x merge size (Qwen2/2.5-VL 28, "
        "Qwen3-VL 32).",
    )
    min_tokens_per_image: int = Field(
        default=4, ge=1, description="The model's smallest image, in tokens (processor min_pixels / token_size^2)."
    )
    max_tokens_per_image: int = Field(
        default=16384,
        ge=1,
        description="The model's largest image, in tokens (processor max_pixels / token_size^2); also the estimate "
        "for images whose size cannot be read (allow-listed URLs).",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Hosts whose http(s) media URLs are forwarded (vLLM fetches them); empty: only data: URIs.",
    )
    max_pixels_margin: float = Field(
        default=4.0,
        ge=1.0,
        description="Inline images with more pixels than the model's largest image (max_tokens_per_image x "
        "token_size^2) times this are refused with 400 from their header, before any decoding: the processor "
        "would shrink them anyway, and decoding one costs memory in proportion to its pixels.",
    )

    @field_validator("allowed_hosts")
    @classmethod
    def _lower_hosts(cls, hosts: list[str]) -> list[str]:
        return [host.strip().lower() for host in hosts]

    @model_validator(mode="after")
    def _min_below_max(self) -> ImagesConfig:
        if self.min_tokens_per_image > self.max_tokens_per_image:
            raise ValueError("min_tokens_per_image is above max_tokens_per_image")
        return self


class LimitsConfig(StrictModel):
    """Request limits applied before anything is forwarded."""

    max_body_bytes: int = Field(
        default=20 * 1024 * 1024, ge=1024, description="Largest request body of an interactive key (413 above)."
    )
    max_background_body_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1024,
        description="Largest request body of a background key (413 above): a camera frame is a JPEG of a few MB "
        "at most, and background bodies wait in the gateway's memory.",
    )
    max_waiting_body_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=1024,
        description="Bytes of background bodies the gateway holds at once, read or waiting for admission; a body "
        "that would go beyond is answered 429 with Retry-After before it is read. With the queue size this bounds "
        "the gateway's memory whatever callers send.",
    )
    refused_body_drain_s: float = Field(
        default=5.0,
        gt=0,
        le=60,
        description="Seconds the gateway goes on reading (and dropping) the body of a request it refused before "
        "reading all of it, so the caller, still sending, reads the answer instead of a connection reset; then "
        "it closes the connection anyway. At most the route's body limit is read this way (nginx's lingering "
        "close; its lingering_timeout is 5 s).",
    )


def _default_classes() -> dict[str, TrafficClassConfig]:
    return {
        "interactive": TrafficClassConfig(role="interactive", priority=0),
        # Between chat and captions: an alert decision is more urgent than a caption, less than a person typing.
        "alert": TrafficClassConfig(role="alert", priority=5, deadline_s=20.0),
        "background": TrafficClassConfig(role="background", priority=10),
    }


class ProcessConfig(StrictModel):
    """How the gateway process is scheduled on its host."""

    realtime_priority: int | None = Field(
        default=None,
        ge=1,
        le=49,
        description="SCHED_FIFO priority of the gateway's event loop (1-49: above every ordinarily scheduled "
        "process, below the kernel's interrupt threads at 50), for hosts where vLLM keeps the gateway's cores busy; "
        "needs CAP_SYS_NICE (or RLIMIT_RTPRIO), else the gateway refuses to start. Unset: ordinary scheduling, "
        "right where the gateway has a core to itself.",
    )


class GatewayConfig(StrictModel):
    """Everything `visioncap gateway` needs."""

    upstreams: list[UpstreamConfig] = Field(
        min_length=1,
        description="The vLLM servers (replicas of one model) behind the gateway, each with its own admission "
        "control; a single server is a list of one.",
    )
    classes: dict[str, TrafficClassConfig] = Field(
        default_factory=_default_classes,
        min_length=1,
        description="Traffic classes by name; default `interactive` (priority 0) and `background` (priority 10).",
    )
    keys: list[ApiKeyConfig] = Field(min_length=1, description="Caller keys; requests with any other key get 401.")
    objectives: ObjectivesConfig = Field(
        default_factory=ObjectivesConfig, description="Latency objectives of interactive traffic."
    )
    background: BackgroundConfig = Field(default_factory=BackgroundConfig, description="Background caps and queue.")
    pacing: PacingConfig = Field(
        default_factory=PacingConfig, description="How background starts are spread while chat is active."
    )
    controller: ControllerConfig = Field(
        default_factory=ControllerConfig, description="How the background caps adapt to interactive latency."
    )
    images: ImagesConfig = Field(default_factory=ImagesConfig, description="Image token estimates and URL policy.")
    limits: LimitsConfig = Field(default_factory=LimitsConfig, description="Body size limits and refused bodies.")
    process: ProcessConfig = Field(
        default_factory=ProcessConfig, description="How the gateway process is scheduled on its host."
    )

    @model_validator(mode="after")
    def _upstreams_named_once(self) -> GatewayConfig:
        seen: set[str] = set()
        for index, upstream in enumerate(self.upstreams):
            if upstream.name in seen:
                raise ValueError(f"upstreams.{index}.name: {upstream.name!r} is used by more than one upstream")
            seen.add(upstream.name)
        return self

    @model_validator(mode="after")
    def _keys_consistent(self) -> GatewayConfig:
        upstreams = {upstream.name for upstream in self.upstreams}
        names: set[str] = set()
        hashes: set[str] = set()
        for index, key in enumerate(self.keys):
            if key.traffic_class not in self.classes:
                raise ValueError(
                    f"keys.{index}.traffic_class: {key.traffic_class!r} is not a class (classes: "
                    f"{', '.join(sorted(self.classes))})"
                )
            if key.upstream is not None:
                if key.upstream not in upstreams:
                    raise ValueError(
                        f"keys.{index}.upstream: {key.upstream!r} is not an upstream (upstreams: "
                        f"{', '.join(sorted(upstreams))})"
                    )
                if self.classes[key.traffic_class].role == "interactive":
                    raise ValueError(
                        f"keys.{index}.upstream: only background and alert keys have an upstream (chat goes to the "
                        "replica with the best predicted time to first token)"
                    )
            if key.name in names:
                raise ValueError(f"keys.{index}.name: {key.name!r} is used by more than one key")
            if key.sha256 in hashes:
                raise ValueError(f"keys.{index}.sha256: the same key is configured twice")
            names.add(key.name)
            hashes.add(key.sha256)
        return self


def load_gateway_config(path: Path) -> GatewayConfig:
    """Parse and validate a gateway file; every problem becomes one ConfigError line naming file and field."""
    return load_yaml_model(path, GatewayConfig, "gateway file")
