"""Candidate serving values and the profile each candidate runs with."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from visioncap.config.profiles import ModelProfile
from visioncap.errors import ConfigError

# Budgets tried when none are given. On a CPU a step costs milliseconds per token, so the range that matters
# is small; on a data-centre GPU vLLM's own API-server default (8192) sits in the middle of the range.
DEFAULT_BUDGETS: dict[str, tuple[int, ...]] = {
    "cpu": (128, 256, 512, 1024),
    "gpu": (2048, 4096, 8192, 16384),
}


@dataclass(frozen=True)
class Candidate:
    """One combination of serving values to measure."""

    max_num_batched_tokens: int
    long_prefill_token_threshold: int | None = None

    @property
    def label(self) -> str:
        if self.long_prefill_token_threshold is None:
            return str(self.max_num_batched_tokens)
        return f"{self.max_num_batched_tokens}/{self.long_prefill_token_threshold}"


def parse_int_list(text: str, option: str) -> list[int]:
    """`128,256,512` -> [128, 256, 512]; anything else is a ConfigError naming the option."""
    values = []
    for part in text.split(","):
        part = part.strip()
        if not re.fullmatch(r"[0-9]+", part) or int(part) <= 0:
            raise ConfigError(f"{option}: {part!r} is not a positive whole number (expected e.g. 128,256,512)")
        values.append(int(part))
    if len(set(values)) != len(values):
        raise ConfigError(f"{option}: {text!r} names a value twice")
    return values


def build_candidates(
    budgets: list[int], thresholds: list[int] | None, max_model_len: int | None, max_num_seqs: int | None
) -> list[Candidate]:
    """Every budget (x every threshold), checked against the limits vLLM enforces at start-up.

    Checking here turns a candidate vLLM would refuse into one clear line before any server starts.
    """
    for budget in budgets:
        if max_num_seqs is not None and budget < max_num_seqs:
            raise ConfigError(
                f"--budgets: {budget} is below the profile's max_num_seqs ({max_num_seqs}); vLLM refuses that"
            )
    for threshold in thresholds or ():
        if max_model_len is not None and threshold > max_model_len:
            raise ConfigError(f"--thresholds: {threshold} is above the profile's max_model_len ({max_model_len})")
    if not thresholds:
        candidates = [Candidate(budget) for budget in budgets]
    else:
        candidates = [
            Candidate(budget, threshold)
            for budget, threshold in itertools.product(budgets, thresholds)
            if threshold <= budget  # a cap above the budget never binds
        ]
    if len(candidates) < 2:
        raise ConfigError(
            "--budgets/--thresholds: give at least two candidates to compare (e.g. --budgets 128,512; "
            "thresholds above every budget are dropped)"
        )
    return candidates


def default_budgets(gpu_class: str) -> list[int]:
    return list(DEFAULT_BUDGETS["cpu" if gpu_class == "cpu" else "gpu"])


def candidate_profile(profile: ModelProfile, gpu_class: str, candidate: Candidate) -> ModelProfile:
    """The profile with the candidate's values as the GPU class's serving values."""
    values: dict[str, int] = {"max_num_batched_tokens": candidate.max_num_batched_tokens}
    if candidate.long_prefill_token_threshold is not None:
        values["long_prefill_token_threshold"] = candidate.long_prefill_token_threshold
    return profile.with_serving(gpu_class, **values)
