"""What the two schema-fuzzing modules (test_fuzz_api, test_fuzz_gateway) share: hypothesis settings and the
tally of answers that their last test checks for coverage."""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict

import hypothesis
import schemathesis
from helpers import ARTIFACTS
from hypothesis.configuration import set_hypothesis_home_dir

# Hypothesis' caches (never an example database: `database=None` below) go with the test artifacts, not into the
# working tree's .hypothesis/.
set_hypothesis_home_dir(ARTIFACTS / "hypothesis")


def settings(max_examples: int) -> hypothesis.settings:
    """Per operation. Derandomized: the same cases on every run, so CI never fails on a case it did not try before.

    VISIONCAP_FUZZ_MAX_EXAMPLES caps the cases per operation: `make test-unit`, the tier run while working, fuzzes
    briefly (its setting is in the Makefile); `make test` and CI fuzz in full."""
    cap = os.environ.get("VISIONCAP_FUZZ_MAX_EXAMPLES")
    return hypothesis.settings(
        max_examples=min(max_examples, int(cap)) if cap else max_examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )


class Tally:
    """Statuses answered per operation, written to test-artifacts/NAME.json and checked for coverage."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.answers: dict[str, Counter[int]] = defaultdict(Counter)  # operation -> status -> cases

    def count(self, case: schemathesis.Case, status: int) -> None:
        self.answers[case.operation.label][status] += 1

    def check_coverage(self, schema: schemathesis.BaseSchema, never_succeeds: frozenset[str] = frozenset()) -> None:
        """Every operation was fuzzed, and each (but `never_succeeds`) answered at least one case with a 2xx."""
        ARTIFACTS.mkdir(exist_ok=True)
        counts = {label: dict(sorted(statuses.items())) for label, statuses in sorted(self.answers.items())}
        (ARTIFACTS / f"{self.name}.json").write_text(json.dumps(counts, indent=1) + "\n")
        operations = {result.ok().label for result in schema.get_all_operations()}
        assert set(self.answers) == operations, operations - set(self.answers)
        for label, statuses in self.answers.items():
            if label not in never_succeeds:
                assert any(200 <= status < 300 for status in statuses), (label, statuses)
