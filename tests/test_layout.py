"""The code layout page (docs/layout.md) is drawn from the tree as it is: every package and module is named there, and
nothing named there is missing from the tree. A module added without a line, or a line left behind by a move,
fails here rather than misleading the next reader."""

from __future__ import annotations

import re

from helpers import REPO

PACKAGE = REPO / "visioncap"
# Entry points and package markers say nothing a reader needs from the layout.
UNLISTED = {"__init__", "__main__"}


def layout_block() -> str:
    return (REPO / "docs" / "layout.md").read_text().split("```", 2)[1]


def names_in_tree() -> dict[str, set[str]]:
    """Package path (relative, '' for visioncap itself) -> the names of its modules and subpackages."""
    tree: dict[str, set[str]] = {}
    for folder in [PACKAGE, *sorted(p.parent for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE)]:
        names = {p.stem for p in folder.glob("*.py")} | {
            p.name for p in folder.iterdir() if (p / "__init__.py").exists()
        }
        tree[str(folder.relative_to(PACKAGE))] = names - UNLISTED
    return tree


def test_every_top_level_module_and_package_has_its_line() -> None:
    block = layout_block()
    listed = set(re.findall(r"^  (\w+)(?:/|\.py)\s", block, re.M))
    assert listed == names_in_tree()["."]


def paragraphs() -> dict[str, str]:
    """Top-level package -> its lines in the block (its own and the deeper-indented ones after it)."""
    found = re.findall(r"^  (\w+)/(.*?)(?=^  \S|^\S|\Z)", layout_block(), re.M | re.S)
    return {name: text for name, text in found}


def test_every_module_is_named_in_its_packages_lines() -> None:
    texts = paragraphs()
    missing = []
    for folder, names in names_in_tree().items():
        if folder == ".":
            continue
        words = set(re.findall(r"\w+", texts.get(folder.split("/")[0], "")))
        missing += [f"{folder}/{name}" for name in sorted(names) if name not in words]
    assert not missing, f"not in their package's lines of docs/layout.md: {missing}"


def test_every_file_named_in_the_layout_exists() -> None:
    named = re.findall(r"\b([\w/]+\.py)\b", layout_block())
    assert named
    found = {path.name for folder in ("visioncap", "tests", "models") for path in (REPO / folder).rglob("*.py")}
    assert not [name for name in named if name.rsplit("/", 1)[-1] not in found]


def test_the_modules_marked_serial_are_the_fuzzers_make_test_unit_runs_in_their_own_process() -> None:
    # make test-unit keeps serial tests away from its xdist workers by file name (FUZZERS), so that the workers need
    # not import them: a serial test elsewhere would run split across workers.
    makefile = (REPO / "Makefile").read_text()
    pattern = re.search(r"^FUZZERS := (\S+)$", makefile, re.M)
    assert pattern is not None
    marked = {
        path.relative_to(REPO)
        for path in (REPO / "tests").glob("*.py")
        if re.search(r"pytest\.mark\.serial\b", path.read_text())
    }
    assert marked and marked == {path.relative_to(REPO) for path in REPO.glob(pattern.group(1))}
