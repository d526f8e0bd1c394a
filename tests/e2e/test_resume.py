"""Resuming from a checkpoint gives the same next-step loss as an uninterrupted run (PPO-off-policy-1,
where the order of work is fixed), and loses or repeats no prompt."""

from __future__ import annotations

import json

import pytest

from scalerl.runtime.embedded import EmbeddedRun
from warm_start import mixed_reward_warm_start


def _steps(path):
    return [json.loads(line) for line in (path / "train.jsonl").read_text().splitlines()
            if json.loads(line)["kind"] == "step"]


@pytest.mark.timeout(900)  # a hang guard: SFT + 3 short runs, 2-4x slower on a loaded machine
def test_resume_matches_uninterrupted_run(tmp_path, addition_run_spec):
    def _spec(steps: int, init: str | None = None):
        return addition_run_spec("resume", init, steps=steps, off_policy={"mode": "ppo", "k": 1},
                                 checkpoint_every=2, eval_every=2)

    # One warm start, shared by both runs, whose groups have mixed rewards by construction (checked)
    init = mixed_reward_warm_start(_spec(4), tmp_path / "warm")
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
