"""The FLOPs axis: the token counts a learner step reports (prefill, generated, trained) against counts
taken independently from the messages, and the 2·N / 6·N formula."""

from __future__ import annotations

import pytest

from scalerl.generator.engine import SamplingParams
from scalerl.generator.role import encode_prompt, length_control
from scalerl.generator.torch_engine import TorchEngine
from scalerl.learner.learner import Learner
from scalerl.messages import PromptTask, RolloutGroup, ScoredGroup
from scalerl.scaling.compute import AXES, axis_column, column_unit, rl_flops


def test_rl_flops_is_2n_per_forward_token_and_6n_per_trained_token() -> None:
    assert rl_flops(1000, prefill_tokens=7, generated_tokens=3, trained_tokens=5) == 2 * 1000 * 10 + 6 * 1000 * 5
    assert rl_flops(10**9, prefill_tokens=0, generated_tokens=0, trained_tokens=10**6) == 6e15
    with pytest.raises(ValueError):
        rl_flops(-1, prefill_tokens=0, generated_tokens=0, trained_tokens=0)


def test_axis_names_and_units() -> None:
    assert AXES == {"device-hours": "compute", "flops": "compute_flops"}
    assert column_unit(axis_column("flops")) == "FLOPs" and column_unit("compute") == "device-hours"
    with pytest.raises(ValueError, match="device-hours, flops"):
        axis_column("gpu-hours")


def test_learner_step_counts_the_tokens_it_processes(tiny_spec, tiny_model, tokenizer) -> None:
    eng = TorchEngine(tiny_model, tokenizer, seed=3)
    groups = []
    for i, rewards in enumerate([[1, -1, 1], [1, 1, 1], [-1, 1, -1]]):  # the middle group: zero variance
        task = PromptTask(f"p{i}", 0, f"{i}+{i * 7}=", str(8 * i), 3, "addition")
        pids = encode_prompt(tokenizer, task.prompt)
        comps = eng.generate([pids] * 3, SamplingParams(), length_control(tiny_spec, tokenizer))
        groups.append(ScoredGroup(RolloutGroup(task, pids, comps), list(rewards), [r > 0 for r in rewards]))
    stats = Learner(tiny_spec, tiny_model, pad_id=0).step(groups)
    # generation: every group received (the filtered one was generated too); each sample prefills its prompt
    prefill = sum(len(g.rollout.prompt_token_ids) * len(g.rollout.completions) for g in groups)
    generated = sum(len(c.token_ids) for g in groups for c in g.rollout.completions)
    # training: the kept groups' sequences, prompt + completion minus the last token (it predicts nothing)
    kept = [groups[0], groups[2]]
    trained = sum(len(g.rollout.prompt_token_ids) + len(c.token_ids) - 1 for g in kept for c in g.rollout.completions)
    assert (stats["tokens/prefill"], stats["tokens/gen"], stats["tokens/train_seq"]) == (prefill, generated, trained)
