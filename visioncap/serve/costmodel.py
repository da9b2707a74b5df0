"""A roofline cost model of a vision-language model served by vLLM: what one engine step, one frame and one chat
prompt cost on a GPU class, in milliseconds and in decode steps.

The scheduler and a chat user feel dimensionless things: how many decode steps a frame's vision-encoder pass
or its prefill is worth, and how many image tokens fit in one step's budget. This module estimates them per
model profile and GPU class from parameter counts, FLOPs, bytes moved, peak throughput and efficiency factors.
Each figure is a floor made realistic by one efficiency factor; real runs should be compared with it, not the
other way round. Pure computation: the only I/O is reading a local model's config.json when the profile has one.

Formulas (bf16 weights and KV cache, 2 bytes a value; P_body = transformer-layer parameters of the language
model, P_head = vocabulary x hidden, L layers, H_q query heads, d head dim, C context tokens, B batch size):

- decode step(B, C) = max(bytes / (bandwidth x eta_dec), flops / (peak x eta_pre)) + t_step, where
  bytes = 2 (P_body + P_head) + B x C x kv_bytes_per_token, kv_bytes_per_token = 2 x L x H_kv x d x 2, and
  flops = B x (2 (P_body + P_head) + 4 L H_q d C). Embedding rows are looked up, not read whole, so the input
  embedding is left out; the output projection is read whole every step (tied or not).
- prefill of n tokens after C cached = [2 P_body n + 2 P_head + 4 L H_q d (n C + n (n + 1) / 2)] / (peak x
  eta_pre): logits are computed for the sampled position only, attention is causal. This is the marginal cost a
  prefill chunk adds to a step (compute-bound), the figure the scheduler trades against decode steps.
- vision encoder per image = [2 (P_patch_embed + depth x P_block) x patches + 2 P_merger x tokens + attention] /
  (peak x eta_enc); attention = 4 x hidden x sum over attention groups of n^2 per layer, where a group is the
  whole image (full attention), a window of 112 x 112 pixels (Qwen2.5-VL's window layers; 4 of its 32 layers are
  full) or a 384 x 384 tile (SigLIP/Idefics3 tiles). One language token covers merge^2 patches (2 x 2 for Qwen).
- derived: a frame's encoder pass and its prefill (image tokens + the caption prompt's text) in decode steps at
  batch 1 and at a typical batch (8); a chat prompt's prefill in decode steps; tokens per step from the profile's
  max_num_batched_tokens; frames whose encoder passes fit one step: vLLM 0.32's encoder compute budget is
  max(max_num_batched_tokens, the largest image's tokens) and a frame's pass is never split across steps.

Efficiencies (sources: the repository's docs/gpu-reference.md for the spec sheet and the H200 measurements):
- achieved matmul fraction of peak: 0.80 measured on an H200 (8192^3 bf16 product, 788 of 989 TFLOP/s);
  achieved copy fraction of bandwidth: 0.90 measured on an H200 (4.3 of 4.8 TB/s). Other GPUs: the same
  fractions, assumed (not measured here).
- decode reaches 0.9 of a streaming copy (GEMV and paged-attention reads): assumption, checked against a
  published A100 run (Llama-3.1-8B at batch 1 at ~77 % of the bandwidth roofline, see PUBLISHED).
- prefill reaches 0.75 of a large matmul (norms, rotary, activations, attention kernels between the GEMMs):
  assumption, giving ~60 % of peak, in line with the ~50-65 % MFU usually reported for 7-8B prefill.
- the vision encoder reaches 0.55 of a large matmul (1-2 thousand-row GEMMs of width 1280, many small kernels,
  64-patch windows; no encoder CUDA graphs by default in vLLM 0.32): assumption, ~44 % of peak.
- checked on an H200 on 2026-12-04 with PyTorch kernels (benchmarks/results/gpu_h200_costmodel.md, two runs):
  prefill 0.75 holds from 2k-token chunks (0.66-0.73 at 512); decode reached 0.69 of the copy (its weight GEMVs
  alone 0.85; vLLM's fused kernels lie between); the whole encoder 0.34 (one frame, 7.9 ms against 4.8 modelled)
  to 0.42 (six in one pass). Not changed yet: the gateway's pacing default and the stand-in's generated sizing
  derive from these and move in the same change (proposed: encoder 0.35, decode 0.80).
- t_step = 1.5 ms per engine step (scheduling, input preparation, sampling, structured-output masks, graph
  launch): assumption, checked against vLLM's published H200 latency benchmark (see PUBLISHED).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from visioncap.qwen_images import smart_resize
from visioncap.serve.ceiling import ceiling

if TYPE_CHECKING:
    from visioncap.config.profiles import ModelProfile

BYTES_PER_VALUE = 2  # bf16 weights and KV cache
REFERENCE = "docs/gpu-reference.md"  # in the repository: the spec sheet and the H200 measurements


@dataclass(frozen=True)
class GpuSpec:
    """One GPU's spec-sheet figures (dense bf16, no sparsity) and how much of them real kernels reach."""

    name: str
    peak_bf16_tflops: float  # dense tensor-core peak, TFLOP/s
    bandwidth_tb_s: float  # memory bandwidth, TB/s
    memory_gb: float
    matmul_efficiency: float = 0.80  # large bf16 GEMM / peak; measured 788/989 on an H200
    copy_efficiency: float = 0.90  # device-to-device copy / bandwidth; measured 4.3/4.8 on an H200
    efficiencies_measured: bool = False  # False: the H200's fractions carried over, an assumption
    source: str = REFERENCE

    @property
    def peak_flops(self) -> float:
        return self.peak_bf16_tflops * 1e12

    @property
    def bandwidth_bytes_s(self) -> float:
        return self.bandwidth_tb_s * 1e12


GPU_SPECS: dict[str, GpuSpec] = {
    "h200": GpuSpec("H200 SXM", 989, 4.8, 141, 788 / 989, 4.3 / 4.8, efficiencies_measured=True),
    "h100": GpuSpec("H100 SXM", 989, 3.35, 80),
    "h100-pcie": GpuSpec("H100 PCIe", 756, 2.0, 80),
    "a100": GpuSpec("A100 SXM 80 GB", 312, 2.0, 80),
    "l40s": GpuSpec("L40S", 362, 0.86, 48),
    "a10": GpuSpec("A10", 125, 0.6, 24),
    "l4": GpuSpec("L4", 121, 0.3, 24),
    # Not a serving class: the card of a published measurement (PUBLISHED); NVIDIA A100 datasheet.
    "a100-40gb": GpuSpec("A100 40 GB", 312, 1.555, 40, source="NVIDIA A100 datasheet"),
    # Cards outside the serving classes, which the plan serves with derived budgets (visioncap.serve.gpu_cards).
    # GeForce cards: bf16 with fp32 accumulation, the rate a framework uses (half the fp16-accumulate one).
    "rtx3090": GpuSpec("GeForce RTX 3090", 71, 0.936, 24, source="NVIDIA Ampere GA102 GPU architecture whitepaper"),
    "rtx4090": GpuSpec("GeForce RTX 4090", 165.2, 1.008, 24, source="NVIDIA Ada GPU architecture whitepaper"),
    "rtx5090": GpuSpec("GeForce RTX 5090", 209.5, 1.792, 32, source="NVIDIA RTX Blackwell GPU architecture whitepaper"),
    "a6000": GpuSpec("RTX A6000", 154.8, 0.768, 48, source="NVIDIA RTX A6000 datasheet"),
    "a40": GpuSpec("A40", 149.7, 0.696, 48, source="NVIDIA A40 datasheet"),
    "l40": GpuSpec("L40", 181.05, 0.864, 48, source="NVIDIA L40 datasheet"),
    # Turing has no bf16: the fp16 tensor rate, which is what vLLM runs there (--dtype float16).
    "t4": GpuSpec("T4", 65, 0.32, 16, source="NVIDIA T4 datasheet (fp16; no bf16 on Turing)"),
    "jetson-agx-orin": GpuSpec(
        "Jetson AGX Orin 64 GB", 42.5, 0.2048, 64, source="NVIDIA Jetson AGX Orin series datasheet (GPU only)"
    ),
    "b200": GpuSpec("B200 (HGX)", 2250, 7.7, 180, source="NVIDIA HGX B200 datasheet"),
}

# The GPU classes of visioncap.config.profiles; the cpu class has no roofline here (bench mixed measures it).
CLASS_SPECS: dict[str, str] = {"l4": "l4", "a10": "a10", "a100": "a100", "h100": "h100", "h200": "h200"}


@dataclass(frozen=True)
class Efficiency:
    """Fractions of the GPU's achieved matmul / copy rates each phase reaches, and the fixed cost of a step."""

    decode_of_copy: float = 0.90
    prefill_of_matmul: float = 0.75
    encoder_of_matmul: float = 0.55
    step_overhead_ms: float = 1.5


@dataclass(frozen=True)
class TextShape:
    """The language model's shape, as config.json's text part gives it."""

    layers: int
    hidden: int
    intermediate: int
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool
    qkv_bias: bool = True  # Qwen2/2.5 yes, Qwen3 and Llama no
    qk_norm: bool = False  # Qwen3: RMSNorm over each head's q and k

    @property
    def layer_params(self) -> int:
        h, q, kv = self.hidden, self.q_heads * self.head_dim, self.kv_heads * self.head_dim
        attention = h * (q + 2 * kv) + q * h + (q + 2 * kv if self.qkv_bias else 0)
        mlp = 3 * h * self.intermediate  # SwiGLU: gate, up, down
        norms = 2 * h + (2 * self.head_dim if self.qk_norm else 0)
        return attention + mlp + norms

    @property
    def body_params(self) -> int:
        """Transformer layers and the final norm: what every token multiplies through."""
        return self.layers * self.layer_params + self.hidden

    @property
    def head_params(self) -> int:
        """The output projection (vocabulary x hidden), shared with the input embedding when tied."""
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        embeddings = self.head_params if self.tied_embeddings else 2 * self.head_params
        return self.body_params + embeddings

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * BYTES_PER_VALUE

    @property
    def attention_flops_per_pair(self) -> int:
        """FLOPs of one query token attending to one cached token, all layers (QK^T and AV)."""
        return 4 * self.layers * self.q_heads * self.head_dim


VisionLayout = Literal["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "siglip_tiles"]


@dataclass(frozen=True)
class VisionShape:
    """The vision encoder's shape and how it lays an image out in patches and attention groups."""

    layout: VisionLayout
    depth: int
    hidden: int
    intermediate: int
    heads: int
    patch_size: int
    merge_size: int  # patches per language token along a side (Qwen 2; SigLIP tiles: pixel-shuffle scale 3)
    out_hidden: int  # the language model's hidden size
    temporal_patch_size: int = 2  # Qwen: a still image is two identical frames folded into each patch
    full_attention_layers: int | None = None  # None: every layer attends over the whole image (or tile)
    window_size: int = 112  # pixels; Qwen2.5-VL's window layers
    deepstack_mergers: int = 0  # Qwen3-VL: extra mergers feeding intermediate layers into the LM
    position_embeddings: int = 0  # learnt position table rows (Qwen3-VL, SigLIP): parameters, not FLOPs
    tile_size: int = 384  # SigLIP tiles
    default_min_pixels: int = 56 * 56
    default_max_pixels: int = 28 * 28 * 1280
    default_longest_edge: int = 1536  # SigLIP tiles: the processor's resize before tiling

    @property
    def patch_embed_params(self) -> int:
        pixels = (
            3 * self.patch_size * self.patch_size * (1 if self.layout == "siglip_tiles" else self.temporal_patch_size)
        )
        bias = self.hidden if self.layout in ("qwen3_vl", "siglip_tiles") else 0
        return pixels * self.hidden + bias

    @property
    def block_params(self) -> int:
        h, i = self.hidden, self.intermediate
        norms = 2 * h if self.layout == "qwen2_5_vl" else 4 * h  # RMSNorm weight vs LayerNorm weight + bias
        attention = 4 * h * h + 4 * h  # q, k, v, out with biases
        mlp = 3 * h * i + 2 * i + h if self.layout == "qwen2_5_vl" else 2 * h * i + i + h  # gated vs plain
        return norms + attention + mlp

    @property
    def merged_width(self) -> int:
        return self.hidden * self.merge_size * self.merge_size

    @property
    def merger_params(self) -> int:
        """Patch merger(s) / connector: applied once per language token."""
        m = self.merged_width
        if self.layout == "siglip_tiles":
            return m * self.out_hidden  # Idefics3 connector: one bias-free projection
        norm = self.hidden if self.layout == "qwen2_5_vl" else 2 * self.hidden
        mlp = m * m + m + m * self.out_hidden + self.out_hidden
        deepstack = self.deepstack_mergers * (2 * m + mlp)  # their norm is over the merged width
        return norm + mlp + deepstack

    @property
    def params(self) -> int:
        final_norm = 2 * self.hidden if self.layout == "siglip_tiles" else 0
        table = self.position_embeddings * self.hidden
        return self.patch_embed_params + table + self.depth * self.block_params + final_norm + self.merger_params

    @property
    def patch_linear_params(self) -> int:
        """Parameters every patch multiplies through (embedding and blocks)."""
        return self.patch_embed_params + self.depth * self.block_params


@dataclass(frozen=True)
class ModelShape:
    """A served model: language model, vision encoder, and where the shape was read."""

    name: str
    text: TextShape
    vision: VisionShape | None
    source: str

    @property
    def params(self) -> int:
        return self.text.params + (self.vision.params if self.vision else 0)


def _qwen25_vision(out_hidden: int) -> VisionShape:
    """Qwen2.5-VL's encoder (every size has the same one): 32 layers of 1280, 4 with full attention."""
    return VisionShape(
        "qwen2_5_vl", 32, 1280, 3420, 16, 14, 2, out_hidden, full_attention_layers=4, default_max_pixels=12845056
    )


def _qwen3_vision(depth: int, hidden: int, intermediate: int, out_hidden: int) -> VisionShape:
    """Qwen3-VL's encoder: 16-pixel patches, full attention, 3 deepstack mergers, a learnt position table."""
    return VisionShape(
        "qwen3_vl",
        depth,
        hidden,
        intermediate,
        16,
        16,
        2,
        out_hidden,
        deepstack_mergers=3,
        position_embeddings=2304,
        default_min_pixels=65536,
        default_max_pixels=16777216,
    )


# Published configurations (Hugging Face config.json of each model), keyed by the profiles' `model`.
BUILTIN_SHAPES: dict[str, ModelShape] = {
    "Qwen/Qwen2.5-VL-7B-Instruct": ModelShape(
        "Qwen2.5-VL-7B",
        TextShape(28, 3584, 18944, 28, 4, 128, 152064, tied_embeddings=False),
        _qwen25_vision(3584),
        "built-in table (Qwen/Qwen2.5-VL-7B-Instruct config.json)",
    ),
    "Qwen/Qwen2.5-VL-3B-Instruct": ModelShape(
        "Qwen2.5-VL-3B",
        TextShape(36, 2048, 11008, 16, 2, 128, 151936, tied_embeddings=True),
        _qwen25_vision(2048),
        "built-in table (Qwen/Qwen2.5-VL-3B-Instruct config.json)",
    ),
    "Qwen/Qwen3-VL-4B-Instruct": ModelShape(
        "Qwen3-VL-4B",
        TextShape(36, 2560, 9728, 32, 8, 128, 151936, tied_embeddings=True, qkv_bias=False, qk_norm=True),
        _qwen3_vision(24, 1024, 4096, 2560),
        "built-in table (Qwen/Qwen3-VL-4B-Instruct config.json)",
    ),
    "Qwen/Qwen3-VL-8B-Instruct": ModelShape(
        "Qwen3-VL-8B",
        TextShape(36, 4096, 12288, 32, 8, 128, 151936, tied_embeddings=False, qkv_bias=False, qk_norm=True),
        _qwen3_vision(27, 1152, 4304, 4096),
        "built-in table (Qwen/Qwen3-VL-8B-Instruct config.json)",
    ),
    "HuggingFaceTB/SmolVLM2-2.2B-Instruct": ModelShape(
        "SmolVLM2-2.2B",
        TextShape(24, 2048, 8192, 32, 32, 64, 49280, tied_embeddings=False, qkv_bias=False),
        VisionShape("siglip_tiles", 27, 1152, 4304, 16, 14, 3, 2048, position_embeddings=729),
        "built-in table (HuggingFaceTB/SmolVLM2-2.2B-Instruct config.json)",
    ),
    # Text-only, for the published decode comparisons (PUBLISHED).
    "meta-llama/Llama-3.1-8B-Instruct": ModelShape(
        "Llama-3.1-8B",
        TextShape(32, 4096, 14336, 32, 8, 128, 128256, tied_embeddings=False, qkv_bias=False),
        None,
        "built-in table (meta-llama/Llama-3.1-8B-Instruct config.json)",
    ),
}

# Published parameter counts the shapes must reproduce (model cards; GPU-REFERENCE.md for Qwen2.5-VL-7B).
PUBLISHED_PARAMS: dict[str, tuple[float, float | None]] = {
    "Qwen/Qwen2.5-VL-7B-Instruct": (7.6e9, 0.67e9),  # language model with embeddings, vision encoder
}


def _shape_from_config(config: dict[str, Any], source: str) -> ModelShape:
    """A Qwen2-VL / Qwen2.5-VL / Qwen3-VL shape from a config.json's contents."""
    model_type = config.get("model_type")
    if model_type not in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl"):
        raise ValueError(f"no shape reader for model_type {model_type!r} (Qwen2-VL, Qwen2.5-VL, Qwen3-VL only)")
    text, vision = _text_from_config(config, model_type), _vision_from_config(config["vision_config"], model_type)
    name = str((config.get("architectures") or [model_type])[0])
    return ModelShape(name, text, vision, source)


def _text_from_config(config: dict[str, Any], model_type: str) -> TextShape:
    text_config = config.get("text_config") or config  # Qwen2.5-VL keeps the text fields at the top level
    heads = int(text_config["num_attention_heads"])
    hidden = int(text_config["hidden_size"])
    qwen3 = model_type == "qwen3_vl"
    return TextShape(
        layers=int(text_config["num_hidden_layers"]),
        hidden=hidden,
        intermediate=int(text_config["intermediate_size"]),
        q_heads=heads,
        kv_heads=int(text_config.get("num_key_value_heads", heads)),
        head_dim=int(text_config.get("head_dim") or hidden // heads),
        vocab=int(text_config["vocab_size"]),
        tied_embeddings=bool(config.get("tie_word_embeddings", text_config.get("tie_word_embeddings", False))),
        qkv_bias=not qwen3,
        qk_norm=qwen3,
    )


def _vision_from_config(v: dict[str, Any], model_type: str) -> VisionShape:
    common = {
        "depth": int(v["depth"]),
        "heads": int(v["num_heads"]),
        "patch_size": int(v.get("patch_size", 14)),
        "merge_size": int(v.get("spatial_merge_size", 2)),
        "temporal_patch_size": int(v.get("temporal_patch_size", 2)),
    }
    if model_type == "qwen2_vl":
        embed = int(v["embed_dim"])
        return VisionShape(
            "qwen2_vl",
            hidden=embed,
            intermediate=int(embed * v.get("mlp_ratio", 4)),
            out_hidden=int(v["hidden_size"]),
            **common,
        )
    if model_type == "qwen2_5_vl":
        return VisionShape(
            "qwen2_5_vl",
            hidden=int(v["hidden_size"]),
            intermediate=int(v["intermediate_size"]),
            out_hidden=int(v["out_hidden_size"]),
            full_attention_layers=len(v.get("fullatt_block_indexes", [])),
            window_size=int(v.get("window_size", 112)),
            default_max_pixels=12845056,
            **common,
        )
    return VisionShape(
        "qwen3_vl",
        hidden=int(v["hidden_size"]),
        intermediate=int(v["intermediate_size"]),
        out_hidden=int(v["out_hidden_size"]),
        deepstack_mergers=len(v.get("deepstack_visual_indexes", [])),
        position_embeddings=int(v.get("num_position_embeddings", 0)),
        default_min_pixels=65536,
        default_max_pixels=16777216,
        **common,
    )


def read_shape(config_path: Path) -> ModelShape:
    """The shape in a local model's config.json (the one I/O of this module)."""
    return _shape_from_config(json.loads(config_path.read_text(encoding="utf-8")), f"config.json ({config_path})")


def shape_for(profile: ModelProfile) -> ModelShape:
    """The profile's model shape: its local config.json when there is one, else the built-in table."""
    local = Path(profile.model_location()) / "config.json"
    if local.is_file():
        return read_shape(local)
    for key in (profile.model, profile.name):
        if key in BUILTIN_SHAPES:
            return BUILTIN_SHAPES[key]
    hint = " (build the model first: it is built on the first `visioncap serve`)" if profile.build else ""
    raise LookupError(f"no shape for {profile.model!r}: no local config.json and not in the built-in table{hint}")


# --- image geometry -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageLayout:
    """One image as the encoder sees it."""

    width: int
    height: int
    resized_width: int
    resized_height: int
    patches: int
    tokens: int
    attention_pairs_full: int  # sum of n^2 over the attention groups of a full-attention layer
    attention_pairs_window: int  # the same for a window layer (Qwen2.5-VL); equals the full figure otherwise


def _window_pairs(grid_h: int, grid_w: int, merge: int, window_tokens: int) -> int:
    """Sum of n^2 over Qwen2.5-VL's windows: window_tokens x window_tokens merged tokens, edges cut short."""
    rows, cols = grid_h // merge, grid_w // merge
    total = 0
    for top in range(0, rows, window_tokens):
        for left in range(0, cols, window_tokens):
            n = min(window_tokens, rows - top) * min(window_tokens, cols - left) * merge * merge
            total += n * n
    return total


def image_layout(
    vision: VisionShape, width: int, height: int, max_pixels: int | None = None, longest_edge: int | None = None
) -> ImageLayout:
    """Patches, language tokens and attention groups of a width x height image after the processor's resize."""
    if vision.layout == "siglip_tiles":
        edge = longest_edge or vision.default_longest_edge
        scale = edge / max(width, height)
        rw, rh = round(width * scale), round(height * scale)
        tiles = math.ceil(rw / vision.tile_size) * math.ceil(rh / vision.tile_size)
        tiles += 1 if tiles > 1 else 0  # the global view beside the tiles
        per_tile = (vision.tile_size // vision.patch_size) ** 2
        pairs = tiles * per_tile * per_tile
        tokens = tiles * per_tile // (vision.merge_size * vision.merge_size)
        return ImageLayout(width, height, rw, rh, tiles * per_tile, tokens, pairs, pairs)
    factor = vision.patch_size * vision.merge_size
    rh, rw = smart_resize(height, width, factor, vision.default_min_pixels, max_pixels or vision.default_max_pixels)
    grid_h, grid_w = rh // vision.patch_size, rw // vision.patch_size
    patches = grid_h * grid_w
    full = patches * patches
    window = full
    if vision.layout == "qwen2_5_vl":
        window = _window_pairs(grid_h, grid_w, vision.merge_size, vision.window_size // factor)
    return ImageLayout(width, height, rw, rh, patches, patches // (vision.merge_size**2), full, window)


# --- the roofline -------------------------------------------------------------------------------------------


def step_ms(
    text: TextShape, gpu: GpuSpec, batch: int, context: int, prefill_tokens: int = 0, eff: Efficiency = Efficiency()
) -> float:
    """One engine step: `batch` sequences decoding with `context` cached tokens each, plus a prefill chunk of
    `prefill_tokens` new tokens; weights are read once for both, FLOPs add up."""
    weight_bytes = (text.body_params + text.head_params) * BYTES_PER_VALUE
    kv_bytes = batch * context * text.kv_bytes_per_token
    memory_s = (weight_bytes + kv_bytes) / (gpu.bandwidth_bytes_s * gpu.copy_efficiency * eff.decode_of_copy)
    flops: float = batch * (2 * (text.body_params + text.head_params) + text.attention_flops_per_pair * context)
    if prefill_tokens:
        flops += prefill_flops(text, prefill_tokens)
    compute_s = flops / (gpu.peak_flops * gpu.matmul_efficiency * eff.prefill_of_matmul)
    return max(memory_s, compute_s) * 1e3 + eff.step_overhead_ms


def decode_step_ms(text: TextShape, gpu: GpuSpec, batch: int, context: int, eff: Efficiency = Efficiency()) -> float:
    """One decode step of `batch` sequences of `context` cached tokens each."""
    return step_ms(text, gpu, batch, context, 0, eff)


def prefill_flops(text: TextShape, tokens: int, context: int = 0) -> float:
    """FLOPs of prefilling `tokens` new tokens after `context` cached ones, logits for the last one only."""
    pairs = tokens * context + tokens * (tokens + 1) / 2
    return 2 * text.body_params * tokens + 2 * text.head_params + text.attention_flops_per_pair * pairs


def prefill_ms(text: TextShape, gpu: GpuSpec, tokens: int, context: int = 0, eff: Efficiency = Efficiency()) -> float:
    """Compute time of a prefill chunk: what it adds to the step that carries it."""
    achieved = gpu.peak_flops * gpu.matmul_efficiency * eff.prefill_of_matmul
    return prefill_flops(text, tokens, context) / achieved * 1e3


def encoder_flops(vision: VisionShape, layout: ImageLayout) -> float:
    """FLOPs of one image's vision-encoder pass."""
    linear = 2 * vision.patch_linear_params * layout.patches + 2 * vision.merger_params * layout.tokens
    full_layers = vision.depth if vision.full_attention_layers is None else vision.full_attention_layers
    window_layers = vision.depth - full_layers
    attention = (
        4 * vision.hidden * (full_layers * layout.attention_pairs_full + window_layers * layout.attention_pairs_window)
    )
    return linear + attention


def encoder_ms(vision: VisionShape, gpu: GpuSpec, layout: ImageLayout, eff: Efficiency = Efficiency()) -> float:
    achieved = gpu.peak_flops * gpu.matmul_efficiency * eff.encoder_of_matmul
    return encoder_flops(vision, layout) / achieved * 1e3


@dataclass(frozen=True)
class EventCost:
    """An event described from several frames sent as the images of one request (each already shrunk to its
    share of the event's budget): what the model spends on it."""

    frames: int
    image_tokens: int
    encoder_ms: float  # every frame's encoder pass, summed
    largest_pass_ms: float  # the longest single pass: what one engine step cannot split
    prefill_ms: float  # the whole prompt's prefill (every image's tokens and the text)


def event_cost(
    shape: ModelShape,
    gpu: GpuSpec,
    sizes: list[tuple[int, int]],
    text_tokens: int = 60,
    max_pixels: int | None = None,
    longest_edge: int | None = None,
    eff: Efficiency = Efficiency(),
) -> EventCost:
    """The cost of one request carrying images of these (width, height) sizes; `text_tokens`: the prompt's text,
    template and each image's markers. Several smaller frames cost one encoder pass each, each shorter than one
    large frame's, so a step that carries one stalls chat less; their prefill is their tokens, as one frame's."""
    vision = shape.vision
    if vision is None or not sizes:
        raise ValueError("an event's cost needs a vision encoder and at least one frame")
    layouts = [image_layout(vision, width, height, max_pixels, longest_edge) for width, height in sizes]
    passes = [encoder_ms(vision, gpu, layout, eff) for layout in layouts]
    tokens = sum(layout.tokens for layout in layouts)
    return EventCost(
        frames=len(sizes),
        image_tokens=tokens,
        encoder_ms=sum(passes),
        largest_pass_ms=max(passes),
        prefill_ms=prefill_ms(shape.text, gpu, tokens + text_tokens, 0, eff),
    )


# --- per profile and GPU class ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """The sizes the derived figures are for (the bench mixed / tune workload)."""

    frame_width: int = 640
    frame_height: int = 480
    frame_text_tokens: int = 60  # caption prompt around the image: template, instruction, vision markers
    chat_prompt_tokens: int = 256  # the longest chat prompt of the bench mixed workload
    context_tokens: int = 1024  # cached tokens per decoding sequence
    typical_batch: int = 8
    batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)


@dataclass(frozen=True)
class StepBudget:
    """What one engine step holds under the profile's serving arguments for the class."""

    max_num_batched_tokens: int | None
    long_prefill_token_threshold: int | None
    largest_image_tokens: int | None
    encoder_budget_tokens: int | None  # vLLM 0.32: max(max_num_batched_tokens, largest image's tokens)
    frames_encoded_per_step: int | None  # frames whose encoder passes fit one step's encoder budget
    worst_step_ms: float | None  # a typical-batch step running that many frames' encoders and their prefill
    image_tokens_per_step: int | None  # prefill tokens one frame may take in a step beside a typical batch
    frame_prefill_steps: int | None  # steps one frame's prompt takes to prefill at that rate


@dataclass(frozen=True)
class CostModel:
    """The estimate for one profile on one GPU class (milliseconds, and dimensionless ratios)."""

    profile: str
    gpu_class: str
    gpu: GpuSpec
    shape: ModelShape
    efficiency: Efficiency
    workload: Workload
    text_params: int
    vision_params: int
    weight_gb: float  # bytes read per decode step (body + output projection)
    kv_kib_per_token: float
    decode_ms: dict[int, float]  # batch size -> step time at workload.context_tokens
    prefill_ms_per_token: float  # marginal, for a frame-sized prompt
    frame: ImageLayout | None
    encoder_ms_per_frame: float | None
    encoder_ms_per_image_token: float | None
    frame_prompt_tokens: int | None
    frame_prefill_ms: float | None
    chat_prefill_ms: float
    # Dimensionless: in decode steps at batch 1 and at workload.typical_batch.
    frame_encoder_steps: tuple[float, float] | None
    frame_prefill_steps: tuple[float, float] | None
    chat_prefill_steps: tuple[float, float]
    step_with_frame_ms: float | None  # a typical-batch step that also runs one frame's encoder and prefill chunk
    budget: StepBudget
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["decode_ms"] = {str(k): v for k, v in self.decode_ms.items()}
        return data


def _flag(args: list[str], name: str) -> int | None:
    """The integer value of `name` in an argument list (--name V or --name=V), None when absent."""
    for index, arg in enumerate(args):
        if arg == name and index + 1 < len(args):
            return int(args[index + 1])
        if arg.startswith(name + "="):
            return int(arg.split("=", 1)[1])
    return None


@dataclass(frozen=True)
class _FrameCost:
    """One camera frame of the workload through the vision encoder and the language model's prefill."""

    layout: ImageLayout
    encoder_ms: float
    prompt_tokens: int  # image tokens plus the caption prompt's text
    prefill_ms: float
    largest_image_tokens: int | None  # the profile's largest image, which sizes vLLM's encoder budget


def _frame_cost(
    shape: ModelShape,
    gpu: GpuSpec,
    w: Workload,
    eff: Efficiency,
    max_pixels: int | None,
    longest_edge: int | None,
) -> _FrameCost | None:
    """The workload's frame on this model, None for a model without a vision encoder."""
    vision = shape.vision
    if vision is None:
        return None
    layout = image_layout(vision, w.frame_width, w.frame_height, max_pixels, longest_edge)
    prompt = layout.tokens + w.frame_text_tokens
    largest = None
    if vision.layout != "siglip_tiles":
        biggest = max_pixels or vision.default_max_pixels
        largest = biggest // (vision.patch_size * vision.merge_size) ** 2
    return _FrameCost(
        layout, encoder_ms(vision, gpu, layout, eff), prompt, prefill_ms(shape.text, gpu, prompt, 0, eff), largest
    )


def _step_budget(
    text: TextShape,
    gpu: GpuSpec,
    w: Workload,
    eff: Efficiency,
    budget_tokens: int | None,
    threshold: int | None,
    frame: _FrameCost | None,
) -> StepBudget:
    """What one step holds under the budget: frames encoded, image-prompt tokens beside a typical batch, and the
    worst step, the one whose encoder budget runs as many frames as fit, each prefilling after."""
    encoder_budget = frames_per_step = image_per_step = prefill_steps = worst = None
    if budget_tokens is not None:
        image_per_step = max(budget_tokens - w.typical_batch, 1)
        if threshold:
            image_per_step = min(image_per_step, threshold)
        if frame is not None:
            encoder_budget = max(budget_tokens, frame.largest_image_tokens or 0)
            # A frame is never split: at least one runs even when it exceeds the budget.
            frames_per_step = max(encoder_budget // frame.layout.tokens, 1)
            prefill_steps = math.ceil(frame.prompt_tokens / image_per_step)
            # vLLM 0.32 never splits a frame's encoder pass, so all `frames_per_step` of them land in one step.
            chunk = min(budget_tokens - w.typical_batch, frames_per_step * frame.prompt_tokens)
            worst = step_ms(text, gpu, w.typical_batch, w.context_tokens, max(chunk, 0), eff)
            worst += frames_per_step * frame.encoder_ms
    return StepBudget(
        max_num_batched_tokens=budget_tokens,
        long_prefill_token_threshold=threshold,
        largest_image_tokens=frame.largest_image_tokens if frame is not None else None,
        encoder_budget_tokens=encoder_budget,
        frames_encoded_per_step=frames_per_step,
        worst_step_ms=worst,
        image_tokens_per_step=image_per_step,
        frame_prefill_steps=prefill_steps,
    )


def estimate(
    shape: ModelShape,
    gpu: GpuSpec,
    *,
    profile: str = "",
    gpu_class: str = "",
    max_num_batched_tokens: int | None = None,
    long_prefill_token_threshold: int | None = None,
    max_pixels: int | None = None,
    longest_edge: int | None = None,
    workload: Workload = Workload(),
    efficiency: Efficiency = Efficiency(),
) -> CostModel:
    """The cost model of one model shape on one GPU, under one step budget."""
    text, w, eff = shape.text, workload, efficiency
    decode = {b: decode_step_ms(text, gpu, b, w.context_tokens, eff) for b in w.batches}
    one, typical = (
        decode_step_ms(text, gpu, 1, w.context_tokens, eff),
        decode_step_ms(text, gpu, w.typical_batch, w.context_tokens, eff),
    )
    chat = prefill_ms(text, gpu, w.chat_prompt_tokens, 0, eff)
    frame = _frame_cost(shape, gpu, w, eff, max_pixels, longest_edge)
    prompt = frame.prompt_tokens if frame is not None else w.chat_prompt_tokens
    per_token_prefill = prefill_ms(text, gpu, prompt, 0, eff) / prompt
    budget = _step_budget(text, gpu, w, eff, max_num_batched_tokens, long_prefill_token_threshold or None, frame)
    notes: list[str] = []
    if max_num_batched_tokens is None:
        notes.append("max_num_batched_tokens not set: vLLM's default applies, no step budget figures")
    with_frame = None
    if frame is not None:
        chunk = min(frame.prompt_tokens, budget.image_tokens_per_step or frame.prompt_tokens)
        # The encoder runs before the language model in the same step, so its time adds to the step's.
        with_frame = step_ms(text, gpu, w.typical_batch, w.context_tokens, chunk, eff) + frame.encoder_ms
    if not gpu.efficiencies_measured:
        notes.append(f"{gpu.name}: efficiencies carried over from the H200 measurements (assumed)")
    return CostModel(
        profile=profile or shape.name,
        gpu_class=gpu_class or gpu.name,
        gpu=gpu,
        shape=shape,
        efficiency=eff,
        workload=w,
        text_params=text.params,
        vision_params=shape.vision.params if shape.vision else 0,
        weight_gb=(text.body_params + text.head_params) * BYTES_PER_VALUE / 1e9,
        kv_kib_per_token=text.kv_bytes_per_token / 1024,
        decode_ms=decode,
        prefill_ms_per_token=per_token_prefill,
        frame=frame.layout if frame is not None else None,
        encoder_ms_per_frame=frame.encoder_ms if frame is not None else None,
        encoder_ms_per_image_token=frame.encoder_ms / frame.layout.tokens if frame is not None else None,
        frame_prompt_tokens=frame.prompt_tokens if frame is not None else None,
        frame_prefill_ms=frame.prefill_ms if frame is not None else None,
        chat_prefill_ms=chat,
        frame_encoder_steps=(frame.encoder_ms / one, frame.encoder_ms / typical) if frame is not None else None,
        frame_prefill_steps=(frame.prefill_ms / one, frame.prefill_ms / typical) if frame is not None else None,
        chat_prefill_steps=(chat / one, chat / typical),
        step_with_frame_ms=with_frame,
        budget=budget,
        notes=tuple(notes),
    )


def for_profile(
    profile: ModelProfile,
    gpu_class: str,
    workload: Workload = Workload(),
    efficiency: Efficiency = Efficiency(),
    gpu: GpuSpec | None = None,
) -> CostModel:
    """The cost model of a profile on a GPU class; LookupError when either has no figures here.

    `gpu` replaces the class's figures: a card outside the classes, served with the class's arguments (the
    serving plan's derived figures, visioncap.serve.gpu_cards)."""
    if gpu is None and gpu_class not in CLASS_SPECS:
        raise LookupError(f"no roofline for GPU class {gpu_class!r} (the CPU is measured: visioncap bench mixed)")
    shape = shape_for(profile)
    serving = profile.serving_for(gpu_class)
    listed = [*profile.vllm_args, *(serving.extra_args or [])]
    budget = serving.max_num_batched_tokens or _flag(listed, "--max-num-batched-tokens")
    threshold = serving.long_prefill_token_threshold or _flag(listed, "--long-prefill-token-threshold")
    kwargs = serving.mm_processor_kwargs or {}
    max_pixels = profile.image.max_pixels or kwargs.get("max_pixels")
    size = kwargs.get("size")
    longest_edge = size.get("longest_edge") if isinstance(size, dict) else None
    return estimate(
        shape,
        gpu or GPU_SPECS[CLASS_SPECS[gpu_class]],
        profile=profile.name,
        gpu_class=gpu_class,
        max_num_batched_tokens=budget,
        long_prefill_token_threshold=threshold,
        max_pixels=max_pixels,
        longest_edge=longest_edge,
        workload=workload,
        efficiency=efficiency,
    )


def parameter_check(shape: ModelShape, model: str) -> str | None:
    """A line comparing the shape's parameter counts with the published ones, None when none are listed."""
    published = PUBLISHED_PARAMS.get(model)
    if published is None:
        return None
    text_pub, vision_pub = published
    line = f"parameters: language model {shape.text.params / 1e9:.3f}B (published {text_pub / 1e9:.2f}B, "
    line += f"{(shape.text.params / text_pub - 1) * 100:+.1f} %)"
    if vision_pub and shape.vision:
        line += f", vision encoder {shape.vision.params / 1e9:.3f}B (published {vision_pub / 1e9:.2f}B, "
        line += f"{(shape.vision.params / vision_pub - 1) * 100:+.1f} %)"
    return line


def report_lines(cost: CostModel, model: str = "") -> list[str]:
    """The cost model as the dry run prints it, one fact a line."""
    w, shape = cost.workload, cost.shape
    lines = [
        f"cost model: {shape.name} on {cost.gpu.name} ({cost.gpu.peak_bf16_tflops:g} TFLOP/s bf16, "
        f"{cost.gpu.bandwidth_tb_s:g} TB/s; achieved {cost.gpu.matmul_efficiency:.0%} matmul, "
        f"{cost.gpu.copy_efficiency:.0%} copy); shape from {shape.source}",
        f"cost model: {cost.text_params / 1e9:.2f}B language + {cost.vision_params / 1e9:.2f}B vision parameters; "
        f"{cost.weight_gb:.1f} GB read per decode step, KV cache {cost.kv_kib_per_token:g} KiB per token",
    ]
    check = parameter_check(shape, model)
    if check:
        lines.append(f"cost model: {check}")
    steps = ", ".join(f"{b}: {ms:.2f}" for b, ms in cost.decode_ms.items())
    lines.append(f"cost model: decode step ms by batch at {w.context_tokens} tokens of context: {steps}")
    lines.append(f"cost model: prefill {cost.prefill_ms_per_token:.4f} ms per token")
    if cost.frame is not None and cost.encoder_ms_per_frame is not None:
        f = cost.frame
        lines.append(
            f"cost model: a {f.width}x{f.height} frame -> {f.resized_width}x{f.resized_height}, {f.patches} patches, "
            f"{f.tokens} image tokens; encoder {cost.encoder_ms_per_frame:.2f} ms "
            f"({cost.encoder_ms_per_image_token:.4f} ms per image token), prefill of its "
            f"{cost.frame_prompt_tokens}-token prompt {cost.frame_prefill_ms:.2f} ms"
        )
    b = w.typical_batch
    if cost.frame_encoder_steps and cost.frame_prefill_steps:
        e1, eb = cost.frame_encoder_steps
        p1, pb = cost.frame_prefill_steps
        lines.append(
            f"cost model: in decode steps (batch 1 / batch {b}): frame encoder {e1:.2f} / {eb:.2f}, "
            f"frame prefill {p1:.2f} / {pb:.2f}"
        )
    c1, cb = cost.chat_prefill_steps
    lines.append(
        f"cost model: a {w.chat_prompt_tokens}-token chat prompt's prefill {cost.chat_prefill_ms:.2f} ms = "
        f"{c1:.2f} / {cb:.2f} decode steps (batch 1 / batch {b})"
    )
    lines += _step_lines(cost)
    lines += [f"cost model: note: {note}" for note in cost.notes]
    return lines


def _step_lines(cost: CostModel) -> list[str]:
    """What an engine step holds under the budget and what a step with frames costs: one frame's, the worst, and
    the pacing ceiling that follows for chat."""
    w, shape, b = cost.workload, cost.shape, cost.workload.typical_batch
    lines: list[str] = []
    budget = cost.budget
    if budget.max_num_batched_tokens is not None:
        line = (
            f"cost model: step budget {budget.max_num_batched_tokens} tokens"
            + (
                f", at most {budget.long_prefill_token_threshold} per request"
                if budget.long_prefill_token_threshold
                else ""
            )
            + f": {budget.image_tokens_per_step} image-prompt tokens per step beside a batch of {b}"
        )
        if budget.frame_prefill_steps is not None:
            line += (
                f", a frame's prompt in {budget.frame_prefill_steps} step(s); encoder budget "
                f"{budget.encoder_budget_tokens} tokens = {budget.frames_encoded_per_step} frame encoder pass(es) "
                "per step"
            )
        lines.append(line)
    typical = cost.decode_ms.get(b) or decode_step_ms(shape.text, cost.gpu, b, w.context_tokens, cost.efficiency)
    if cost.step_with_frame_ms is not None:
        lines.append(
            f"cost model: a batch-{b} step that also runs one frame's encoder and first prefill chunk: "
            f"{cost.step_with_frame_ms:.2f} ms ({cost.step_with_frame_ms / typical:.2f} decode steps)"
        )
    if budget.worst_step_ms is not None:
        lines.append(
            f"cost model: the worst step, a batch-{b} step that runs {budget.frames_encoded_per_step} frame "
            f"encoder pass(es) (the encoder budget) and their prefill: {budget.worst_step_ms:.2f} ms "
            f"({budget.worst_step_ms / typical:.2f} decode steps)"
        )
    if cost.frame_encoder_steps and cost.frame_prefill_steps:
        frame_steps = cost.frame_encoder_steps[1] + cost.frame_prefill_steps[1]
        top = ceiling(1.25, typical / 1000, frame_steps)
        lines.append(
            f"cost model: pacing ceiling for chat inter-token p99 <= 1.25x alone, steady steps of {typical:.2f} ms: "
            f"{top.frames_per_s:.2f} frames/s started one at a time ({top.step_share:.0%} of steps carry a "
            f"frame of {frame_steps:.2f} decode steps; the gateway's pacing.start_per_s)"
        )
    return lines


# --- published figures to compare with ----------------------------------------------------------------------


@dataclass(frozen=True)
class Published:
    """A published measurement and how to estimate the same thing here."""

    what: str
    url: str
    model: str  # key into BUILTIN_SHAPES
    gpu: str  # key into GPU_SPECS
    measured_ms: float
    batch: int = 1
    context: int = 0
    kind: Literal["decode", "image_prefill"] = "decode"
    image: tuple[int, int] = (0, 0)
    prompt_tokens: int = 0


PUBLISHED: tuple[Published, ...] = (
    Published(
        "vLLM 0.23, Llama-3.1-8B bf16, A100 40 GB, one request (1024 in, 128 out): ~75 tokens/s = 13.3 ms per "
        "token, 'roughly 77 % of the memory-bandwidth ceiling'",
        "https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on",
        "meta-llama/Llama-3.1-8B-Instruct",
        "a100-40gb",
        measured_ms=13.3,
        batch=1,
        context=1088,
    ),
    Published(
        "vLLM nightly latency benchmark, Llama-3.1-8B, H200, batch 8, 32 in + 128 out: 833 ms end to end = "
        "~6.4 ms per decode step (prefill of 8 x 32 tokens is a few ms)",
        "https://buildkite.com/vllm/performance-benchmark/builds/9515",
        "meta-llama/Llama-3.1-8B-Instruct",
        "h200",
        measured_ms=833.4 / 128,
        batch=8,
        context=96,
    ),
    Published(
        "vLLM 0.19 tracing, Qwen2.5-VL-7B, H100 80 GB, one 1920x1080 image, 2718 prompt tokens, max_tokens 1: "
        "time in model (prefill, which includes the encoder pass of that step) 126 ms",
        "https://github.com/vllm-project/vllm/issues/41267",
        "Qwen/Qwen2.5-VL-7B-Instruct",
        "h100",
        measured_ms=126.0,
        kind="image_prefill",
        image=(1920, 1080),
        prompt_tokens=2718,
    ),
)


def published_estimate(item: Published, efficiency: Efficiency = Efficiency()) -> float:
    """This model's estimate of a published measurement, in ms."""
    shape, gpu = BUILTIN_SHAPES[item.model], GPU_SPECS[item.gpu]
    if item.kind == "decode":
        return decode_step_ms(shape.text, gpu, item.batch, item.context, efficiency)
    assert shape.vision is not None
    layout = image_layout(shape.vision, *item.image)
    return (
        encoder_ms(shape.vision, gpu, layout, efficiency)
        + prefill_ms(shape.text, gpu, item.prompt_tokens, 0, efficiency)
        + efficiency.step_overhead_ms
    )


def with_efficiency(gpu: GpuSpec, matmul: float | None = None, copy: float | None = None) -> GpuSpec:
    """The GPU with other achieved fractions (a measurement on the machine at hand)."""
    return replace(
        gpu,
        matmul_efficiency=gpu.matmul_efficiency if matmul is None else matmul,
        copy_efficiency=gpu.copy_efficiency if copy is None else copy,
        efficiencies_measured=True,
    )
