"""End to end, embedded, under the default recipe (PipelineRL-8, CISPO).

The quickstart spec itself, shortened to 30 SFT and 10 RL steps and a smaller evaluation (what `make run`
trains in full), runs through: evaluations where planned, weights swapped under running sequences, no
trained token older than k, the report written. How far its SFT warm start lands depends on the CPU's
kernels (at the 280 steps of earlier versions 0.41, 0.19 and 0.03 on machines of our kind; at 360, 0.55 and
0.62 with AVX-512 and AVX2 kernels on one), so whether the RL steps lift it by a given margin is not asserted
here (the learning itself is asserted where it does not depend on the kernels:
tests/unit/recipe/test_recipe_policy_improvement.py).
"""

from __future__ import annotations

import json

import pytest

from scalerl.config import load_spec
from scalerl.runtime.embedded import EmbeddedRun

# 32 held-out prompts x 4 samples instead of 100 x 8: the three evaluations were half the test's CPU time, and
# what is asserted of them (planned steps, the paired gain and its interval) does not need more
SMALL_EVAL = ["task.eval_size=32", "eval.samples_per_prompt=4"]


def _records(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.slow
# room for a loaded 2-core machine: 600 s ran out with two other runs beside it, and 1200 s in a cold CI run
# (2026-11-28), where the servers' builds, not niced, take most of both cores during the first half hour
@pytest.mark.timeout(2400)
def test_quickstart_runs_through(tmp_path):
    # 10 RL steps, not 20 (2026-12-07: less CPU for the same checks; PipelineRL-8 swaps weights under running
    # sequences from its first steps, and an evaluation every 5 steps still gives three)
    spec = load_spec("examples/quickstart.yaml", ["sft.steps=30", "train.steps=10", "eval.every_steps=5", *SMALL_EVAL])
    summary = EmbeddedRun(spec, tmp_path / "run", show_progress=False).run()
    evals = _records(tmp_path / "run" / "metrics.jsonl")
    assert [e["step"] for e in evals] == [0, 5, 10]
    assert all(0.0 <= e["pass_rate"] <= 1.0 for e in evals)
    assert summary["in_flight_swaps"] > 0  # PipelineRL: weights changed under running sequences
    step_recs = [s for s in _records(tmp_path / "run" / "train.jsonl") if s["kind"] == "step"]
    assert len(step_recs) == 10
    assert max(s.get("staleness_max") or 0 for s in step_recs) <= spec.off_policy.k
    assert summary["compute"] == pytest.approx(summary["train_wall_s"] / 3600)  # one device
    # The gain is final − initial mean@k over the same prompts, its interval a paired bootstrap around it.
    before, after = evals[0]["prompt_pass_rates"], evals[-1]["prompt_pass_rates"]
    assert summary["gain"] == pytest.approx(sum(a - b for a, b in zip(after, before, strict=True)) / len(before))
    assert summary["gain"] == pytest.approx(summary["final_pass_rate"] - summary["initial_pass_rate"])
    lo, hi = summary["gain_interval"]
    assert lo <= summary["gain"] <= hi and summary["gain_prompts"] == len(before)
    assert (tmp_path / "run" / "report.html").stat().st_size > 10_000
    assert (tmp_path / "run" / "curve.png").exists()

