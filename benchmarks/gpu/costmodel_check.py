"""Checks the cost model's efficiency figures (visioncap/serve/costmodel.py) on a real GPU with PyTorch alone.

Random bf16 weights shaped like Qwen2.5-VL-7B (docs/gpu-reference.md); timed with CUDA events after warm-up, the
median of several repeats. A few layers are timed and the figure scaled by the layer count (said in the output).

- matmul: an 8192^3 bf16 product (the cost model's eta_matmul, 0.80 of peak measured before);
- copy: a device-to-device copy of 1 GiB, bytes read + written (eta_copy, 0.90);
- prefill: transformer layers of the language model (RMSNorm, QKV with GQA 28/4 heads of 128, causal SDPA,
  SwiGLU 18944) over chunks of 512, 2048 and 8192 tokens: achieved FLOP/s over the matmul's (eta_pre, 0.75);
- decode: the same layers at batch 1, 8 and 32 over a KV cache of 1,024 tokens, in a CUDA graph as vLLM runs it:
  bytes moved (weights + KV) per second over the copy's (eta_dec, 0.9); and the layers' four weight products alone
  at batch 1 (cuBLAS GEMV), to tell the GEMV's own shortfall from the other kernels';
- encoder: Qwen2.5-VL's vision blocks (1280 wide, 16 heads, SwiGLU 3420; 28 layers attend within 64-patch windows
  (112x112 px), 4 over the whole image) for 1, 3 and 6 frames of 640x480 (1,564 patches each, 391 tokens after the
  2x2 merger) in one pass, as vLLM batches a request's images: ms per pass and FLOP/s over the matmul's (eta_enc,
  0.55): one block of each kind timed and scaled, and the whole 32-block encoder run in order, eager (as vLLM runs
  it) and in one CUDA graph (what kernel launches cost).

Usage (repository root, any Python with PyTorch): python benchmarks/gpu/costmodel_check.py --out RESULT.json
`--smoke` runs tiny shapes on whatever device there is (a check of the script, not a measurement).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

DTYPE = torch.bfloat16
# Qwen2.5-VL-7B's language model.
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, LAYERS = 3584, 28, 4, 128, 18944, 28
# Its vision encoder.
V_HIDDEN, V_HEADS, V_INTER, V_LAYERS, V_FULL_LAYERS, WINDOW = 1280, 16, 3420, 32, 4, 64
PATCH_IN = 3 * 2 * 14 * 14  # a 14x14 patch over 2 frames (temporal patch), flattened
PATCHES_PER_FRAME = 46 * 34  # 644x476 after resizing a 640x480 frame
MERGE = 4  # 2x2 patches per language token
OUT_HIDDEN = 3584
FULL_INDEXES = (7, 15, 23, 31)  # Qwen2.5-VL's full-attention blocks (fullatt_block_indexes)


def timed(fn: Callable[[], Any], repeats: int, budget_s: float) -> float:
    """Median milliseconds of `fn` on the device (CUDA events), after two warm-up calls; CPU: wall clock."""
    fn()
    fn()
    cuda = torch.cuda.is_available()
    samples: list[float] = []
    started = time.monotonic()
    for _ in range(repeats):
        if cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(begin.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
        if time.monotonic() - started > budget_s:
            break
    return statistics.median(samples)


def graphed_or_eager(
    fn: Callable[[], Any], device: torch.device, result: dict[str, Any], what: str
) -> Callable[[], Any]:
    """`fn` captured in a CUDA graph (its replay), or `fn` itself off CUDA or when capture fails (noted)."""
    if device.type != "cuda":
        return fn
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph.replay
    except Exception as exc:  # the eager path still measures; say why
        result.setdefault("notes", []).append(f"{what}: no CUDA graph ({exc})")
        return fn


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, 1e-6)


class TextLayer:
    """One decoder layer's weights; prefill over a chunk, decode over a KV cache."""

    def __init__(self, device: torch.device, hidden: int, heads: int, kv_heads: int, head_dim: int, inter: int):
        def w(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, device=device, dtype=DTYPE) * 0.02

        self.hidden, self.heads, self.kv_heads, self.head_dim = hidden, heads, kv_heads, head_dim
        self.qkv = w((heads + 2 * kv_heads) * head_dim, hidden)
        self.o = w(hidden, heads * head_dim)
        self.gate_up = w(2 * inter, hidden)
        self.down = w(hidden, inter)
        self.norm1 = torch.ones(hidden, device=device, dtype=DTYPE)
        self.norm2 = torch.ones(hidden, device=device, dtype=DTYPE)
        self.params = sum(t.numel() for t in (self.qkv, self.o, self.gate_up, self.down))

    def forward(self, x: torch.Tensor, k_cache: torch.Tensor | None, v_cache: torch.Tensor | None) -> torch.Tensor:
        """x: (batch, new tokens, hidden); caches: (batch, kv heads, cached tokens, head dim) or None."""
        b, n, _ = x.shape
        h = rms_norm(x, self.norm1)
        qkv = F.linear(h, self.qkv)
        q, k, v = qkv.split(
            [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], -1
        )
        q = q.view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        if k_cache is not None and v_cache is not None:
            # The new token's K and V go into the cache's last slot in place (as a paged cache is written), and
            # attention reads the cache where it lies: no copy of the cache per step.
            k_cache[:, :, -n:].copy_(k)
            v_cache[:, :, -n:].copy_(v)
            k, v = k_cache, v_cache
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=k_cache is None, enable_gqa=True)
        x = x + F.linear(attn.transpose(1, 2).reshape(b, n, -1), self.o)
        h = rms_norm(x, self.norm2)
        gate, up = F.linear(h, self.gate_up).chunk(2, -1)
        return x + F.linear(F.silu(gate) * up, self.down)


class VisionBlock:
    def __init__(self, device: torch.device, hidden: int, heads: int, inter: int):
        def w(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, device=device, dtype=DTYPE) * 0.02

        self.hidden, self.heads = hidden, heads
        self.qkv = w(3 * hidden, hidden)
        self.proj = w(hidden, hidden)
        self.gate_up = w(2 * inter, hidden)
        self.down = w(hidden, inter)
        self.norm1 = torch.ones(hidden, device=device, dtype=DTYPE)
        self.norm2 = torch.ones(hidden, device=device, dtype=DTYPE)
        self.params = sum(t.numel() for t in (self.qkv, self.proj, self.gate_up, self.down))

    def forward(self, x: torch.Tensor, group: int) -> torch.Tensor:
        """x: (patches, hidden), padded to a multiple of `group`; attention within each group of patches."""
        n = x.shape[0]
        h = rms_norm(x, self.norm1)
        q, k, v = F.linear(h, self.qkv).view(n // group, group, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v)
        x = x + F.linear(attn.transpose(1, 2).reshape(n, self.hidden), self.proj)
        h = rms_norm(x, self.norm2)
        gate, up = F.linear(h, self.gate_up).chunk(2, -1)
        return x + F.linear(F.silu(gate) * up, self.down)


def measure(smoke: bool) -> dict[str, Any]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    scale = 16 if smoke else 1
    reps, budget = (3, 5.0) if smoke else (10, 20.0)
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "smoke": smoke,
        "method": "CUDA events, median of up to 10 repeats after 2 warm-up calls; bf16 random weights",
    }
    if device.type == "cuda":
        result["cuda"] = torch.version.cuda
        torch.backends.cuda.matmul.allow_tf32 = False

    # (a) matmul
    n = 8192 // scale
    a, b = torch.randn(n, n, device=device, dtype=DTYPE), torch.randn(n, n, device=device, dtype=DTYPE)
    ms = timed(lambda: a @ b, reps, budget)
    matmul_tflops = 2 * n**3 / (ms / 1e3) / 1e12
    result["matmul"] = {"n": n, "ms": round(ms, 3), "tflops": round(matmul_tflops, 1)}

    # (b) copy
    size = (1 << 30) // scale // 2  # bf16 values in 1 GiB
    src = torch.empty(size, device=device, dtype=DTYPE)
    dst = torch.empty_like(src)
    ms = timed(lambda: dst.copy_(src), reps, budget)
    copy_tbs = 2 * src.numel() * 2 / (ms / 1e3) / 1e12
    result["copy"] = {"bytes": src.numel() * 2, "ms": round(ms, 3), "tb_per_s": round(copy_tbs, 3)}

    # (c) prefill and (d) decode over a few layers of the language model
    dims = (HIDDEN // scale, HEADS // (4 if smoke else 1), KV_HEADS // (4 if smoke else 1), HEAD_DIM, INTER // scale)
    timed_layers = 2 if smoke else 4
    layers = [TextLayer(device, *dims) for _ in range(timed_layers)]
    hidden, heads, kv_heads, head_dim, _ = dims
    layer_params = layers[0].params

    def stack(x: torch.Tensor, caches: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> torch.Tensor:
        for index, layer in enumerate(layers):
            k, v = caches[index] if caches is not None else (None, None)
            x = layer.forward(x, k, v)
        return x

    prefill = []
    for chunk in (64, 128) if smoke else (512, 2048, 8192):
        x = torch.randn(1, chunk, hidden, device=device, dtype=DTYPE)
        with torch.inference_mode():
            ms = timed(lambda x=x: stack(x), reps, budget) / timed_layers
        flops = 2 * layer_params * chunk + 4 * heads * head_dim * chunk * (chunk + 1) / 2
        tflops = flops / (ms / 1e3) / 1e12
        prefill.append({"tokens": chunk, "ms_per_layer": round(ms, 4), "ms_all_layers": round(ms * LAYERS, 2),
                        "tflops": round(tflops, 1), "eta_pre": round(tflops / matmul_tflops, 3)})  # fmt: skip
    result["prefill"] = prefill

    decode = []
    context = 128 if smoke else 1024
    for batch in (1, 8) if smoke else (1, 8, 32):
        caches = [
            (
                torch.randn(batch, kv_heads, context + 1, head_dim, device=device, dtype=DTYPE),
                torch.randn(batch, kv_heads, context + 1, head_dim, device=device, dtype=DTYPE),
            )
            for _ in layers
        ]
        x = torch.randn(batch, 1, hidden, device=device, dtype=DTYPE)
        run: Callable[[], Any] = lambda x=x, caches=caches: stack(x, caches)  # noqa: E731
        graphed = False
        if device.type == "cuda":
            try:
                with torch.inference_mode():
                    stream = torch.cuda.Stream()
                    stream.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(stream):
                        for _ in range(2):
                            stack(x, caches)
                    torch.cuda.current_stream().wait_stream(stream)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        stack(x, caches)
                run, graphed = graph.replay, True
            except Exception as exc:  # the eager path still measures; say why
                result.setdefault("notes", []).append(f"decode batch {batch}: no CUDA graph ({exc})")
        with torch.inference_mode():
            ms = timed(run, reps * 5, budget) / timed_layers
        kv_bytes = batch * context * 2 * kv_heads * head_dim * 2
        moved = layer_params * 2 + kv_bytes
        tbs = moved / (ms / 1e3) / 1e12
        decode.append({"batch": batch, "context": context, "cuda_graph": graphed, "ms_per_layer": round(ms, 4),
                       "ms_all_layers": round(ms * LAYERS, 3), "tb_per_s": round(tbs, 3),
                       "eta_dec": round(tbs / copy_tbs, 3)})  # fmt: skip
    result["decode"] = decode

    # The layers' four weight products alone at batch 1 (cuBLAS GEMV, as vLLM's unquantised linear layers call
    # it): how much of decode's shortfall is the GEMV itself rather than the norms, attention and activations.
    x1 = torch.randn(1, hidden, device=device, dtype=DTYPE)
    y_inter = torch.randn(1, layers[0].down.shape[1], device=device, dtype=DTYPE)
    y_heads = torch.randn(1, heads * head_dim, device=device, dtype=DTYPE)

    def gemvs() -> None:
        for layer in layers:
            F.linear(x1, layer.qkv)
            F.linear(y_heads, layer.o)
            F.linear(x1, layer.gate_up)
            F.linear(y_inter, layer.down)

    with torch.inference_mode():
        ms = timed(graphed_or_eager(gemvs, device, result, "gemv"), reps * 5, budget) / timed_layers
    tbs = layer_params * 2 / (ms / 1e3) / 1e12
    result["decode_gemv_only"] = {"batch": 1, "ms_per_layer": round(ms, 4), "tb_per_s": round(tbs, 3),
                                  "of_copy": round(tbs / copy_tbs, 3)}  # fmt: skip

    # (e) vision encoder
    v_hidden, v_heads, v_inter = V_HIDDEN // scale, V_HEADS // (4 if smoke else 1), V_INTER // scale
    blocks = [VisionBlock(device, v_hidden, v_heads, v_inter) for _ in range(2)]
    block_params = blocks[0].params
    patch_embed = torch.randn(v_hidden, PATCH_IN, device=device, dtype=DTYPE) * 0.02
    merger_in = v_hidden * MERGE
    merger = (
        torch.randn(merger_in, merger_in, device=device, dtype=DTYPE) * 0.02,
        torch.randn(OUT_HIDDEN // scale, merger_in, device=device, dtype=DTYPE) * 0.02,
    )
    merger_params = sum(t.numel() for t in merger)
    merger_norm = torch.ones(v_hidden, device=device, dtype=DTYPE)
    stack_blocks = [VisionBlock(device, v_hidden, v_heads, v_inter) for _ in range(V_LAYERS)]
    encoder = []
    for frames in (1, 3, 6):
        patches = frames * PATCHES_PER_FRAME
        padded_window = math.ceil(PATCHES_PER_FRAME / WINDOW) * WINDOW  # each frame's windows, padded
        pixels = torch.randn(frames * padded_window, PATCH_IN, device=device, dtype=DTYPE)

        full = torch.randn(frames * padded_window, v_hidden, device=device, dtype=DTYPE)

        def window_pass(full: torch.Tensor = full) -> torch.Tensor:
            return blocks[0].forward(full, WINDOW)  # attention within each 64-patch window

        def full_pass(full: torch.Tensor = full, group: int = padded_window) -> torch.Tensor:
            return blocks[1].forward(full, group)  # attention over each whole frame

        tokens = torch.randn(frames * padded_window // MERGE, merger_in, device=device, dtype=DTYPE)

        def merge(tokens: torch.Tensor = tokens) -> torch.Tensor:
            return F.linear(F.gelu(F.linear(tokens, merger[0])), merger[1])

        def embed(pixels: torch.Tensor = pixels) -> torch.Tensor:
            return F.linear(pixels, patch_embed)

        def whole(pixels: torch.Tensor = pixels, group: int = padded_window) -> torch.Tensor:
            # All 32 blocks in order, full attention at Qwen2.5-VL's indexes 7, 15, 23, 31, then the merger.
            x = F.linear(pixels, patch_embed)
            for index, block in enumerate(stack_blocks):
                x = block.forward(x, group if index in FULL_INDEXES else WINDOW)
            tokens = rms_norm(x, merger_norm).view(-1, merger_in)
            return F.linear(F.gelu(F.linear(tokens, merger[0])), merger[1])

        with torch.inference_mode():
            embed_ms = timed(embed, reps, budget)
            window_ms = timed(window_pass, reps, budget)
            full_ms = timed(full_pass, reps, budget)
            merge_ms = timed(merge, reps, budget)
            whole_ms = timed(whole, reps, budget)
            whole_graphed_ms = timed(graphed_or_eager(whole, device, result, f"encoder {frames}"), reps, budget)
        total_ms = window_ms * (V_LAYERS - V_FULL_LAYERS) + full_ms * V_FULL_LAYERS + merge_ms + embed_ms
        flops = (
            2 * (PATCH_IN * v_hidden + V_LAYERS * block_params) * patches
            + 2 * merger_params * patches / MERGE
            + 4 * v_hidden * frames * (
                (V_LAYERS - V_FULL_LAYERS) * padded_window * WINDOW + V_FULL_LAYERS * padded_window**2
            )
        )  # fmt: skip
        tflops = flops / (total_ms / 1e3) / 1e12
        encoder.append({"frames": frames, "patches": patches, "tokens": patches // MERGE,
                        "window_layer_ms": round(window_ms, 4), "full_layer_ms": round(full_ms, 4),
                        "merger_ms": round(merge_ms, 4), "embed_ms": round(embed_ms, 4),
                        "ms_per_pass": round(total_ms, 3),
                        "tflops": round(tflops, 1), "eta_enc": round(tflops / matmul_tflops, 3),
                        "whole_ms": round(whole_ms, 3),
                        "whole_eta_enc": round(flops / (whole_ms / 1e3) / 1e12 / matmul_tflops, 3),
                        "whole_graphed_ms": round(whole_graphed_ms, 3),
                        "whole_graphed_eta_enc": round(flops / (whole_graphed_ms / 1e3) / 1e12 / matmul_tflops, 3),
                        })  # fmt: skip
    result["encoder"] = encoder
    result["scaled"] = (
        f"prefill and decode: {timed_layers} layers timed, per-layer figures x {LAYERS} for the model; encoder: one "
        f"window-attention and one full-attention block timed, x {V_LAYERS - V_FULL_LAYERS} and x {V_FULL_LAYERS}, "
        "plus the patch embedding and the merger (ms_per_pass, eta_enc); whole_ms: all 32 blocks run in order, "
        "eager as vLLM runs the encoder (whole_graphed_ms: the same in one CUDA graph, what launch overhead costs); "
        "windows: each frame's 1,564 patches padded to 25 windows of 64; rotary embeddings left out (elementwise)"
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes: checks the script, measures nothing")
    args = parser.parse_args()
    started = time.monotonic()
    result = measure(args.smoke)
    result["wall_s"] = round(time.monotonic() - started, 1)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
