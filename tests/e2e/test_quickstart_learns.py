"""End to end, embedded: the held-out pass rate rises under the default recipe (PipelineRL-8, CISPO)."""

from __future__ import annotations

import json

import pytest

from scalerl.config import load_spec
from scalerl.runtime.embedded import EmbeddedRun


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_pass_rate_rises(tmp_path):
    spec = load_spec("examples/quickstart.yaml", [
        "task.digits=2", "sft.steps=60", "train.steps=40", "eval.every_steps=20", "task.eval_size=64",
        "model.tiny.num_layers=2",
    ])
    summary = EmbeddedRun(spec, tmp_path / "run", show_progress=False).run()
    evals = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 20, 40]
    assert summary["final_pass_rate"] >= summary["initial_pass_rate"] + 0.1, summary
    assert summary["in_flight_swaps"] > 0  # PipelineRL: weights changed under running sequences
    steps = [json.loads(x) for x in (tmp_path / "run" / "train.jsonl").read_text().splitlines()]
    assert max(s.get("staleness_max") or 0 for s in steps if s["kind"] == "step") <= spec.off_policy.k
