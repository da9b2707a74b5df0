"""A deterministic, offline test video: people walking through an empty street, with known events.

People are cut out of the two photos that ship in the `ultralytics` wheel (`bus.jpg`: three men on a pavement;
`zidane.jpg`: two men, waist up), feathered into a synthetic street and moved along keyframed paths with a walking
bob. Events (one person or a small group) are separated by empty stretches, one of which has a passing vehicle
so that "nothing to describe" is not simply a still picture. Every frame is a pure function of its index, so the
same video (and ground truth) comes out on every machine, and any sub-range can be rendered on its own.

Run `python -m visioncap.bench.detection.scenes [--quick] [--check]` to write the video and print its ground
truth; `--check` runs the real detector and tracker over it and reports how well the events are found
(`detection_quality`, the scoring the detector benchmarks share).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import cv2
import numpy as np

from visioncap.bench.common.machine import REPO

if TYPE_CHECKING:
    from visioncap.bench.detection.shared import TrackedFrame

WIDTH, HEIGHT, FPS = 640, 480, 10
# A person counts as in view (ground truth) while at least this share of their cut-out is inside the frame:
# a sliver at the edge is not something a detector, or a viewer, would call a person.
VISIBLE_SHARE = 0.5
DATA_DIR = REPO / "data" / "benchmarks"


@dataclass(frozen=True, slots=True)
class Sprite:
    """A person cut out of a packaged photo: the photo's file name and the box (x1, y1, x2, y2) in its pixels."""

    photo: str
    box: tuple[int, int, int, int]


SPRITES: dict[str, Sprite] = {
    "coat": Sprite("bus.jpg", (45, 390, 250, 910)),  # beige coat, full body
    "black": Sprite("bus.jpg", (215, 395, 350, 870)),  # black coat, full body
    "edge": Sprite("bus.jpg", (655, 440, 810, 885)),  # half-cut by the photo's edge, walking
    "zidane": Sprite("zidane.jpg", (120, 190, 760, 720)),  # waist up, leaning, pointing
    "ancelotti": Sprite("zidane.jpg", (745, 30, 1150, 720)),  # waist up
}


@dataclass(frozen=True, slots=True)
class Key:
    """Where a walker is at a share `t` of their event: centre x and feet y as shares of the frame, height px."""

    t: float
    x: float
    feet: float
    height: float


@dataclass(frozen=True, slots=True)
class Walker:
    """One person of an event, moving through `keys` (linear between them, bobbing while moving)."""

    sprite: str
    keys: tuple[Key, ...]


@dataclass(frozen=True, slots=True)
class EventSpec:
    """People who come into view together, walk about, and leave."""

    start_s: float
    duration_s: float
    walkers: tuple[Walker, ...]
    label: str


@dataclass(frozen=True, slots=True)
class Vehicle:
    """Something big that moves and is not a person: a box-shaped van crossing an empty stretch."""

    start_s: float
    duration_s: float


@dataclass(frozen=True, slots=True)
class GroundTruthEvent:
    """Frames [start_frame, end_frame] (inclusive) in which at least one of the event's people is in view."""

    index: int
    label: str
    people: int
    start_frame: int
    end_frame: int
    fps: float
    person_spans: tuple[tuple[int, int], ...] = field(default=())

    @property
    def start_s(self) -> float:
        return self.start_frame / self.fps

    @property
    def end_s(self) -> float:
        return (self.end_frame + 1) / self.fps

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def as_dict(self) -> dict[str, object]:
        data = asdict(self)
        data.update(start_s=round(self.start_s, 2), end_s=round(self.end_s, 2), duration_s=round(self.duration_s, 2))
        return data


def _walk(sprite: str, x0: float, x1: float, feet: float, height: float) -> Walker:
    return Walker(sprite, (Key(0.0, x0, feet, height), Key(1.0, x1, feet, height)))


def _pair_stops_to_talk() -> tuple[Walker, Walker]:
    """Walk in from the right, stop to talk for a while, walk out to the left."""
    return (
        Walker(
            "coat",
            (
                Key(0.0, 1.12, 0.93, 230),
                Key(0.3, 0.45, 0.93, 235),
                Key(0.65, 0.42, 0.93, 235),
                Key(1.0, -0.14, 0.94, 240),
            ),
        ),
        Walker(
            "black",
            (
                Key(0.0, 1.28, 0.91, 215),
                Key(0.3, 0.62, 0.91, 220),
                Key(0.65, 0.64, 0.91, 220),
                Key(1.0, 0.04, 0.93, 225),
            ),
        ),
    )


def _approaches_waits_leaves() -> Walker:
    """Comes closer across the frame (grows), waits, turns back the way they came."""
    return Walker(
        "black",
        (
            Key(0.0, -0.1, 0.72, 170),
            Key(0.4, 0.55, 0.97, 290),
            Key(0.6, 0.58, 0.97, 290),
            Key(1.0, -0.16, 0.75, 175),
        ),
    )


def _events_full() -> tuple[tuple[EventSpec, ...], float, tuple[Vehicle, ...]]:
    # Six events in 2.6 minutes: four short (5-10 s in view), two long (34 s, 36 s); groups of 1, 2 and 3.
    events = (
        EventSpec(5, 8, (_walk("coat", -0.12, 1.12, 0.95, 250),), "single, crosses left to right"),
        EventSpec(
            20,
            36,
            _pair_stops_to_talk(),
            "pair stops to talk (long)",
        ),
        EventSpec(63, 7, (_walk("black", 1.12, -0.12, 0.78, 190),), "single, far, fast right to left"),
        EventSpec(
            76,
            10,
            (_walk("zidane", -0.3, 0.75, 1.0, 300), _walk("ancelotti", -0.02, 1.1, 1.0, 330)),
            "close-up pair, waist up",
        ),
        EventSpec(
            93,
            8,
            (
                _walk("coat", -0.15, 0.85, 0.96, 240),
                _walk("black", -0.3, 0.72, 0.93, 225),
                _walk("edge", -0.45, 0.55, 0.94, 230),
            ),
            "group of three",
        ),
        EventSpec(
            108,
            42,
            (_approaches_waits_leaves(),),
            "single approaches, waits, leaves (long)",
        ),
    )
    return events, 156.0, (Vehicle(14.0, 4.0), Vehicle(87.0, 4.0))


def _events_quick() -> tuple[tuple[EventSpec, ...], float, tuple[Vehicle, ...]]:
    full, _, _ = _events_full()
    events = (
        full[0],
        EventSpec(20, 6, full[2].walkers, full[2].label),
        EventSpec(33, 18, full[1].walkers, "pair stops to talk"),
    )
    return events, 57.0, (Vehicle(14.0, 4.0),)


@cache
def _photo(name: str) -> np.ndarray:
    # The same photos ship in the ultralytics wheel and in fall_detection's models folder.
    for base in (files("ultralytics") / "assets", files("fall_detection") / "models"):
        image = cv2.imread(str(base / name))
        if image is not None:
            return image
    raise FileNotFoundError(f"{name}: not found in ultralytics/assets or fall_detection/models")


@cache
def _cutout(name: str) -> tuple[np.ndarray, np.ndarray]:
    """The sprite's pixels and a feathered alpha (float32, HxWx1) so the photo's own background fades out."""
    sprite = SPRITES[name]
    x1, y1, x2, y2 = sprite.box
    pixels = _photo(sprite.photo)[y1:y2, x1:x2].copy()
    h, w = pixels.shape[:2]
    # Fade over the outer 18% sideways and 6% top/bottom: the person stays opaque, the photo's background mostly
    # does not, and no hard rectangle edge is left for the detector to latch on to.
    xs = np.minimum(np.arange(w), np.arange(w)[::-1]) / (0.18 * w)
    ys = np.minimum(np.arange(h), np.arange(h)[::-1]) / (0.06 * h)
    alpha = np.clip(np.minimum(xs[None, :], ys[:, None]), 0, 1).astype(np.float32)
    alpha = alpha * alpha * (3 - 2 * alpha)  # smoothstep
    return pixels, alpha[:, :, None]


@cache
def _street() -> np.ndarray:
    """The empty street: sky, building fronts with windows, pavement, kerb and road (float32 BGR)."""
    frame = np.zeros((HEIGHT, WIDTH, 3), np.float32)
    sky = np.linspace(215, 150, 170, dtype=np.float32)[:, None, None] * np.array([1.0, 0.92, 0.78], np.float32)
    frame[:170] = sky
    blocks = [(0, 150, 60, (92, 110, 128)), (150, 330, 30, (70, 82, 104)), (330, 470, 80, (110, 118, 120))]
    blocks += [(470, 640, 45, (84, 96, 86))]
    for x1, x2, top, colour in blocks:
        frame[top:330, x1:x2] = colour
        for wx in range(x1 + 14, x2 - 24, 38):
            for wy in range(top + 18, 300, 46):
                frame[wy : wy + 26, wx : wx + 20] = (150, 130, 105)
                frame[wy + 12 : wy + 14, wx : wx + 20] = (60, 60, 60)
    frame[330:420] = (128, 132, 136)  # pavement
    for x in range(-40, WIDTH, 64):
        cv2.line(frame, (x, 330), (x + 30, 420), (112, 116, 120), 2)
    frame[420:426] = (175, 175, 170)  # kerb
    frame[426:] = (72, 72, 76)  # road
    return frame


@cache
def _noise_tiles() -> np.ndarray:
    # A few fixed sensor-noise fields reused in turn: noise per frame without drawing 1M normals per frame.
    rng = np.random.default_rng(1234)
    return rng.normal(0, 3.0, (8, HEIGHT, WIDTH, 3)).astype(np.float32)


def _lerp_keys(keys: Sequence[Key], t: float) -> tuple[float, float, float, int, bool]:
    """Centre x, feet y, height, facing (+1 right, -1 left) and whether the walker is moving at share t."""
    t = min(max(t, 0.0), 1.0)
    facing, moving = 1, False
    for a, b in itertools.pairwise(keys):
        dx = b.x - a.x
        if abs(dx) > 1e-6:
            facing = 1 if dx > 0 else -1
        if t <= b.t or b is keys[-1]:
            share = 0.0 if b.t == a.t else (t - a.t) / (b.t - a.t)
            moving = abs(dx) > 1e-6 or abs(b.height - a.height) > 1e-6
            return (
                a.x + dx * share,
                a.feet + (b.feet - a.feet) * share,
                a.height + (b.height - a.height) * share,
                facing,
                moving,
            )
    last = keys[-1]
    return last.x, last.feet, last.height, facing, moving


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a walker's sprite lands in one frame (before clipping to the frame)."""

    sprite: str
    x1: int
    y1: int
    width: int
    height: int
    flip: bool

    @property
    def visible_share(self) -> float:
        vis_w = max(0, min(WIDTH, self.x1 + self.width) - max(0, self.x1))
        vis_h = max(0, min(HEIGHT, self.y1 + self.height) - max(0, self.y1))
        return (vis_w * vis_h) / float(self.width * self.height)


class Scene:
    """The test video: `frame(i)` renders frame i; `ground_truth()` says which frames show which event."""

    def __init__(self, quick: bool = False) -> None:
        self.quick = quick
        self.events, self.duration_s, self.vehicles = _events_quick() if quick else _events_full()
        self.fps = FPS
        self.width, self.height = WIDTH, HEIGHT
        self.frame_count = round(self.duration_s * FPS)

    @property
    def name(self) -> str:
        return "scenes-quick" if self.quick else "scenes"

    def spec_hash(self) -> str:
        """Changes whenever anything that shapes the pixels changes (so cached videos are rebuilt)."""
        spec = {
            "events": [asdict(e) for e in self.events],
            "vehicles": [asdict(v) for v in self.vehicles],
            "sprites": {k: asdict(v) for k, v in SPRITES.items()},
            "size": [WIDTH, HEIGHT, FPS, self.duration_s],
        }
        digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode())
        # The drawing code shapes the pixels too.
        digest.update(Path(__file__).read_bytes())
        return digest.hexdigest()[:12]

    def placements(self, index: int) -> list[tuple[int, Placement]]:
        """(event number, placement) for every walker of an event running at frame `index`."""
        t_s = index / self.fps
        out = []
        for number, event in enumerate(self.events):
            if not event.start_s <= t_s <= event.start_s + event.duration_s:
                continue
            share = (t_s - event.start_s) / event.duration_s
            for walker in event.walkers:
                cx, feet, height, facing, moving = _lerp_keys(walker.keys, share)
                pixels, _ = _cutout(walker.sprite)
                sprite_h = max(8, round(height))
                sprite_w = max(4, round(pixels.shape[1] * sprite_h / pixels.shape[0]))
                # A walking gait: up and down twice per second while moving.
                bob = 4.0 * abs(math.sin(math.pi * 2.0 * t_s)) if moving else 0.0
                # Photos face both ways; flipping when walking left keeps most people facing where they go.
                flip = facing < 0
                x1 = round(cx * WIDTH - sprite_w / 2)
                y1 = round(feet * HEIGHT - sprite_h - bob)
                out.append((number, Placement(walker.sprite, x1, y1, sprite_w, sprite_h, flip)))
        return out

    def frame(self, index: int) -> np.ndarray:
        t_s = index / self.fps
        # Slow changes of light (clouds), as on a real camera, so empty frames are not all alike.
        light = 1.0 + 0.06 * math.sin(2 * math.pi * t_s / 37.0)
        canvas = _street() * light
        for vehicle in self.vehicles:
            if vehicle.start_s <= t_s <= vehicle.start_s + vehicle.duration_s:
                _draw_vehicle(canvas, (t_s - vehicle.start_s) / vehicle.duration_s)
        # Further people (smaller, higher feet) first, so nearer ones overlap them.
        for _, placement in sorted(self.placements(index), key=lambda item: item[1].y1 + item[1].height):
            _paste(canvas, placement)
        canvas += _noise_tiles()[index % len(_noise_tiles())]
        return np.clip(canvas, 0, 255).astype(np.uint8)

    def frames(self, start: int = 0, end: int | None = None) -> Iterator[np.ndarray]:
        for index in range(start, self.frame_count if end is None else min(end, self.frame_count)):
            yield self.frame(index)

    def ground_truth(self) -> list[GroundTruthEvent]:
        spans: dict[int, list[list[int]]] = {}
        for index in range(self.frame_count):
            for number, placement in self._numbered_placements(index):
                if placement[1].visible_share < VISIBLE_SHARE:
                    continue
                walker_spans = spans.setdefault(number, [[-1, -1] for _ in self.events[number].walkers])
                span = walker_spans[placement[0]]
                span[0] = index if span[0] < 0 else span[0]
                span[1] = index
        out = []
        for number, walker_spans in sorted(spans.items()):
            seen = [s for s in walker_spans if s[0] >= 0]
            out.append(
                GroundTruthEvent(
                    index=number,
                    label=self.events[number].label,
                    people=len(seen),
                    start_frame=min(s[0] for s in seen),
                    end_frame=max(s[1] for s in seen),
                    fps=self.fps,
                    person_spans=tuple((s[0], s[1]) for s in seen),
                )
            )
        return out

    def _numbered_placements(self, index: int) -> Iterator[tuple[int, tuple[int, Placement]]]:
        # (event number, (walker number, placement)); placements() keeps walkers in order within an event.
        counters: dict[int, int] = {}
        for number, placement in self.placements(index):
            walker = counters.get(number, 0)
            counters[number] = walker + 1
            yield number, (walker, placement)

    def write(self, path: Path, start: int = 0, end: int | None = None) -> Path:
        """Frames [start, end) as an MPEG-4 .mp4 (the codec the demo uses; OpenCV writes it without extras)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"mp4v"), self.fps, (WIDTH, HEIGHT))
        if not writer.isOpened():
            raise RuntimeError(f"cannot write video {path}")
        try:
            for image in self.frames(start, end):
                writer.write(image)
        finally:
            writer.release()
        return path

    def video(self, directory: Path = DATA_DIR) -> Path:
        """The whole scene as a video file, written once per scene definition and then reused."""
        path = directory / f"{self.name}-{self.spec_hash()}.mp4"
        if not path.is_file():
            # Versions of this scene from earlier definitions are stale: drop them rather than let data/ fill up.
            for old in directory.glob(f"{self.name}-*.mp4"):
                if re.fullmatch(rf"{re.escape(self.name)}-[0-9a-f]{{12}}\.mp4", old.name):
                    old.unlink()
            tmp = path.with_suffix(".tmp.mp4")
            self.write(tmp)
            tmp.replace(path)
        return path


def _paste(canvas: np.ndarray, placement: Placement) -> None:
    pixels, alpha = _cutout(placement.sprite)
    size = (placement.width, placement.height)
    pixels = cv2.resize(pixels, size, interpolation=cv2.INTER_AREA).astype(np.float32)
    alpha = cv2.resize(alpha, size, interpolation=cv2.INTER_LINEAR)[:, :, None]
    if placement.flip:
        pixels, alpha = pixels[:, ::-1], alpha[:, ::-1]
    x1, y1 = placement.x1, placement.y1
    cx1, cy1 = max(0, x1), max(0, y1)
    cx2, cy2 = min(WIDTH, x1 + placement.width), min(HEIGHT, y1 + placement.height)
    if cx1 >= cx2 or cy1 >= cy2:
        return
    sx1, sy1 = cx1 - x1, cy1 - y1
    part = pixels[sy1 : sy1 + cy2 - cy1, sx1 : sx1 + cx2 - cx1]
    a = alpha[sy1 : sy1 + cy2 - cy1, sx1 : sx1 + cx2 - cx1]
    region = canvas[cy1:cy2, cx1:cx2]
    canvas[cy1:cy2, cx1:cx2] = region * (1 - a) + part * a


def _draw_vehicle(canvas: np.ndarray, share: float) -> None:
    x = round(-260 + share * (WIDTH + 260))
    cv2.rectangle(canvas, (x, 350), (x + 240, 445), (150, 150, 160), -1)
    cv2.rectangle(canvas, (x + 150, 362), (x + 225, 400), (70, 60, 50), -1)
    cv2.rectangle(canvas, (x + 15, 362), (x + 130, 400), (70, 60, 50), -1)
    for wheel in (x + 45, x + 195):
        cv2.circle(canvas, (wheel, 445), 18, (25, 25, 25), -1)


# -- detection quality against the ground truth -----------------------------------------------------------------


def _expected_people(scene: Scene) -> dict[int, int]:
    counts: dict[int, int] = {}
    for event in scene.ground_truth():
        for first, last in event.person_spans:
            for index in range(first, last + 1):
                counts[index] = counts.get(index, 0) + 1
    return counts


def track_spans(frames: Sequence[TrackedFrame]) -> dict[int, tuple[int, int, int]]:
    """Track id -> (first frame, last frame, frames seen)."""
    spans: dict[int, tuple[int, int, int]] = {}
    for frame in frames:
        for person in frame.tracked:
            if person.track_id is None:
                continue
            first, _, seen = spans.get(person.track_id, (frame.index, frame.index, 0))
            spans[person.track_id] = (first, frame.index, seen + 1)
    return spans


def assign_tracks(scene: Scene, frames: Sequence[TrackedFrame]) -> dict[int, int | None]:
    """Track id -> ground-truth event number it overlaps most (None: a track outside every event)."""
    events = scene.ground_truth()
    out: dict[int, int | None] = {}
    for track_id, (first, last, _) in track_spans(frames).items():
        best, best_overlap = None, 0
        for event in events:
            overlap = min(last, event.end_frame) - max(first, event.start_frame) + 1
            if overlap > best_overlap:
                best, best_overlap = event.index, overlap
        out[track_id] = best
    return out


def detection_quality(scene: Scene, frames: Sequence[TrackedFrame], stable_frames: int = 3) -> dict[str, Any]:
    """Frame recall/false alarms, people-count accuracy, and per event: found, first detection, track ids."""
    expected = _expected_people(scene)
    analysed = {f.index: f for f in frames}
    person_frames = [i for i in analysed if expected.get(i, 0) > 0]
    empty_frames = [i for i in analysed if expected.get(i, 0) == 0]
    hit = [i for i in person_frames if analysed[i].raw]
    false_alarm = [i for i in empty_frames if analysed[i].raw]
    count_ok = [i for i in person_frames if len(analysed[i].raw) == expected[i]]
    tracked_hit = [i for i in person_frames if analysed[i].tracked]
    spans = track_spans(frames)
    owner = assign_tracks(scene, frames)
    events = []
    for event in scene.ground_truth():
        in_event = [analysed[i] for i in range(event.start_frame, event.end_frame + 1) if i in analysed]
        first_hit = next((f for f in in_event if f.raw), None)
        ids = sorted(t for t, e in owner.items() if e == event.index and spans[t][2] >= stable_frames)
        events.append(
            {
                "event": event.index,
                "label": event.label,
                "people": event.people,
                "start_s": round(event.start_s, 1),
                "duration_s": round(event.duration_s, 1),
                "frames_with_detection": round(sum(1 for f in in_event if f.raw) / max(1, len(in_event)), 3),
                "frames_count_exact": round(
                    sum(1 for f in in_event if len(f.raw) == expected.get(f.index, 0)) / max(1, len(in_event)), 3
                ),
                "first_detection_after_s": None
                if first_hit is None
                else round(first_hit.offset_s - event.start_frame / scene.fps, 2),
                "stable_tracks": len(ids),
            }
        )
    stray = sorted(t for t, e in owner.items() if e is None and spans[t][2] >= stable_frames)
    return {
        "analysed_frames": len(analysed),
        "person_frame_recall": round(len(hit) / max(1, len(person_frames)), 3),
        "person_frame_recall_after_tracking": round(len(tracked_hit) / max(1, len(person_frames)), 3),
        "people_count_exact": round(len(count_ok) / max(1, len(person_frames)), 3),
        "empty_frames_with_detection": round(len(false_alarm) / max(1, len(empty_frames)), 3),
        "events_found": sum(1 for e in events if cast(int, e["frames_with_detection"]) > 0),
        "events": len(events),
        "stable_tracks": sum(1 for s in spans.values() if s[2] >= stable_frames),
        "stable_tracks_outside_events": len(stray),
        "people_in_events": sum(e.people for e in scene.ground_truth()),
        "per_event": events,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the short scene (about 1 minute, 3 events)")
    parser.add_argument("--out", type=Path, help="write the video here (default: data/benchmarks/, cached)")
    parser.add_argument("--check", action="store_true", help="run the real detector and tracker over it")
    parser.add_argument("--image-size", type=int, default=320, help="detector image size for --check")
    args = parser.parse_args(argv)
    scene = Scene(quick=args.quick)
    path = scene.write(args.out) if args.out else scene.video()
    print(f"{path}: {scene.frame_count} frames, {scene.duration_s:.0f} s at {scene.fps} fps, {WIDTH}x{HEIGHT}")
    for event in scene.ground_truth():
        print(
            f"  event {event.index}: {event.start_s:6.1f}-{event.end_s:6.1f} s ({event.duration_s:4.1f} s), "
            f"{event.people} people, {event.label}"
        )
    if args.check:
        from visioncap.bench.detection.shared import detect_and_track, detector_config

        tracked, _ = detect_and_track(path, detector_config(image_size=args.image_size), analyze_fps=None)
        print(json.dumps(detection_quality(scene, tracked), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
