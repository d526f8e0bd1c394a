"""End to end, embedded: the held-out pass rate rises under the default recipe (PipelineRL-8, CISPO).

The quickstart spec, shortened: SFT warm start, then 100 RL steps (the full quickstart runs 600). On
the development machine the full quickstart passed 0.41 -> 0.55 at step 100 (mean@8, 100 held-out prompts).
"""

from __future__ import annotations

import json

import pytest

from scalerl.config import load_spec
from scalerl.runtime.embedded import EmbeddedRun


@pytest.mark.slow
@pytest.mark.timeout(1200)  # room for a loaded 2-core machine (600 s ran out with two other runs beside it)
def test_pass_rate_rises(tmp_path):
    spec = load_spec("examples/quickstart.yaml", ["train.steps=100", "eval.every_steps=50"])
    summary = EmbeddedRun(spec, tmp_path / "run", show_progress=False).run()
    evals = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 50, 100]
    assert summary["initial_pass_rate"] > 0.1, "the SFT warm start must give RL something to work with"
    assert summary["final_pass_rate"] >= summary["initial_pass_rate"] + 0.05, summary
    assert summary["in_flight_swaps"] > 0  # PipelineRL: weights changed under running sequences
    steps = [json.loads(x) for x in (tmp_path / "run" / "train.jsonl").read_text().splitlines()]
    step_recs = [s for s in steps if s["kind"] == "step"]
    assert len(step_recs) == 100
    assert max(s.get("staleness_max") or 0 for s in step_recs) <= spec.off_policy.k
    assert summary["compute"] == pytest.approx(summary["train_wall_s"] / 3600)
    assert (tmp_path / "run" / "report.html").stat().st_size > 10_000
    assert (tmp_path / "run" / "curve.png").exists()
