"""Learner: staleness bound, zero-variance filter, micro-batch invariance (1×N ≡ N×1), exact loss."""

from __future__ import annotations

import copy

import torch

from scalerl.generator.engine import SamplingParams
from scalerl.generator.role import encode_prompt, length_control
from scalerl.generator.torch_engine import TorchEngine
from scalerl.learner.batch import aggregation_units, assemble
from scalerl.learner.learner import Learner
from scalerl.messages import PromptTask, RolloutGroup, ScoredGroup
from scalerl.model.factory import sequence_logprobs


def _groups(spec, model, tokenizer, rewards_per_group, versions=None):
    eng = TorchEngine(model, tokenizer, seed=7)
    G = len(rewards_per_group[0])
    out = []
    for i, rewards in enumerate(rewards_per_group):
        task = PromptTask(f"p{i}", 0, f"{i}+{i}=", str(2 * i), G, "addition")
        pids = encode_prompt(tokenizer, task.prompt)
        comps = eng.generate([pids] * G, SamplingParams(), length_control(spec, tokenizer))
        if versions is not None:
            for c in comps:
                c.versions = [versions[i]] * len(c.token_ids)
        out.append(ScoredGroup(RolloutGroup(task, pids, comps), list(rewards), [r > 0 for r in rewards]))
    return out


def test_assemble_drops_stale_and_zero_variance(tiny_spec, tiny_model, tokenizer):
    groups = _groups(tiny_spec, tiny_model, tokenizer,
                     [[1, -1, -1, 1], [1, 1, 1, 1], [-1, -1, 1, -1], [1, -1, 1, 1]], versions=[0, 5, 9, 10])
    asm = assemble(groups, version=10, k=8, pad_id=0, zero_variance_filter=True, normalization="batch")
    # group0 is 10 versions old (> k=8): stale. group1 is all-equal: zero variance. 2 and 3 survive.
    assert asm.dropped_stale == 1 and asm.dropped_zero_variance == 1
    assert [g.rollout.task.prompt_id for g in asm.kept_groups] == ["p2", "p3"]
    b = asm.batch
    assert b is not None and b.group_ids.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    # Batch-level normalisation: centred rewards / population std of all centred rewards.
    c = torch.tensor([-0.5, -0.5, 1.5, -0.5, 0.5, -1.5, 0.5, 0.5])
    torch.testing.assert_close(b.advantages, c / (c.std(correction=0) + 1e-6))
    assert b.age.tolist() == [1] * 4 + [0] * 4
    comps = [c for grp in asm.kept_groups for c in grp.rollout.completions]
    # Token ages: only the kept groups' trained tokens, at learner version 10 (p2: version 9, p3: 10).
    kept_tokens = [sum(c.loss_mask) for c in comps]
    assert asm.token_ages == {1: sum(kept_tokens[:4]), 0: sum(kept_tokens[4:])}
    # The completion mask covers exactly the completion tokens the policy chose.
    for row, c in enumerate(comps):
        assert int(b.loss_mask[row].sum()) == sum(c.loss_mask)
        assert torch.equal(b.logp_gen[row][b.loss_mask[row]], torch.tensor(c.logprobs)[torch.tensor(c.loss_mask)])


def test_microbatch_invariance(tiny_spec, tiny_model, tokenizer):
    groups = _groups(tiny_spec, tiny_model, tokenizer,
                     [[1, -1, -1, 1], [-1, -1, 1, -1], [1, -1, 1, 1], [1, -1, -1, -1]])
    params = []
    for mb in (None, 1, 3):
        spec = tiny_spec.model_copy(deep=True)
        spec.train.micro_batch_prompts = mb
        for agg in ("prompt", "sample", "token"):
            spec.loss.aggregation = agg
            model = copy.deepcopy(tiny_model)
            stats = Learner(spec, model, pad_id=0).step(groups)
            params.append((mb, agg, stats["loss/value"], model.state_dict()["lm_head.weight"].clone()))
    for agg in ("prompt", "sample", "token"):
        ref = next(p for p in params if p[1] == agg and p[0] is None)
        for other in [p for p in params if p[1] == agg and p[0] is not None]:
            assert abs(other[2] - ref[2]) < 1e-6
            torch.testing.assert_close(other[3], ref[3], rtol=1e-5, atol=1e-7)


def test_first_step_loss_is_the_hand_formula(tiny_spec, tiny_model, tokenizer):
    """At step 0 ρ = 1, so CISPO + prompt aggregation is −mean_g(Σ A·logp / Σ tokens)."""
    groups = _groups(tiny_spec, tiny_model, tokenizer, [[1, -1, -1, 1], [-1, -1, 1, -1]])
    asm = assemble(groups, version=0, k=8, pad_id=0, zero_variance_filter=True, normalization="batch")
    b = asm.batch
    with torch.no_grad():
        logp, _ = sequence_logprobs(tiny_model, b.input_ids, b.attention_mask, b.targets, fp32_head=True)
    expected = 0.0
    for g in (0, 1):
        rows = b.group_ids == g
        m = b.loss_mask[rows]
        expected += float((b.advantages[rows, None] * logp[rows] * m).sum() / m.sum())
    expected = -expected / 2
    stats = Learner(tiny_spec, copy.deepcopy(tiny_model), pad_id=0).step(groups)
    assert abs(stats["loss/value"] - expected) < 1e-5
    assert stats["loss/ratio_max"] < 1 + 1e-4 and stats["batch/effective"] == 2
    assert aggregation_units(b.loss_mask, b.group_ids, "prompt") == 2
