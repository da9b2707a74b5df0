"""Model profiles: which model vLLM serves and with which arguments (YAML files in models/).

A profile names the model and what visioncap needs to know about it (pixels per image token, the default image
size, chat template quirks, a memory estimate), plus the vLLM serving arguments: `serving` holds the defaults,
`gpus.<class>` what differs on one GPU class (cpu, l4, a10, a100, h100, h200). The tuner (`visioncap tune`)
writes the chunked-prefill budget it measured best into `gpus.<class>` (max_num_batched_tokens,
long_prefill_token_threshold), so a tuned value overrides the default for that class only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from visioncap.config.base import StrictModel
from visioncap.config.loading import load_yaml_model
from visioncap.config.tuned import TunedRecord
from visioncap.errors import ConfigError

GpuClass = Literal["cpu", "l4", "a10", "a100", "h100", "h200"]
GPU_CLASSES: tuple[str, ...] = ("cpu", "l4", "a10", "a100", "h100", "h200")


class BuildSpec(StrictModel):
    """How to make a model that is built locally rather than downloaded."""

    script: Path = Field(
        description="Builder script, run with the server environment's Python; relative to the profile."
    )
    args: list[str] = Field(default_factory=list, description="Arguments after the output folder.")


class ImageSpec(StrictModel):
    """How the model turns a picture into tokens; the pipeline's image budget must agree with it."""

    token_size: int | None = Field(
        default=None,
        ge=1,
        description="Side in pixels of the square one image token covers: patch size x merge size (Qwen2/2.5-VL "
        "14 x 2 = 28, Qwen3-VL 16 x 2 = 32); the pipeline's vlm.image_token_size. None for models that tile "
        "images instead (SmolVLM), where tokens do not follow the pixel count square by square.",
    )
    max_pixels: int | None = Field(
        default=None,
        ge=1,
        description="Default largest image in pixels after the processor's resize; serving arguments pass it as "
        "mm_processor_kwargs. Camera frames above it are shrunk by the server.",
    )
    min_pixels: int | None = Field(default=None, ge=1, description="Smallest image in pixels after the resize.")

    @property
    def max_tokens(self) -> int | None:
        """Image tokens of the largest image, for budgets (gateway, caption.max_image_tokens)."""
        if self.token_size is None or self.max_pixels is None:
            return None
        return self.max_pixels // (self.token_size * self.token_size)


class ChatTemplateSpec(StrictModel):
    """What is special about the model's chat template, and how vLLM is told."""

    notes: list[str] = Field(
        default_factory=list, description="Quirks a client should know (default system prompt, thinking, ...)."
    )
    template: str | None = Field(
        default=None,
        description="A chat template file or inline Jinja passed as --chat-template; None keeps the model's own.",
    )
    content_format: Literal["auto", "string", "openai"] | None = Field(
        default=None,
        description="vLLM's --chat-template-content-format: `openai` for templates that iterate typed content "
        "parts; None leaves vLLM's detection.",
    )


class MemorySpec(StrictModel):
    """Estimates for the GPU memory check; the real numbers come from vLLM's own profiling at start-up."""

    weights_gib: float = Field(gt=0, description="GPU memory of the weights (bf16: 2 bytes per parameter).")
    kv_cache_kib_per_token: float = Field(
        gt=0,
        description="KV cache per token: 2 x layers x KV heads x head size x bytes, in KiB (bf16 cache).",
    )
    overhead_gib: float = Field(
        default=2.0,
        ge=0,
        description="Activations at the largest step, the vision encoder's profiling run, CUDA graphs and the "
        "CUDA context, in GiB.",
    )


class StandInWorkload(StrictModel):
    """A CPU stand-in's workload for one target GPU class, sized and measured by `visioncap bench standin`."""

    frame_width: int = Field(
        gt=0,
        description="Camera frame width in pixels: its image tokens cost the target's "
        "vision encoder pass, in decode steps.",
    )
    frame_height: int = Field(gt=0, description="Camera frame height in pixels.")
    frame_filler_words: int = Field(
        ge=0,
        description="Words of text after the frame's image (about a token each), so that the frame prompt's "
        "prefill costs the target's in decode steps while the image is smaller than the target's.",
    )
    chat_prompt_tokens: int = Field(
        gt=0, description="The stand-in's chat prompt that costs what the target's longest chat prompt costs."
    )
    target_chat_prompt_tokens: int = Field(
        gt=0, description="That target chat prompt's length (the cost model's), to scale a range of chat prompts."
    )
    max_num_batched_tokens: int = Field(
        gt=0, description="The stand-in's chunk budget: the target's, scaled by the frame prompts' token ratio."
    )
    token_scale: float = Field(
        gt=0,
        description="The stand-in's frame prompt tokens per target frame prompt token: budgets and thresholds "
        "carry between the two by this factor (`visioncap tune --stand-in` measures in the stand-in's tokens and "
        "writes the target's).",
    )
    fidelity: dict[str, float] = Field(
        description="Measured over target, in decode steps, when sized: frame_encoder_steps, frame_prefill_steps, "
        "chat_prefill_steps (within 0.75-1.25 is faithful); `bench mixed` measures it again at every start."
    )
    measured_at: str = Field(description="When it was measured (ISO 8601) and on what: see benchmarks/fidelity.")


class StandInSpec(StrictModel):
    """What a CPU test model stands in for: `bench mixed` and `tune` size their workload from it."""

    target: str = Field(min_length=1, description="The profile stood in for (its cost model gives the targets).")
    workloads: dict[GpuClass, StandInWorkload] = Field(
        description="Per target GPU class: the workload at which this model costs what the target costs there."
    )


class ServingArgs(StrictModel):
    """vLLM serving arguments; None means 'inherit' (in `gpus`) or 'vLLM's default' (after merging)."""

    max_model_len: int | None = Field(default=None, ge=1, description="--max-model-len: longest prompt + answer.")
    max_num_batched_tokens: int | None = Field(
        default=None,
        ge=1,
        description="--max-num-batched-tokens: tokens per engine step (the chunked-prefill budget). Small keeps "
        "chat inter-token latency low beside image prompts; large buys throughput.",
    )
    long_prefill_token_threshold: int | None = Field(
        default=None,
        ge=0,
        description="--long-prefill-token-threshold: most prompt tokens one request may take in a step when "
        "others share it, so one image prompt cannot take the whole budget (0: no cap). vLLM V1 rejects "
        "max_num_partial_prefills above 1; this is the knob that works.",
    )
    max_num_seqs: int | None = Field(default=None, ge=1, description="--max-num-seqs: requests in a batch at once.")
    gpu_memory_utilization: float | Literal["auto"] | None = Field(
        default=None,
        description="--gpu-memory-utilization: a fraction (0-1] of the GPU vLLM may take, or `auto`: (total - "
        "detector reservation - headroom) / total, computed by `visioncap serve`. None for the CPU class.",
    )
    limit_mm_per_prompt: dict[str, int] | None = Field(
        default=None, description='--limit-mm-per-prompt, e.g. {"image": 1, "video": 0}: one frame per caption.'
    )
    mm_processor_kwargs: dict[str, Any] | None = Field(
        default=None,
        description='--mm-processor-kwargs for the Hugging Face processor; None derives {"max_pixels": ...} '
        "from image.max_pixels when set.",
    )
    mm_processor_cache_gb: float | None = Field(
        default=None,
        ge=0,
        description="--mm-processor-cache-gb: 0 suits camera frames, which are never sent twice.",
    )
    scheduling_policy: Literal["fcfs", "priority"] | None = Field(
        default=None, description="--scheduling-policy: `priority` lets chat (lower value) go before captions."
    )
    extra_args: list[str] | None = Field(
        default=None,
        description="Further vLLM arguments; a GPU class's list is appended after the defaults' list.",
    )

    @model_validator(mode="after")
    def _check_fraction(self) -> ServingArgs:
        value = self.gpu_memory_utilization
        if isinstance(value, float) and not 0 < value <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1] or 'auto', not {value}")
        return self

    def merged(self, override: ServingArgs | None) -> ServingArgs:
        """These defaults with every field the override sets replaced (extra_args appended)."""
        if override is None:
            return self
        values = self.model_dump()
        for name, value in override.model_dump(exclude_none=True).items():
            values[name] = [*(values.get(name) or []), *value] if name == "extra_args" else value
        return ServingArgs.model_validate(values)


# Flags the structured fields emit; vllm_args must not repeat them (two sources, one would silently win).
STRUCTURED_FLAGS: dict[str, str] = {
    "max_model_len": "--max-model-len",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "long_prefill_token_threshold": "--long-prefill-token-threshold",
    "max_num_seqs": "--max-num-seqs",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "limit_mm_per_prompt": "--limit-mm-per-prompt",
    "mm_processor_kwargs": "--mm-processor-kwargs",
    "mm_processor_cache_gb": "--mm-processor-cache-gb",
    "scheduling_policy": "--scheduling-policy",
}


def _flag_names(args: list[str]) -> set[str]:
    return {arg.split("=", 1)[0] for arg in args if arg.startswith("--")}


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


class ModelProfile(StrictModel):
    """One servable model."""

    name: str = Field(min_length=1, description="Profile name, as given to `visioncap serve --profile`.")
    served_model_name: str = Field(min_length=1, description="Name clients send as `model`.")
    model: str = Field(
        min_length=1,
        description="Hub id (e.g. Qwen/Qwen2.5-VL-7B-Instruct) or a local folder; relative folders are taken "
        "from the profile's folder.",
    )
    build: BuildSpec | None = Field(default=None, description="Builds `model` when the folder is missing.")
    image: ImageSpec = Field(default_factory=ImageSpec, description="Pixels per image token and image size.")
    chat_template: ChatTemplateSpec = Field(
        default_factory=ChatTemplateSpec, description="Chat template quirks and overrides."
    )
    memory: MemorySpec | None = Field(
        default=None, description="Memory estimate for the GPU check; None skips the check (CPU test models)."
    )
    serving: ServingArgs = Field(
        default_factory=ServingArgs, description="Serving arguments for every GPU class, unless the class overrides."
    )
    gpus: dict[GpuClass, ServingArgs] = Field(
        default_factory=dict,
        description="Per GPU class (cpu, l4, a10, a100, h100, h200): what differs from `serving`. The tuner "
        "writes its chosen max_num_batched_tokens / long_prefill_token_threshold here. Empty: `serving` applies "
        "to any class.",
    )
    vllm_args: list[str] = Field(default_factory=list, description="Further `vllm serve` arguments, for every class.")
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables for the server.")
    startup_timeout_s: float = Field(default=900.0, gt=0, description="Seconds to wait for /health.")
    stand_in: StandInSpec | None = Field(
        default=None,
        description="For a CPU test model: the target it stands in for and its workload per target GPU class "
        "(written by `visioncap bench standin --write`).",
    )
    tuned: dict[str, TunedRecord] | None = Field(
        default=None,
        description="Written by `visioncap tune`, per GPU class: when and on what the serving values were tuned, "
        "against which objectives, and every candidate's measurements.",
    )
    path: Path | None = Field(default=None, exclude=True, description="The file this profile was read from.")

    @model_validator(mode="after")
    def _check_serving(self) -> ModelProfile:
        by_class: dict[str, ServingArgs] = {str(gpu_class): args for gpu_class, args in self.gpus.items()}
        for gpu_class in by_class or ["any"]:
            resolved = self.serving.merged(by_class.get(gpu_class))
            where = f"gpus.{gpu_class}" if self.gpus else "serving"
            listed = _flag_names(self.vllm_args + (resolved.extra_args or []))
            duplicated = sorted(
                flag
                for field, flag in STRUCTURED_FLAGS.items()
                if getattr(resolved, field) is not None and flag in listed
            )
            if duplicated:
                raise ValueError(f"{where}: {', '.join(duplicated)} set both as a field and in the argument lists")
            tokens, seqs, length = resolved.max_num_batched_tokens, resolved.max_num_seqs, resolved.max_model_len
            if tokens is not None and seqs is not None and tokens < seqs:
                raise ValueError(f"{where}: max_num_batched_tokens ({tokens}) < max_num_seqs ({seqs}); vLLM refuses it")
            threshold = resolved.long_prefill_token_threshold
            if threshold is not None and length is not None and threshold > length:
                raise ValueError(f"{where}: long_prefill_token_threshold ({threshold}) > max_model_len ({length})")
            if gpu_class == "cpu" and resolved.gpu_memory_utilization is not None:
                raise ValueError("gpus.cpu: gpu_memory_utilization does not apply on the CPU (VLLM_CPU_KVCACHE_SPACE)")
        return self

    def model_location(self) -> str:
        """The model argument for vLLM: a resolved folder for local models, the hub id otherwise."""
        if self.path is None:
            return self.model
        local = (self.path.parent / self.model).resolve()
        if self.build is not None or local.exists():
            return str(local)
        return self.model

    def gpu_classes(self) -> list[str]:
        """The GPU classes this profile has serving arguments for; empty when `serving` applies to any."""
        return list(self.gpus)

    def serving_for(self, gpu_class: str) -> ServingArgs:
        """`serving` merged with the class's overrides; a ConfigError when the profile does not know the class."""
        if gpu_class not in GPU_CLASSES:
            raise ConfigError(f"unknown GPU class {gpu_class!r}; known: {', '.join(GPU_CLASSES)}")
        if not self.gpus:
            return self.serving
        if gpu_class not in self.gpus:
            raise ConfigError(
                f"profile {self.name!r} has no serving arguments for GPU class {gpu_class!r} "
                f"(it has: {', '.join(self.gpus)}); choose one of those or add gpus.{gpu_class} to it"
            )
        return self.serving.merged(self.gpus[gpu_class])

    def with_serving(self, gpu_class: str, **overrides: Any) -> ModelProfile:
        """A copy with `overrides` written into gpus.<class> (what the tuner does), dropping the same flags
        from vllm_args so the new value is the only one."""
        updated = dict(self.gpus)
        current = updated.get(gpu_class, ServingArgs())  # type: ignore[call-overload]
        updated[gpu_class] = ServingArgs.model_validate({**current.model_dump(exclude_none=True), **overrides})  # type: ignore[index]
        flags = {STRUCTURED_FLAGS[name] for name in overrides if name in STRUCTURED_FLAGS}
        kept: list[str] = []
        skip = False
        for arg in self.vllm_args:
            if skip:
                skip = False
                continue
            name = arg.split("=", 1)[0]
            if name in flags:
                skip = "=" not in arg
                continue
            kept.append(arg)
        if not self.gpus:
            # A class-agnostic profile keeps applying to every class: the override goes into `serving`.
            serving = ServingArgs.model_validate({**self.serving.model_dump(exclude_none=True), **overrides})
            return self.model_copy(update={"serving": serving, "vllm_args": kept})
        return self.model_copy(update={"gpus": updated, "vllm_args": kept})

    def command_args(self, gpu_class: str, gpu_memory_utilization: float | None = None) -> list[str]:
        """The vLLM arguments after the model and address for one GPU class.

        `gpu_memory_utilization` is the computed value for profiles that say `auto` (see visioncap.serve.plan).
        """
        resolved = self.serving_for(gpu_class)
        args: list[str] = []
        for field in ("max_model_len", "max_num_batched_tokens", "long_prefill_token_threshold", "max_num_seqs"):
            value = getattr(resolved, field)
            if value is not None:
                args += [STRUCTURED_FLAGS[field], str(value)]
        utilization = resolved.gpu_memory_utilization
        if utilization == "auto":
            if gpu_memory_utilization is None:
                raise ConfigError(
                    f"profile {self.name!r} computes gpu_memory_utilization for {gpu_class}: the GPU's memory is "
                    "needed (visioncap.serve.plan.plan_serving)"
                )
            utilization = gpu_memory_utilization
        if utilization is not None:
            args += ["--gpu-memory-utilization", f"{utilization:.2f}"]
        if resolved.scheduling_policy is not None:
            args += ["--scheduling-policy", resolved.scheduling_policy]
        if resolved.limit_mm_per_prompt is not None:
            args += ["--limit-mm-per-prompt", json.dumps(resolved.limit_mm_per_prompt)]
        kwargs = resolved.mm_processor_kwargs
        if kwargs is None and self.image.max_pixels is not None:
            kwargs = {"max_pixels": self.image.max_pixels}
            if self.image.min_pixels is not None:
                kwargs = {"min_pixels": self.image.min_pixels, **kwargs}
        if kwargs is not None:
            args += ["--mm-processor-kwargs", json.dumps(kwargs)]
        if resolved.mm_processor_cache_gb is not None:
            args += ["--mm-processor-cache-gb", _number(resolved.mm_processor_cache_gb)]
        if self.chat_template.template is not None:
            args += ["--chat-template", self.chat_template.template]
        if self.chat_template.content_format is not None:
            args += ["--chat-template-content-format", self.chat_template.content_format]
        return [*args, *(resolved.extra_args or []), *self.vllm_args]


def find_profile(name_or_path: str, models_dir: Path) -> Path:
    candidate = Path(name_or_path)
    if candidate.suffix in {".yaml", ".yml"} and candidate.is_file():
        return candidate
    named = models_dir / f"{name_or_path}.yaml"
    if named.is_file():
        return named
    known = sorted(p.stem for p in models_dir.glob("*.yaml")) if models_dir.is_dir() else []
    raise ConfigError(f"profile {name_or_path!r} not found in {models_dir} (known profiles: {known})")


def load_profile(name_or_path: str, models_dir: Path) -> ModelProfile:
    path = find_profile(name_or_path, models_dir)
    profile = load_yaml_model(path, ModelProfile, "model profile")
    return profile.model_copy(update={"path": path.resolve()})
