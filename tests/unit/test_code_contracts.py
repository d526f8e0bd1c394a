"""The code's own contracts, checked by the suite (CI runs `make test`, not `make lint`): the import-linter
contracts of pyproject.toml (pure math and the renderer import no I/O, services do not import each other)
and ruff. mypy stays in `make lint` (a minute of CPU)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

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
