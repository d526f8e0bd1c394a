"""Two builds of the operator for the upgrade test (test_helm_upgrade.py), under an API group of the
test's own, so the test never swaps the schema of the RLJob CRD other tests on the same API server use.

- "current": the operator as it is; "next": the same operator whose JobSpec has two more defaulted
  fields (a top-level one, `new_knob`, and one inside `train`, `warmup_ratio`): what a release that
  adds JobSpec fields ships.
- `chart_crd(group, build)`: the text of the chart's files/rljob-crd.yaml of that build, under `group`
  (the current build's is the file the chart ships; the next build's is generated the way
  scripts/gen_crd.sh generates it).
- `python upgrade_build.py GROUP BUILD ARGS...` runs `python -m scalerl_operator ARGS` of that build
  with its RLJob handlers and paths on GROUP (kopf binds the handlers to the group when the operator
  module is imported, hence a process of its own per build).
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import Field

import scalerl.config
from scalerl.config import JobSpec, TrainConfig

BUILDS = ("current", "next")
CHART_CRD = Path(__file__).resolve().parents[2] / "helm" / "scalerl" / "files" / "rljob-crd.yaml"
SHIPPED_GROUP = "scalerl.dev"


class TrainNext(TrainConfig):
    warmup_ratio: float = Field(0.0, ge=0.0, le=1.0, description="A field the next operator adds.")


class JobSpecNext(JobSpec):
    train: TrainNext = Field(default_factory=TrainNext)
    new_knob: int = Field(7, ge=0, description="Another field the next operator adds.")


def _use_build(build: str) -> None:
    """Make `build`'s JobSpec the one the operator's modules import (before they are imported)."""
    if build not in BUILDS:
        raise SystemExit(f"upgrade_build: BUILD must be one of {', '.join(BUILDS)}, got {build!r}")
    if build == "next":
        scalerl.config.JobSpec = JobSpecNext  # type: ignore[misc]


def _regroup(text: str, group: str) -> str:
    """The CRD text under `group`: its name and spec.group (each exactly once), nothing else changed."""
    for old, new in ((f"  name: rljobs.{SHIPPED_GROUP}\n", f"  name: rljobs.{group}\n"),
                     (f"  group: {SHIPPED_GROUP}\n", f"  group: {group}\n")):
        assert text.count(old) == 1, f"{old.strip()!r} is not in the CRD exactly once"
        text = text.replace(old, new)
    return text


def chart_crd(group: str, build: str) -> str:
    """files/rljob-crd.yaml of `build`, under `group`."""
    if build == "current":
        return _regroup(CHART_CRD.read_text(), group)
    from scalerl_operator.api import crd

    shipped = crd.JobSpec
    crd.JobSpec = JobSpecNext  # type: ignore[misc]
    try:
        return _regroup(crd.crd_yaml(), group)
    finally:
        crd.JobSpec = shipped  # type: ignore[misc]


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python upgrade_build.py GROUP BUILD [operator args...]", file=sys.stderr)
        return 2
    group, build, args = argv[0], argv[1], argv[2:]
    _use_build(build)
    from scalerl_operator.api import spec

    spec.GROUP, spec.API_VERSION = group, f"{group}/{spec.VERSION}"  # before kube, crd, operator import them
    from scalerl_operator.__main__ import main as operator_main

    return operator_main(args)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
