"""visioncap/bench/ is measurement code in rooms of its own: one subpackage per benchmark over `common/`, the
shared library. Its modules import one another without a cycle, `common/` imports no benchmark, and the product
package never imports the measurement code (the command line only mounts the `bench` and `tune` commands).

The graph is read from the source with `ast` (imports at module level, inside functions and under
TYPE_CHECKING alike), so a cycle that only closes at run time, inside a function, fails here too."""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import REPO

PACKAGE = REPO / "visioncap"
BENCH = "visioncap.bench"
# The command line is where the product's commands and the measurement commands meet; nothing else may reach in.
MOUNTS = {"visioncap.cli": {"visioncap.bench.cli", "visioncap.bench.tune.cli"}}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The visioncap modules `path` imports anywhere in its text (`from pkg import module` counts as module)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            found.add(source)
            found.update(f"{source}.{alias.name}" for alias in node.names)
    return found & modules - {name}


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    modules = set(paths)
    return {name: imports_of(path, modules) for name, path in paths.items()}


def in_bench(name: str) -> bool:
    return name == BENCH or name.startswith(BENCH + ".")


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for successor in sorted(graph.get(node, ())):
            if state.get(successor) == 1:
                return [*path[path.index(successor) :], successor]
            if successor not in state and (cycle := visit(successor)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_benchmark_modules_import_one_another_without_a_cycle() -> None:
    graph = {name: {m for m in deps if in_bench(m)} for name, deps in import_graph().items() if in_bench(name)}
    assert len(graph) > 40  # the whole of bench/ was read, not an empty tree
    assert find_cycle(graph) is None, f"an import cycle in visioncap.bench: {' -> '.join(find_cycle(graph) or [])}"


def room_graph() -> dict[str, set[str]]:
    """Which benchmark rooms (bench's subpackages and its top-level modules) import which others."""
    rooms: dict[str, set[str]] = {}
    for name, deps in import_graph().items():
        if in_bench(name) and name != BENCH:
            room = name.split(".")[2]
            others = {m.split(".")[2] for m in deps if in_bench(m) and m != BENCH}
            rooms.setdefault(room, set()).update(others - {room})
    return rooms


def test_the_rooms_import_one_another_without_a_cycle() -> None:
    # A cycle between two rooms makes neither movable nor readable alone (standin and tune once wrote each other's
    # profile blocks): what both need lives in common/.
    rooms = room_graph()
    assert {"common", "mixed", "tune", "standin", "search"} <= set(rooms)
    assert find_cycle(rooms) is None, (
        f"rooms of visioncap.bench import each other: {' -> '.join(find_cycle(rooms) or [])}"
    )


def test_the_guards_see_a_cycle_and_a_function_level_import() -> None:
    # The tests here passing means something only if a cycle is found when there is one, and an import inside a
    # function counts (`bench mixed` reaches mixed.main only from inside its command).
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
    assert "visioncap.bench.mixed.main" in import_graph()["visioncap.bench.cli"]


def test_the_shared_library_imports_no_benchmark() -> None:
    common = f"{BENCH}.common"
    leaks = {
        name: sorted(m for m in deps if in_bench(m) and not m.startswith(common))
        for name, deps in import_graph().items()
        if name.startswith(common)
    }
    assert {name: deps for name, deps in leaks.items() if deps} == {}


def test_the_product_never_imports_the_measurement_code() -> None:
    reached = {
        name: {m for m in deps if in_bench(m)} - MOUNTS.get(name, set())
        for name, deps in import_graph().items()
        if not in_bench(name)
    }
    assert {name: sorted(deps) for name, deps in reached.items() if deps} == {}


def test_the_shared_library_finds_the_repository_from_its_new_room() -> None:
    # machine.REPO is counted up from its own file: a move one folder deeper must move the count with it, or every
    # results path, data folder and `cwd` of a benchmark lands inside the package.
    from visioncap.bench.common.machine import REPO as BENCH_REPO

    assert REPO.resolve() == BENCH_REPO
    assert (BENCH_REPO / "pyproject.toml").is_file()
