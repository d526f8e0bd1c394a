"""Every job spec in examples/ is valid and runnable here: it loads (`extends` included) and the checks
`scalerl run` makes before any work (`scalerl.runtime.preflight.spec_problems`) find nothing. The recipe
presets (examples/recipes/) and the plugin example have tests of their own; rljob.yaml is an RLJob."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalerl.config import load_spec
from scalerl.runtime.preflight import spec_problems

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
SPECS = sorted(p for p in EXAMPLES.glob("*.yaml") if p.name != "rljob.yaml")


def test_the_examples_are_found() -> None:
    assert {"quickstart.yaml", "tool-use.yaml", "code.yaml"} <= {p.name for p in SPECS}


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_an_example_spec_loads_and_passes_the_checks_before_a_run(path: Path) -> None:
    spec = load_spec(path)
    assert spec_problems(spec) == []
