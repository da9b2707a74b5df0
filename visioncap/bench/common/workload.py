"""What the benchmark sends: chat turns of known length and camera frames, each one unique.

Everything is drawn from a seeded generator, so a run's workload (arrival times, prompt and output lengths,
images) is the same on every machine; only the timings differ. Prompts and images are unique per request, so
vLLM's prefix cache cannot skip the work a real workload would cause.
"""

from __future__ import annotations

import io
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from PIL import Image, ImageDraw

from visioncap.alerts.verify import question_body
from visioncap.bench.common.stats import poisson_arrivals, uniform_int
from visioncap.caption.encode import jpeg_data_uri

# Words the tiny models' tokenizer was trained on (models/build_tiny_qwen2vl.py), so a word is about a token.
_WORD_TEXT = (
    "a an the one two three four five several many some every this that there is are was were be has have had "
    "do does can could may might will person people man woman child worker visitor guard crowd group someone "
    "standing sitting walking running lying falling floor ground stairs door window corridor room hallway "
    "kitchen office entrance exit parking street car truck bus bicycle bag box chair table shelf camera frame "
    "image picture video left right center top bottom near far front behind next inside outside above red "
    "green blue black white gray yellow dark bright light shadow night day describe scene what happening alert "
    "safe unsafe emergency help normal fall detected detection track tracking count zone area line crossing "
    "entering leaving yes no maybe unclear confidence high low medium answer question please briefly summary "
    "event time seconds minutes wearing holding carrying looking"
)
WORDS = tuple(_WORD_TEXT.split(" "))

CAPTION_PROMPT = "Describe the people in this camera frame and what they are doing, briefly."


@dataclass(frozen=True)
class ChatTurn:
    """One interactive request: when it arrives (seconds from the phase start) and its sizes."""

    index: int
    at: float
    prompt_words: int
    max_tokens: int


def chat_schedule(
    rate_per_s: float,
    duration_s: float,
    prompt_tokens: tuple[int, int],
    output_tokens: tuple[int, int],
    tokens_per_word: float,
    seed: int,
) -> list[ChatTurn]:
    """Poisson arrivals with prompt and output lengths drawn uniformly from the given ranges."""
    rng = random.Random(seed)
    turns = []
    for index, at in enumerate(poisson_arrivals(rate_per_s, duration_s, rng)):
        tokens = uniform_int(rng, *prompt_tokens)
        words = max(1, round(tokens / max(tokens_per_word, 1e-6)))
        turns.append(ChatTurn(index, at, words, uniform_int(rng, *output_tokens)))
    return turns


def chat_text(words: int, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def chat_body(
    model: str,
    turn: ChatTurn,
    seed: int,
    priority: int | None = None,
) -> dict[str, Any]:
    """A streaming chat request whose output is exactly `turn.max_tokens` tokens (ignore_eos).

    `return_token_ids` makes vLLM send a chunk for every token, also for the tokens without text that a
    random-weight model sometimes loops on (special tokens, partial UTF-8 bytes): without it such tokens send
    nothing, and a stream would show merged gaps, or no first token at all, for reasons unrelated to load.
    """
    rng = random.Random(f"{seed}:chat:{turn.index}")
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": chat_text(turn.prompt_words, rng)}],
        "max_tokens": turn.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    if priority is not None:
        body["priority"] = priority
    return body


_NOISE: dict[tuple[int, int], Image.Image] = {}


def _noise(width: int, height: int) -> Image.Image:
    """A sensor-noise layer twice the frame's size, made once; frames use a random crop of it."""
    key = (width, height)
    if key not in _NOISE:
        _NOISE[key] = Image.effect_noise((2 * width, 2 * height), 14).convert("RGB")
    return _NOISE[key]


def camera_frame(width: int, height: int, rng: random.Random, quality: int = 80) -> bytes:
    """A JPEG that looks roughly like a camera frame: a lit scene, a floor, a few figures, sensor noise.

    Each call draws different shapes, so no two frames are the same image.
    """
    base = tuple(rng.randint(40, 160) for _ in range(3))
    image = Image.new("RGB", (width, height), base)
    draw = ImageDraw.Draw(image)
    horizon = rng.randint(height // 3, 2 * height // 3)
    floor = tuple(max(0, channel - 30) for channel in base)
    draw.rectangle((0, horizon, width, height), fill=floor)
    for _ in range(rng.randint(3, 8)):  # furniture, doors
        x, y = rng.randint(0, width - 40), rng.randint(0, height - 40)
        w, h = rng.randint(20, width // 3), rng.randint(20, height // 3)
        draw.rectangle((x, y, x + w, y + h), fill=tuple(rng.randint(0, 255) for _ in range(3)))
    for _ in range(rng.randint(0, 4)):  # people: a head and a body
        # Clamped only where the range would be empty (frames under 80x140), so larger frames stay as they were.
        x = rng.randint(20, max(20, width - 60))
        y = rng.randint(horizon - 80, max(horizon - 80, height - 120))
        color = tuple(rng.randint(0, 255) for _ in range(3))
        draw.ellipse((x + 10, y, x + 30, y + 20), fill=(220, 180, 150))
        draw.rectangle((x, y + 22, x + 40, y + 110), fill=color)
    draw.text((8, 8), f"cam {rng.randint(1, 9)}  {rng.randint(0, 86399):05d}", fill=(255, 255, 255))
    x0, y0 = rng.randrange(width), rng.randrange(height)
    noise = _noise(width, height).crop((x0, y0, x0 + width, y0 + height))
    image = Image.blend(image, noise, 0.12)
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def filler_text(words: int, seed: int) -> str:
    """`words` words of the tiny tokenizer's vocabulary (about a token each), different for each seed."""
    start = seed * 7919
    return " ".join(WORDS[(start + i * 31) % len(WORDS)] for i in range(max(0, words)))


def caption_body(
    model: str,
    image_uri: str | Sequence[str],
    max_tokens: int,
    camera: str,
    priority: int | None = None,
    filler: str = "",
    prompt: str = CAPTION_PROMPT,
) -> dict[str, Any]:
    """A caption request as the pipeline sends it (non-streaming), with an output of exactly `max_tokens`; several
    image URIs: an event described from its frames, as `VlmCaptioner.describe` sends it (with its prompt).

    `filler`: text after each image, which a stand-in's frame carries so that its prompt is as long as the
    target's while its image is smaller (see `visioncap.bench.standin.sizing`).
    """
    uris = [image_uri] if isinstance(image_uri, str) else list(image_uri)
    content: list[dict[str, Any]] = [{"type": "text", "text": prompt}]
    for uri in uris:
        content.append({"type": "image_url", "image_url": {"url": uri}})
        if filler:  # each frame's own: a stand-in's frame is its image and its filler
            content.append({"type": "text", "text": filler})
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "user": camera,
    }
    if priority is not None:
        body["priority"] = priority
    return body


class FramePool:
    """Unique camera frames (JPEG data URIs), made ahead of a phase so the load generator only sends.

    Frames a phase did not send (its flood dropped them, or it ended first) go back to the pool for the next
    phase, so no frame is ever sent twice and few are made in vain.
    """

    def __init__(self, width: int, height: int, seed: int) -> None:
        self.width = width
        self.height = height
        self._rng = random.Random(f"{seed}:frames")
        self._unsent: list[str] = []
        self.made = 0
        self.jpeg_bytes: list[int] = []

    def take(self, count: int) -> list[str]:
        taken = self._unsent[:count]
        del self._unsent[:count]
        while len(taken) < count:
            jpeg = camera_frame(self.width, self.height, self._rng)
            self.jpeg_bytes.append(len(jpeg))
            self.made += 1
            taken.append(jpeg_data_uri(jpeg))
        return taken

    def give_back(self, uris: list[str]) -> None:
        self._unsent = list(uris) + self._unsent


def caption_bodies(
    uris: list[str],
    model: str,
    max_tokens: int,
    cameras: int,
    priority: int | None,
    filler: str = "",
    per_request: int = 1,
) -> tuple[list[bytes], list[str]]:
    """Encoded caption requests for these frames, cameras taking turns; and each request's camera. `per_request`
    frames a request (an event described from several frames): consecutive frames, a last short group dropped."""
    bodies, names = [], []
    groups = [uris[at : at + per_request] for at in range(0, len(uris) - per_request + 1, max(1, per_request))]
    for index, group in enumerate(groups):
        camera = f"cam-{index % max(1, cameras) + 1}"
        body = caption_body(model, group if per_request > 1 else group[0], max_tokens, camera, priority, filler)
        bodies.append(json.dumps(body, separators=(",", ":")).encode("utf-8"))
        names.append(camera)
    return bodies, names


# A watch rule's question and the caption it is asked about; the answer is forced to one of this length (a choice
# list of one, through guided decoding as the product's verifier sends it) so every question decodes the same.
VERIFY_QUESTION = "a person leaves a package at the front door"
VERIFY_CAPTION = "a person walking to the front door carrying a box"
VERIFY_ANSWER = {"match": False, "reason": "the person is walking near the door holding a box and leaves with it"}


def verification_bodies(
    uris: list[str],
    model: str,
    max_tokens: int,
    cameras: int,
    priority: int | None,
    frames: Sequence[int],
    filler: str = "",
) -> tuple[list[bytes], list[str], list[int], list[list[str]]]:
    """Encoded watch-rule questions (`visioncap.alerts.verify.question_body`), the n-th of `frames[n % len]`
    consecutive frames, cameras taking turns; each request's camera, frame count and frames. `filler`: text after
    each image, as in `caption_body`. A last group too short for its count is left out."""
    bodies: list[bytes] = []
    names: list[str] = []
    counts: list[int] = []
    groups: list[list[str]] = []
    at = 0
    while frames and at + frames[len(bodies) % len(frames)] <= len(uris):
        count = frames[len(bodies) % len(frames)]
        group = uris[at : at + count]
        at += count
        body = question_body(VERIFY_QUESTION, VERIFY_CAPTION, group, max_tokens, VERIFY_ANSWER)
        if filler:  # after each image, as a stand-in's frame carries it
            content = body["messages"][0]["content"]
            body["messages"][0]["content"] = [
                part
                for item in content
                for part in ([item, {"type": "text", "text": filler}] if item["type"] == "image_url" else [item])
            ]
        camera = f"cam-{len(bodies) % max(1, cameras) + 1}"
        body |= {"model": model, "user": camera}
        if priority is not None:
            body["priority"] = priority
        bodies.append(json.dumps(body, separators=(",", ":")).encode("utf-8"))
        names.append(camera)
        counts.append(count)
        groups.append(group)
    return bodies, names, counts, groups
