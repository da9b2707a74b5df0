"""What `visioncap tune` writes into a model profile: the chosen values and how they were chosen."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from visioncap.config.base import StrictModel


class TunedMeasurement(StrictModel):
    """One candidate as measured under the mixed workload (chat + camera flood) on its own vLLM start."""

    max_num_batched_tokens: int = Field(description="The candidate's token budget per engine step.")
    long_prefill_token_threshold: int | None = Field(
        default=None, description="The candidate's cap on one prompt's chunk per step (None: vLLM's default)."
    )
    ttft_p50_ms: float | None = Field(description="Chat time to first token, median (ms).")
    ttft_p99_ms: float | None = Field(description="Chat time to first token, 99th percentile (ms).")
    # Inter-token latency as visioncap.gateway.sse defines it: per token, chunks read together share their gap.
    itl_p50_ms: float | None = Field(description="Chat inter-token latency, median (ms).")
    itl_p99_ms: float | None = Field(description="Chat inter-token latency, 99th percentile (ms).")
    itl_p99_interval_ms: list[float] | None = Field(
        default=None,
        description="95 % bootstrap interval of itl_p99_ms, resampling whole chats (visioncap.bench.common.stats); "
        "candidates whose intervals overlap the best one's are tied, and the tie goes to the cost model.",
    )
    captions_per_s: float | None = Field(description="Captions completed per second in the measured window.")
    chat_requests: int = Field(description="Chat requests answered with at least one token in the phase.")
    meets_objectives: bool = Field(description="Both p99 objectives met and the phase measured without failures.")
    served_max_num_batched_tokens: int | None = Field(
        default=None,
        description="Measured on a stand-in: the budget it served, in its own tokens (the target's times the "
        "stand-in's token_scale); None: measured on the profile itself.",
    )
    estimate: dict[str, float | int | None] | None = Field(
        default=None,
        description="The cost model's figures for this budget on the target GPU class (visioncap.serve.costmodel), "
        "beside the CPU measurement: decode_step_ms (typical batch), step_with_frame_ms (that step running one "
        "frame's encoder and first prefill chunk too), stall_steps (their ratio), frames_encoded_per_step, "
        "worst_step_ms (a step with that many frames), frame_prefill_steps.",
    )


class TunedObjectives(StrictModel):
    """The chat latency objectives a candidate had to meet, and where each came from."""

    ttft_p99_ms: float = Field(description="Chat TTFT p99 objective (ms).")
    itl_p99_ms: float = Field(description="Chat inter-token p99 objective (ms).")
    ttft_source: str = Field(description="`given` (--ttft-p99-ms) or how the default was derived.")
    itl_source: str = Field(description="`given` (--itl-p99-ms) or how the default was derived.")


class TunedRecord(StrictModel):
    """Provenance of a profile's tuned serving values for one GPU class (written by `visioncap tune`)."""

    date: datetime = Field(description="When the tuning run finished (UTC).")
    hardware: str = Field(description="The machine measured on: GPU name(s) from nvidia-smi, or the CPU model.")
    max_num_batched_tokens: int = Field(description="The chosen budget, also written to the serving values.")
    long_prefill_token_threshold: int | None = Field(
        default=None, description="The chosen threshold (None: not tuned)."
    )
    objectives_met: bool = Field(
        description="False when no candidate met the objectives and the lowest inter-token p99 was taken instead."
    )
    objectives: TunedObjectives = Field(description="The objectives the choice was made against.")
    workload: str = Field(description="The mixed workload in one line (chat rate, flood, image size, duration).")
    measured_on: str | None = Field(
        default=None,
        description="The CPU stand-in measured for this GPU class, its token scale and its fidelity when measured; "
        "None: the profile itself was served.",
    )
    candidates: list[TunedMeasurement] = Field(description="Every candidate measured, in the order run.")
