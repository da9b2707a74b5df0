"""Whether a caption matches a rule: pure logic over the caption's stored fields (cooldowns are the engine's)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from visioncap.config.alerts import AlertRule

# Cosine similarity of (rule text, caption text); loaded only when some rule is semantic.
Similarity = Callable[[str, str], float]


@dataclass(frozen=True, slots=True)
class CaptionFacts:
    """What rules look at in one stored caption."""

    caption_id: int
    camera: str
    captured_at: datetime
    text: str
    people_count: int
    structured: dict[str, Any] | None
    zones: tuple[tuple[str, float], ...] = ()  # (zone, dwell_s) of each person standing in a zone

    @property
    def activities(self) -> list[str]:
        found = (self.structured or {}).get("activities")
        return [str(item) for item in found] if isinstance(found, list) else []


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.casefold()))


def matches(rule: AlertRule, facts: CaptionFacts, zone: ZoneInfo, similarity: Similarity | None) -> bool:
    """Every condition the rule gives holds for the caption."""
    if rule.cameras and facts.camera not in rule.cameras:
        return False
    if rule.min_people is not None and facts.people_count < rule.min_people:
        return False
    if rule.max_people is not None and facts.people_count > rule.max_people:
        return False
    if rule.windows:
        local = facts.captured_at.astimezone(zone).time()
        if not any(window.contains(local) for window in rule.windows):
            return False
    if rule.zones or rule.min_dwell_s is not None:
        wanted_zones = set(rule.zones)
        floor = rule.min_dwell_s or 0.0
        if not any((not wanted_zones or zone in wanted_zones) and dwell >= floor for zone, dwell in facts.zones):
            return False
    if rule.words:
        present = _words(facts.text)
        wanted = [word.casefold() for word in rule.words]
        # A rule word of several words ("loading dock") matches as a phrase.
        hits = [
            (word in present) if _words(word) == {word} else re.search(rf"\b{re.escape(word)}\b", facts.text.casefold())
            for word in wanted
        ]
        if not (all(hits) if rule.all_words else any(hits)):
            return False
    if rule.activities:
        doing = [activity.casefold() for activity in facts.activities]
        if not any(wanted.casefold() in activity for wanted in rule.activities for activity in doing):
            return False
    if rule.semantic is not None:
        if similarity is None:
            raise RuntimeError("a semantic rule needs a similarity function")
        if similarity(rule.semantic.text, facts.text) < rule.semantic.threshold:
            return False
    return True


def needs_embeddings(rules: Sequence[AlertRule]) -> bool:
    return any(rule.semantic is not None for rule in rules)
