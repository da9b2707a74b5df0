"""What a question asks about: the cameras it names and the time it speaks of, read from its words.

Pure functions of the text, the known camera ids, "now" and the configured time zone. Days are local calendar
days (midnight to midnight in the zone, 23 or 25 hours across a DST change), and clock times are local times of
that day, converted to UTC only at the end. The phrases found are cut from the text, so what is left is what
the question asks about (the search text).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

# Parts of the day as local [start hour, end hour); "tonight" runs into the next day.
PARTS_OF_DAY = {"morning": (5, 12), "afternoon": (12, 17), "evening": (17, 22), "night": (18, 30)}

_NUMBER_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "ten": 10}
_CLOCK = r"(\d{1,2})(?::(\d{2}))?\s*(am|pm|a\.m\.|p\.m\.)?"
_LAST = re.compile(
    r"\b(?:in\s+)?(?:the\s+)?(?:last|past)\s+(?:(\d+|a|an|one|two|three|four|five|six|ten)\s+)?(hours?|minutes?|days?)\b"
)
_DAY = re.compile(
    r"\b(today|yesterday|tonight|this\s+(?:morning|afternoon|evening))(?:\s+(morning|afternoon|evening|night))?\b"
)
_BOUND = re.compile(rf"\b(after|since|before|until)\s+{_CLOCK}(?![\w:])")


@dataclass(frozen=True, slots=True)
class Question:
    """The filters a question implies and the text left to search for."""

    cameras: tuple[str, ...]
    since: datetime | None  # UTC, inclusive
    until: datetime | None  # UTC, exclusive
    search_text: str


def _local(day: date, hours: float, zone: ZoneInfo) -> datetime:
    """`hours` after local midnight of `day` as wall-clock time (hours >= 24 run into the following days)."""
    extra_days, hours = divmod(hours, 24)
    whole = int(hours)
    minutes = round((hours - whole) * 60)
    return datetime.combine(day + timedelta(days=int(extra_days)), time(whole, minutes), tzinfo=zone)


def _hour(hour: str, minute: str | None, meridiem: str | None) -> float | None:
    """The local clock time as hours after midnight; None unless written as a time ("6 pm", "18:00"): a bare
    number ("after 2 cars") is not one."""
    if minute is None and meridiem is None:
        return None
    value = int(hour)
    if meridiem:
        if not 1 <= value <= 12:
            return None
        value = value % 12 + (12 if meridiem.startswith("p") else 0)
    elif value > 23:
        return None
    minutes = int(minute) if minute else 0
    return value + minutes / 60 if minutes < 60 else None


def _camera_forms(camera: str) -> list[str]:
    """How a question may write a camera id: as is, or with its - and _ as spaces ("front door")."""
    lowered = camera.lower()
    spaced = re.sub(r"[-_]+", " ", lowered)
    return list(dict.fromkeys([lowered, spaced]))


def find_cameras(text: str, cameras: Iterable[str]) -> tuple[tuple[str, ...], str]:
    """Known camera ids the text names (whole words, case-insensitive), and the text without them."""
    found: list[str] = []
    # Longest first: "front-door-2" must not be read as "front-door" followed by "2".
    for camera in sorted(set(cameras), key=len, reverse=True):
        for form in _camera_forms(camera):
            pattern = re.compile(rf"(?<![\w-]){re.escape(form)}(?![\w-])")
            if pattern.search(text):
                found.append(camera)
                text = pattern.sub(" ", text)
    return tuple(sorted(found)), text


def find_time(text: str, now: datetime, zone: ZoneInfo) -> tuple[datetime | None, datetime | None, str]:
    """The time range (UTC) the text speaks of, and the text without those phrases; (None, None) when none."""
    local_now = now.astimezone(zone)
    since: datetime | None = None
    until: datetime | None = None
    day: date | None = None
    part: tuple[int, int] | None = None

    last = _LAST.search(text)
    if last is not None:
        count = _NUMBER_WORDS.get(last.group(1) or "a") or int(last.group(1))
        unit = last.group(2).rstrip("s")
        span = {"hour": timedelta(hours=count), "minute": timedelta(minutes=count), "day": timedelta(days=count)}[unit]
        since = now - span
        text = text[: last.start()] + " " + text[last.end() :]

    named = _DAY.search(text)
    if named is not None:
        word, after_word = named.group(1), named.group(2)
        day = local_now.date() - timedelta(days=1) if word == "yesterday" else local_now.date()
        if word == "tonight":
            part = PARTS_OF_DAY["night"]
        elif word.startswith("this"):
            part = PARTS_OF_DAY[word.split()[-1]]
        elif after_word is not None:
            part = PARTS_OF_DAY[after_word]
        text = text[: named.start()] + " " + text[named.end() :]

    bounds: dict[str, float] = {}
    for bound in list(_BOUND.finditer(text))[::-1]:
        hour = _hour(bound.group(2), bound.group(3), bound.group(4))
        if hour is None:
            continue
        bounds["since" if bound.group(1) in ("after", "since") else "until"] = hour
        text = text[: bound.start()] + " " + text[bound.end() :]

    if day is None and bounds:
        day = local_now.date()
    if day is not None:
        start: float
        end: float
        start, end = part if part is not None else (0, 24)
        start = max(start, bounds.get("since", start))
        end = min(end, bounds.get("until", end))
        since = _local(day, start, zone).astimezone(UTC)
        until = _local(day, max(start, end), zone).astimezone(UTC)
    return since, until, text


def read_question(text: str, cameras: Iterable[str], now: datetime, zone: ZoneInfo) -> Question:
    """The cameras and time range `text` names (in `zone`, relative to `now`), and the words left to search."""
    lowered = text.lower()
    found, lowered = find_cameras(lowered, cameras)
    since, until, lowered = find_time(lowered, now, zone)
    # "on the camera", "from cameras": said of the cameras just cut out.
    lowered = re.sub(r"\bcameras?\b", " ", lowered)
    return Question(found, since, until, " ".join(lowered.split()))
