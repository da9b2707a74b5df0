"""Build a tiny random-weight Qwen2-VL checkpoint for tests, fully offline.

Run with the server environment's interpreter::

    .venv-vllm/bin/python models/build_tiny_qwen2vl.py OUTPUT_DIR [--seed 0] [options]

The result is a normal Hugging Face model folder (config, safetensors weights,
byte-level BPE tokenizer with Qwen2-VL's special tokens and chat template, image
and video processors) that vLLM serves as ``Qwen2VLForConditionalGeneration``.
The weights are random, so it answers gibberish: it exists to exercise the real
serving path (multimodal preprocessing, scheduling, streaming, metrics) cheaply.

The same parameters and seed always give byte-identical files, and a folder that
already holds a complete build with the same parameters is left alone.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast, Qwen2VLForConditionalGeneration

# Bump when the output for unchanged parameters would differ, so existing
# builds are not mistaken for current ones.
BUILD_FORMAT = 1
STAMP_NAME = "visioncap_build.json"

# Qwen2-VL's added tokens, in Qwen's order. Only these names matter to vLLM and
# transformers; the ids do not have to match the real model's.
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

# Same behaviour as Qwen2-VL-Instruct's template: default system prompt, one
# vision placeholder per image/video part (the processor expands it to the
# right number of pad tokens), plain strings or OpenAI-style content lists.
# vLLM detects from the loop over message['content'] that it should pass
# content lists through instead of flattening them to strings.
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}"
    "{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n"
    "{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content"
    " or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}"
    "{{ content['text'] }}"
    "{% endif %}"
    "{% endfor %}"
    "<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Domain words so that the BPE merges cover what the tests actually send.
_CORPUS_LINES = (
    "a an the one two three four five several many no some every this that there",
    "is are was were be being has have had do does did can could may might will",
    "person people man woman child worker visitor guard crowd group someone nobody",
    "standing sitting walking running lying falling fallen fell floor ground stairs",
    "door window corridor room hallway kitchen office entrance exit parking street",
    "car truck bus bicycle bag box chair table shelf camera frame image picture video",
    "left right center top bottom near far front behind next inside outside above",
    "red green blue black white gray yellow dark bright light shadow night day",
    "describe the scene what happening alert safe unsafe emergency help normal fall",
    "detected detection track tracking count zone area line crossing entering leaving",
    "yes no maybe unclear confidence high low medium answer question please briefly",
    "json caption summary event time seconds minutes wearing holding carrying looking",
)
_PUNCTUATION = (".", ",", "?", "!", ":", ";")


@dataclass(frozen=True)
class BuildParams:
    """Everything that determines the output bytes; stored in the stamp file."""

    seed: int = 0
    layers: int = 2
    hidden: int = 128
    intermediate: int = 256
    heads: int = 4
    kv_heads: int = 2
    mrope_section: tuple[int, int, int] = (4, 6, 6)
    max_position_embeddings: int = 32768
    rope_theta: float = 1000000.0
    vision_depth: int = 2
    vision_embed: int = 64
    vision_heads: int = 2
    vision_mlp_ratio: int = 4
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    # Deliberately not a multiple of vocab_multiple: real Qwen checkpoints have
    # embedding rows beyond the tokenizer, and the tests should see that too.
    bpe_vocab: int = 1000
    vocab_multiple: int = 64
    corpus_lines: int = 4000
    min_pixels: int = 4 * 28 * 28
    max_pixels: int = 1280 * 28 * 28
    # vLLM on the CPU downcasts float32 checkpoints to bfloat16 anyway (with a
    # warning per tensor), so store what the server will compute in.
    dtype: str = "bfloat16"
    # Untied like Qwen2-VL-7B: with tied random embeddings the output logits
    # mirror the input embedding and greedy decoding repeats the last prompt
    # token forever, which hides streaming/detokenisation problems.
    tie_word_embeddings: bool = False
    build_format: int = BUILD_FORMAT


# Head sizes the vLLM CPU attention backend accepts.
_CPU_HEAD_SIZES = {32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512}


def default_mrope_section(head_dim: int) -> tuple[int, int, int]:
    """Split head_dim/2 rotary frequencies over (time, height, width) like Qwen.

    Qwen2-VL uses [16, 24, 24] for head_dim 128: a quarter for time, the rest
    shared equally by height and width.
    """
    half = head_dim // 2
    temporal = half // 4
    spatial = (half - temporal) // 2
    return (temporal + (half - temporal - 2 * spatial), spatial, spatial)


def parse_args(argv: list[str] | None = None) -> tuple[Path, BuildParams, bool]:
    defaults = BuildParams()
    parser = argparse.ArgumentParser(
        description="Build a tiny random-weight Qwen2-VL model folder (offline, deterministic)."
    )
    parser.add_argument("output_dir", type=Path)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--layers", type=int, default=defaults.layers, help="text decoder layers")
    parser.add_argument("--hidden", type=int, default=defaults.hidden, help="text hidden size")
    parser.add_argument("--intermediate", type=int, default=defaults.intermediate)
    parser.add_argument("--heads", type=int, default=defaults.heads)
    parser.add_argument("--kv-heads", type=int, default=defaults.kv_heads)
    parser.add_argument(
        "--mrope-section",
        type=lambda text: tuple(int(part) for part in text.split(",")),
        default=None,
        help="t,h,w rotary split summing to head_dim/2 (default: derived, 4,6,6 for head_dim 32)",
    )
    parser.add_argument("--max-position-embeddings", type=int, default=defaults.max_position_embeddings)
    parser.add_argument("--vision-depth", type=int, default=defaults.vision_depth)
    parser.add_argument("--vision-embed", type=int, default=defaults.vision_embed)
    parser.add_argument("--vision-heads", type=int, default=defaults.vision_heads)
    parser.add_argument("--patch-size", type=int, default=defaults.patch_size)
    parser.add_argument("--merge-size", type=int, default=defaults.merge_size)
    parser.add_argument(
        "--bpe-vocab",
        type=int,
        default=defaults.bpe_vocab,
        help="BPE training vocabulary size",
    )
    parser.add_argument(
        "--vocab-multiple",
        type=int,
        default=defaults.vocab_multiple,
        help="pad the embedding rows to a multiple of this",
    )
    parser.add_argument("--corpus-lines", type=int, default=defaults.corpus_lines)
    parser.add_argument("--min-pixels", type=int, default=defaults.min_pixels)
    parser.add_argument("--max-pixels", type=int, default=defaults.max_pixels)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default=defaults.dtype)
    parser.add_argument(
        "--tie-embeddings",
        action="store_true",
        help="share the input embedding as lm_head (like Qwen2-VL-2B)",
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if an identical build exists")
    args = parser.parse_args(argv)

    if args.hidden % args.heads:
        parser.error("--hidden must be divisible by --heads")
    if args.heads % args.kv_heads:
        parser.error("--heads must be divisible by --kv-heads")
    if args.vision_embed % args.vision_heads:
        parser.error("--vision-embed must be divisible by --vision-heads")
    head_dim = args.hidden // args.heads
    mrope = args.mrope_section or default_mrope_section(head_dim)
    if len(mrope) != 3 or sum(mrope) != head_dim // 2:
        parser.error(f"--mrope-section must be 3 numbers summing to head_dim/2 = {head_dim // 2}")
    if head_dim not in _CPU_HEAD_SIZES:
        print(
            f"warning: head_dim {head_dim} is not supported by vLLM's CPU attention ({sorted(_CPU_HEAD_SIZES)})",
            file=sys.stderr,
        )
    if args.bpe_vocab < 256 + len(SPECIAL_TOKENS):
        parser.error("--bpe-vocab must leave room for the 256 byte tokens and special tokens")

    params = BuildParams(
        seed=args.seed,
        layers=args.layers,
        hidden=args.hidden,
        intermediate=args.intermediate,
        heads=args.heads,
        kv_heads=args.kv_heads,
        mrope_section=tuple(mrope),
        max_position_embeddings=args.max_position_embeddings,
        vision_depth=args.vision_depth,
        vision_embed=args.vision_embed,
        vision_heads=args.vision_heads,
        patch_size=args.patch_size,
        merge_size=args.merge_size,
        bpe_vocab=args.bpe_vocab,
        vocab_multiple=args.vocab_multiple,
        corpus_lines=args.corpus_lines,
        min_pixels=args.min_pixels,
        max_pixels=args.max_pixels,
        dtype=args.dtype,
        tie_word_embeddings=args.tie_embeddings,
    )
    return args.output_dir, params, args.force


def params_json(params: BuildParams) -> dict[str, object]:
    data = asdict(params)
    data["mrope_section"] = list(params.mrope_section)
    return data


def existing_build_matches(output_dir: Path, params: BuildParams) -> bool:
    stamp = output_dir / STAMP_NAME
    try:
        recorded = json.loads(stamp.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if recorded.get("params") != params_json(params):
        return False
    # The stamp lists every file with its hash, so a folder that was edited or
    # partly deleted after the build counts as incomplete.
    for name, digest in recorded.get("files", {}).items():
        path = output_dir / name
        if not path.is_file() or _sha256(path) != digest:
            return False
    return bool(recorded.get("files"))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def generate_corpus(params: BuildParams) -> list[str]:
    # A private Random keeps the corpus independent of any other seeding.
    rng = random.Random(params.seed)
    vocabulary = [word for line in _CORPUS_LINES for word in line.split()]
    lines: list[str] = []
    for _ in range(params.corpus_lines):
        words = [rng.choice(vocabulary) for _ in range(rng.randint(4, 16))]
        if rng.random() < 0.5:
            words[0] = words[0].capitalize()
        if rng.random() < 0.2:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 2000)))
        lines.append(" ".join(words) + rng.choice(_PUNCTUATION))
    # Keep JSON-ish and bracket fragments mergeable too: prompts ask for JSON.
    lines += ['{"event": "fall", "people": 2, "confidence": 0.87}'] * 20
    return lines


def build_tokenizer(params: BuildParams) -> PreTrainedTokenizerFast:
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=params.bpe_vocab,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        # Every byte is in the base vocabulary, so any text (and any UTF-8
        # gibberish the random model emits) round-trips without an unk token.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(generate_corpus(params), trainer=trainer)

    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        additional_special_tokens=SPECIAL_TOKENS[1:],
        chat_template=CHAT_TEMPLATE,
        model_max_length=params.max_position_embeddings,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        errors="replace",
    )


def build_model(params: BuildParams, vocab_size: int, token_ids: dict[str, int]) -> Qwen2VLForConditionalGeneration:
    import torch
    from transformers import (
        GenerationConfig,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
    )

    config = Qwen2VLConfig(
        text_config={
            "vocab_size": vocab_size,
            "hidden_size": params.hidden,
            "intermediate_size": params.intermediate,
            "num_hidden_layers": params.layers,
            "num_attention_heads": params.heads,
            "num_key_value_heads": params.kv_heads,
            "max_position_embeddings": params.max_position_embeddings,
            "max_window_layers": params.layers,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": params.rope_theta,
                "mrope_section": list(params.mrope_section),
            },
            "bos_token_id": token_ids["<|endoftext|>"],
            "eos_token_id": token_ids["<|im_end|>"],
            "pad_token_id": token_ids["<|endoftext|>"],
            "tie_word_embeddings": params.tie_word_embeddings,
            "dtype": params.dtype,
        },
        vision_config={
            "depth": params.vision_depth,
            "embed_dim": params.vision_embed,
            # The merger projects vision features into the text model's width.
            "hidden_size": params.hidden,
            "num_heads": params.vision_heads,
            "mlp_ratio": params.vision_mlp_ratio,
            "patch_size": params.patch_size,
            "temporal_patch_size": params.temporal_patch_size,
            "spatial_merge_size": params.merge_size,
        },
        image_token_id=token_ids["<|image_pad|>"],
        video_token_id=token_ids["<|video_pad|>"],
        vision_start_token_id=token_ids["<|vision_start|>"],
        vision_end_token_id=token_ids["<|vision_end|>"],
        tie_word_embeddings=params.tie_word_embeddings,
        dtype=params.dtype,
    )

    torch.manual_seed(params.seed)
    model = Qwen2VLForConditionalGeneration(config)
    model.eval()

    # Redraw every matrix from a private generator in sorted-name order, so the
    # weights depend only on the seed and shapes, not on how a transformers
    # version happens to order its initialisation. Vectors keep the library's
    # init (norm scales 1, biases 0), which keeps activations well-behaved.
    generator = torch.Generator().manual_seed(params.seed)
    with torch.no_grad():
        for _, param in sorted(model.named_parameters(), key=lambda item: item[0]):
            if param.dim() >= 2:
                values = torch.randn(param.shape, generator=generator, dtype=torch.float32)
                param.copy_(values * 0.02)
    model.to(getattr(torch, params.dtype))

    # Explicit and minimal: vLLM applies generation_config.json defaults to
    # every request, and tests rely on plain greedy decoding at temperature 0.
    model.generation_config = GenerationConfig(
        bos_token_id=token_ids["<|endoftext|>"],
        eos_token_id=[token_ids["<|im_end|>"], token_ids["<|endoftext|>"]],
        pad_token_id=token_ids["<|endoftext|>"],
    )
    return model


def build(output_dir: Path, params: BuildParams) -> int:
    """Write the model folder; return the parameter count."""
    from transformers import (
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    tokenizer = build_tokenizer(params)
    token_ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS}
    multiple = params.vocab_multiple
    vocab_size = -(-len(tokenizer) // multiple) * multiple

    model = build_model(params, vocab_size, token_ids)
    n_params = sum(param.numel() for param in model.parameters())

    processor = Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(
            min_pixels=params.min_pixels,
            max_pixels=params.max_pixels,
            patch_size=params.patch_size,
            temporal_patch_size=params.temporal_patch_size,
            merge_size=params.merge_size,
        ),
        video_processor=Qwen2VLVideoProcessor(
            patch_size=params.patch_size,
            temporal_patch_size=params.temporal_patch_size,
            merge_size=params.merge_size,
        ),
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
    )

    # Build next to the destination and swap in at the end, so OUTPUT_DIR is
    # only ever absent, the old build, or a complete new build.
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.", dir=output_dir.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        processor.save_pretrained(staging)
        files = {
            path.relative_to(staging).as_posix(): _sha256(path) for path in sorted(staging.rglob("*")) if path.is_file()
        }
        for path in staging.rglob("*"):
            # save_pretrained writes the weights through a private temp file
            # (mode 0600); the server may run as another user.
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        stamp = {"params": params_json(params), "param_count": n_params, "files": files}
        (staging / STAMP_NAME).write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.chmod(staging, 0o755)
        if output_dir.exists():
            shutil.rmtree(output_dir)
        os.replace(staging, output_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return n_params


def main(argv: list[str] | None = None) -> int:
    output_dir, params, force = parse_args(argv)
    output_dir = output_dir.resolve()

    if not force and existing_build_matches(output_dir, params):
        stamp = json.loads((output_dir / STAMP_NAME).read_text(encoding="utf-8"))
        print(f"{output_dir} (up to date, {stamp['param_count']:,} parameters)")
        return 0
    # Never delete a folder this script did not create: only an empty folder
    # or one carrying our stamp may be replaced.
    if output_dir.exists() and any(output_dir.iterdir()) and not (output_dir / STAMP_NAME).is_file():
        print(
            f"error: {output_dir} is not empty and was not built by this script",
            file=sys.stderr,
        )
        return 1

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    # Single-threaded BPE training avoids any scheduling-dependent tie order.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    n_params = build(output_dir, params)
    print(f"{output_dir} ({n_params:,} parameters)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
