"""One-example RL (examples/one_example.yaml): every group the learner trains on comes from the same,
first, training prompt. Shrunk to a tiny model and three steps; the spec's own curriculum is kept."""

from __future__ import annotations

import pytest
import torch

from scalerl.config import load_spec
from scalerl.learner.checkpoint import STATE_FILE
from scalerl.parts import make_task
from scalerl.runtime.embedded import EmbeddedRun

SHRINK = [
    "model.tiny.hidden_size=32", "model.tiny.intermediate_size=64", "model.tiny.num_layers=1",
    "model.tiny.num_heads=2", "model.tiny.max_positions=96", "sft.steps=0", "task.train_size=50",
    "task.eval_size=4", "generation.group_size=4", "generation.thinking_budget_tokens=16",
    "generation.answer_budget_tokens=4", "generation.interruption.window_tokens=[12,16]",
    "generation.prompts_per_batch=4", "off_policy.mode=ppo", "off_policy.k=1", "train.prompts_per_step=4",
    "train.steps=3", "train.checkpoint_every=3", "eval.every_steps=3", "eval.samples_per_prompt=1",
    "runtime.threads=1",
]


@pytest.mark.timeout(300)
def test_one_example_spec_trains_on_exactly_one_prompt(tmp_path):
    spec = load_spec("examples/one_example.yaml", SHRINK)
    assert spec.curriculum.limit_prompts == 1 and not spec.curriculum.no_positive_resampling
    assert spec.task.kind == "addition" and spec.loss.type == "cispo"  # the quickstart underneath
    EmbeddedRun(spec, tmp_path / "run", show_progress=False).run()
    state = torch.load(tmp_path / "run" / "checkpoints" / "step_000003" / STATE_FILE, weights_only=False)
    counts = state["curriculum"]["history"]["counts"]
    first = make_task(spec).problems("train")[0].id
    assert list(counts) == [first]
    # 3 steps x 4 prompt groups x 4 samples, all of that one prompt (each epoch issues it once)
    assert counts[first][1] == 3 * 4 * 4
    assert state["curriculum"]["epoch_order"] == [first]
