"""Resuming from a checkpoint gives the same next-step loss as an uninterrupted run (PPO-off-policy-1,
where the order of work is fixed), and loses or repeats no prompt."""

from __future__ import annotations

import json

import pytest

from scalerl.runtime.embedded import EmbeddedRun
from scalerl.runtime.setup import initial_model, make_task


def _steps(path):
    return [json.loads(line) for line in (path / "train.jsonl").read_text().splitlines()
            if json.loads(line)["kind"] == "step"]


@pytest.mark.timeout(300)
def test_resume_matches_uninterrupted_run(tmp_path, addition_run_spec):
    def _spec(steps: int, init: str | None = None):
        return addition_run_spec("resume", init, steps=steps, off_policy={"mode": "ppo", "k": 1},
                                 checkpoint_every=2, eval_every=2)

    # One SFT warm start (pass rate ~0.3, so groups have mixed rewards), shared by both runs.
    base = _spec(4)
    initial_model(base, make_task(base), tmp_path / "warm")
    init = str(tmp_path / "warm" / "sft")
    full = EmbeddedRun(_spec(4, init), tmp_path / "full", show_progress=False).run()
    EmbeddedRun(_spec(2, init), tmp_path / "cut", show_progress=False).run()
    resumed = EmbeddedRun(_spec(4, init), tmp_path / "cut", resume=True, show_progress=False).run()
    a, b = _steps(tmp_path / "full"), _steps(tmp_path / "cut")
    assert [r["step"] for r in a] == [1, 2, 3, 4] and [r["step"] for r in b] == [1, 2, 3, 4]
    for ra, rb in zip(a, b, strict=True):
        assert ra["effective_batch"] == rb["effective_batch"]
        if ra["loss"] is not None:
            assert rb["loss"] == pytest.approx(ra["loss"], abs=1e-6), (ra["step"], ra["loss"], rb["loss"])
    assert any(r["loss"] is not None for r in a[2:]), "the compared steps must train on something"
    assert resumed["final_pass_rate"] == pytest.approx(full["final_pass_rate"])
    assert resumed["gen_tokens"] == full["gen_tokens"]
