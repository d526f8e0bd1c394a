"""The code's own contracts, checked by the suite (CI runs `make test`, not `make lint`): the import-linter
contracts of pyproject.toml (pure math and the renderer import no I/O, services do not import each other,
the operator's layers, no import cycles), no module-level import cycle at all, no contract that ignores an
import, and ruff. mypy stays in `make lint` (a minute of CPU)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = BIN / name
    found = str(path) if path.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed in {BIN} (make install-dev installs it)")
    return found


def test_import_contracts_are_kept() -> None:
    proc = subprocess.run([_tool("lint-imports")], cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_no_contract_ignores_an_import() -> None:
    # an ignored import is a circle or a layer break accepted rather than removed: what two packages both need
    # goes below both (scalerl.console, scalerl.parts), a command that reads files and draws above the math
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    ignoring = {c["name"]: c["ignore_imports"] for c in contracts if c.get("ignore_imports")}
    assert not ignoring, f"contracts that ignore imports: {ignoring}"


def test_ruff_is_clean() -> None:
    proc = subprocess.run([_tool("ruff"), "check", "services", "operators", "tests", "bench"], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:]


def test_test_modules_have_distinct_names() -> None:
    # the test folders are not packages: pytest imports each module by its file name, and two modules of one
    # name stop the whole collection ("import file mismatch")
    names: dict[str, list[str]] = {}
    for path in (REPO / "tests").rglob("test_*.py"):
        names.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    assert not {n: p for n, p in names.items() if len(p) > 1}


def _reachable(imports: dict[str, set[str]], start: str) -> set[str]:
    """Every module `start` imports, directly or through others (itself only when on a cycle)."""
    seen: set[str] = set()
    todo = list(imports[start])
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(imports[module])
    return seen


def _path(imports: dict[str, set[str]], start: str, within: set[str]) -> list[str]:
    """A shortest cycle `[start, ..., start]` through modules of `within` (breadth-first)."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while start not in came_from:
        following = []
        for node in frontier:
            for child in sorted(imports[node] & within):
                if child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    path = [start, came_from[start]]
    while path[-1] != start:
        path.append(came_from[path[-1]])
    return path[::-1]


def _cycles(imports: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per group of modules that import one another (a strongly connected component)."""
    reach = {m: _reachable(imports, m) for m in imports}
    groups = {frozenset(n for n in reach[m] if m in reach[n]) for m in imports if m in reach[m]}
    return [_path(imports, min(g), set(g)) for g in groups]


def test_cycle_finder_names_each_cycle() -> None:
    # a -> b -> c -> a is one cycle; d -> e -> d another; f is no part of either
    imports = {"a": {"b"}, "b": {"c"}, "c": {"a", "f"}, "d": {"e"}, "e": {"d"}, "f": set()}
    assert sorted(_cycles(imports)) == [["a", "b", "c", "a"], ["d", "e", "d"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_import_cycles() -> None:
    # every import counts, also those inside functions and under TYPE_CHECKING: a factory goes in a module
    # of its own (bus/factory.py), a type both sides need in a third module (evaluation/context.py)
    graph = grimp.build_graph("scalerl", "scalerl_operator", cache_dir=None)
    imports = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    cycles = _cycles(imports)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)
