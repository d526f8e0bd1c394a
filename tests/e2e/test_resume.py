"""Resuming from a checkpoint gives the same next-step loss as an uninterrupted run (PPO-off-policy-1,
where the order of work is fixed), and loses or repeats no prompt."""

from __future__ import annotations

import json

import pytest

from scalerl.config import spec_from_dict
from scalerl.runtime.embedded import EmbeddedRun


def _spec(steps: int):
    return spec_from_dict({
        "name": "resume", "seed": 3,
        "model": {"tiny": {"hidden_size": 48, "intermediate_size": 96, "num_layers": 2, "num_heads": 2,
                           "max_positions": 96}},
        "task": {"kind": "addition", "digits": 1, "train_size": 60, "eval_size": 6},
        "sft": {"steps": 40, "batch_size": 32, "lr": 0.003},
        "generation": {"group_size": 4, "thinking_budget_tokens": 16, "answer_budget_tokens": 4,
                       "interruption": {"window_tokens": [12, 16]}, "prompts_per_batch": 4},
        "off_policy": {"mode": "ppo", "k": 1},
        "optim": {"lr": 1e-3, "warmup_steps": 2},
        "train": {"prompts_per_step": 4, "steps": steps, "checkpoint_every": 2},
        "eval": {"every_steps": 2, "samples_per_prompt": 2},
        "runtime": {"threads": 1},
    })


def _steps(path):
    return [json.loads(line) for line in (path / "train.jsonl").read_text().splitlines()
            if json.loads(line)["kind"] == "step"]


@pytest.mark.timeout(300)
def test_resume_matches_uninterrupted_run(tmp_path):
    full = EmbeddedRun(_spec(4), tmp_path / "full", show_progress=False).run()
    EmbeddedRun(_spec(2), tmp_path / "cut", show_progress=False).run()
    resumed = EmbeddedRun(_spec(4), tmp_path / "cut", resume=True, show_progress=False).run()
    a, b = _steps(tmp_path / "full"), _steps(tmp_path / "cut")
    assert [r["step"] for r in a] == [1, 2, 3, 4] and [r["step"] for r in b] == [1, 2, 3, 4]
    for ra, rb in zip(a, b, strict=True):
        assert ra["effective_batch"] == rb["effective_batch"]
        if ra["loss"] is not None:
            assert rb["loss"] == pytest.approx(ra["loss"], abs=1e-6), (ra["step"], ra["loss"], rb["loss"])
    assert any(r["loss"] is not None for r in a[2:]), "the compared steps must train on something"
    assert resumed["final_pass_rate"] == pytest.approx(full["final_pass_rate"])
    assert resumed["gen_tokens"] == full["gen_tokens"]
