"""The project-local environment: the lock files pin every dependency pyproject.toml declares, within
its bounds, and the Makefile installs only into the project's own virtual environment."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
RUNTIME_EXTRAS = ("distributed", "operator")


def _pins(lock: Path) -> dict[str, str]:
    pins = {}
    for line in lock.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)==(\S+)", line)
        if m:
            pins[canonicalize_name(m.group(1))] = m.group(2)
    return pins


def _declared(*extras: str) -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        reqs += [Requirement(r) for r in project["optional-dependencies"][extra]]
    return reqs


def _unmet(reqs: list[Requirement], pins: dict[str, str]) -> list[str]:
    return [f"{r} (locked: {pins.get(canonicalize_name(r.name))})" for r in reqs
            if pins.get(canonicalize_name(r.name)) is None
            or not r.specifier.contains(pins[canonicalize_name(r.name)], prereleases=True)]


def test_runtime_lock_pins_every_declared_dependency_within_its_bounds() -> None:
    pins = _pins(REPO / "requirements/runtime.lock")
    assert _unmet(_declared(*RUNTIME_EXTRAS), pins) == [], "stale lock: run `make lock`"
    assert "torch" in pins and "pytest" not in pins  # runtime only: no test tools


def test_dev_lock_adds_the_tools_and_keeps_every_runtime_pin() -> None:
    runtime, dev = _pins(REPO / "requirements/runtime.lock"), _pins(REPO / "requirements/dev.lock")
    assert _unmet(_declared(*RUNTIME_EXTRAS, "gguf", "dev"), dev) == [], "stale lock: run `make lock`"
    assert {name: dev.get(name) for name in runtime} == runtime  # same versions under `make run` and `make test`


def test_makefile_installs_only_into_the_project_environment() -> None:
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^VENV \?= \.venv$", makefile, re.M)
    installs = [line.strip() for line in makefile.splitlines() if re.search(r"\bpip install\b", line)]
    assert installs, "the Makefile installs something"
    # every install names the environment's interpreter: uv with --python $(PY), or $(PY) -m pip
    assert all("--python $(PY)" in line or line.startswith("$(PY) -m pip") for line in installs), installs
