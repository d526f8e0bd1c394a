"""Plugin distributions laid out the way an installer lays them out, in a folder of the test's own.

An installed distribution is, to `importlib.metadata`, a `<name>-<version>.dist-info` folder with a
METADATA and an entry_points.txt beside its modules on `sys.path`. Writing one into a temporary folder
and putting that folder on `sys.path` (in-process) or `PYTHONPATH` (a `scalerl` subprocess) is what
`pip install` of the plugin does, without touching the shared environment: nothing is left behind when
the folder goes.
"""

from __future__ import annotations

import shutil
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_PLUGIN = REPO / "examples" / "plugin"


def write_dist(root: Path, name: str, entry_points: dict[str, dict[str, str]],
               modules: dict[str, str] | None = None, version: str = "0.1.0") -> Path:
    """A distribution `name` in `root`: `entry_points` is {group: {entry name: "module:attr"}}, `modules`
    {file name: source} written beside it. Returns `root`."""
    root.mkdir(parents=True, exist_ok=True)
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = []
    for group, entries in entry_points.items():
        lines.append(f"[{group}]")
        lines += [f"{key} = {value}" for key, value in entries.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    for file, source in (modules or {}).items():
        (root / file).write_text(source)
    return root


def install_example_plugin(root: Path) -> Path:
    """examples/plugin (scalerl-reverse) into `root`: its package folder and the entry points its
    pyproject.toml declares, so a wrong entry point in the example's pyproject fails the tests."""
    project = tomllib.loads((EXAMPLE_PLUGIN / "pyproject.toml").read_text())["project"]
    for package in ("scalerl_reverse",):
        shutil.copytree(EXAMPLE_PLUGIN / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    return write_dist(root, project["name"], project["entry-points"], version=project["version"])


def forget_modules(*names: str) -> None:
    """Drop `names` and their submodules from `sys.modules` (a plugin imported in-process by a test)."""
    for loaded in [m for m in sys.modules if m in names or m.startswith(tuple(f"{n}." for n in names))]:
        del sys.modules[loaded]
