"""Torch engine: FP32-head log-probs match the learner's; in-flight swaps stamp versions; forced
interruption injects the phrase at the cut, masked out of the loss; budgets truncate."""

from __future__ import annotations

import torch

from scalerl.generator.engine import LengthControl, SamplingParams
from scalerl.generator.role import batch_staleness, encode_prompt, length_control
from scalerl.generator.torch_engine import ANSWER, DONE, FORCED, THINKING, TorchEngine
from scalerl.messages import Completion
from scalerl.model.factory import build_tiny_model, sequence_logprobs


def _prompts(tokenizer, texts, g):
    return [encode_prompt(tokenizer, t) for t in texts for _ in range(g)]


def test_generator_logprobs_match_teacher_forced_learner(tiny_spec, tiny_model, tokenizer):
    eng = TorchEngine(tiny_model, tokenizer, fp32_head=True, seed=1)
    prompts = _prompts(tokenizer, ["12+34=", "7+8="], 3)
    comps = eng.generate(prompts, SamplingParams(), length_control(tiny_spec, tokenizer))
    worst = 0.0
    for p, c in zip(prompts, comps, strict=True):
        full = torch.tensor([p + c.token_ids])
        inp, tgt = full[:, :-1], full[:, 1:]
        logp, _ = sequence_logprobs(tiny_model, inp, torch.ones_like(inp), tgt, fp32_head=True)
        diff = (logp[0, len(p) - 1:] - torch.tensor(c.logprobs)).abs().max().item()
        worst = max(worst, diff)
        assert set(c.versions) == {0}
    assert worst < 1e-4, f"|log rho| at step 0 = {worst}"


def test_hot_swap_between_decode_steps_stamps_new_version(tiny_spec, tiny_model, tokenizer):
    new = build_tiny_model(tiny_spec.model, tokenizer, seed=123).state_dict()
    eng = TorchEngine(tiny_model, tokenizer, seed=0)
    calls = {"n": 0}

    def source():
        calls["n"] += 1
        return (1, new) if calls["n"] == 3 else None  # announced after the 3rd decode step

    length = LengthControl(thinking_budget=10, answer_budget=2, think_close_ids=(10**6,), eos_id=10**6)
    comps = eng.generate(_prompts(tokenizer, ["1+1="], 4), SamplingParams(), length, policy_source=source)
    assert eng.version == 1 and eng.swaps_in_flight == 1
    for c in comps:
        assert c.versions[:3] == [0, 0, 0] and set(c.versions[3:]) == {1}
        assert (c.min_version, c.max_version) == (0, 1)
    torch.testing.assert_close(tiny_model.state_dict()["lm_head.weight"], new["lm_head.weight"])


def test_forced_interruption_injects_masked_phrase(tiny_spec, tiny_model, tokenizer):
    spec = tiny_spec.model_copy(deep=True)
    spec.generation.interruption.window_tokens = (2, 2)
    length = length_control(spec, tokenizer)
    phrase = list(length.interruption_ids or ())
    assert phrase[-1] == tokenizer.convert_tokens_to_ids("</think>") and len(phrase) > 10
    eng = TorchEngine(tiny_model, tokenizer, seed=3)
    comps = eng.generate(_prompts(tokenizer, ["5+5="], 16), SamplingParams(), length)
    interrupted = [c for c in comps if c.finish_reason in ("interrupted",) or len(c.token_ids) > 2 + len(phrase)]
    assert interrupted, "a random model should almost never close its thinking within 2 tokens"
    for c in comps:
        assert len(c.token_ids) <= 2 + len(phrase) + length.answer_budget
        if c.thinking_tokens == 2 and len(c.token_ids) > 2:
            assert c.token_ids[2:2 + len(phrase)] == phrase
            assert c.loss_mask == [True] * 2 + [False] * len(phrase) + [True] * (len(c.token_ids) - 2 - len(phrase))
            assert c.finish_reason in ("interrupted", "length")
            assert c.finish_reason == "length" or c.token_ids[-1] == tokenizer.eos_token_id


def test_state_machine_transitions():
    """The controller alone, on hand-made tokens: CLOSE=7, EOS=9, phrase of 2 tokens, cut at 2."""
    B = 4
    length = LengthControl(thinking_budget=5, answer_budget=2, think_close_ids=(7,), eos_id=9,
                           interruption_ids=(5, 7), window=(2, 2))
    phase = torch.full((B,), THINKING)
    n_think, n_answer, fpos = (torch.zeros(B, dtype=torch.long) for _ in range(3))
    cut = torch.full((B,), 2)
    intr, trunc = torch.zeros(B, dtype=torch.bool), torch.zeros(B, dtype=torch.bool)

    def step(tokens):
        live = phase != DONE
        forced = phase == FORCED
        TorchEngine._advance(phase, torch.tensor(tokens), live, forced, n_think, n_answer, fpos, cut, intr, trunc,
                             length, 2)

    # row0: thinks "1", closes -> answer; row1: EOS while thinking; row2: hits the cut; row3: thinks on.
    step([1, 9, 1, 1])
    assert phase.tolist() == [THINKING, DONE, THINKING, THINKING]
    step([7, 0, 1, 1])
    assert phase.tolist() == [ANSWER, DONE, FORCED, FORCED] and intr.tolist() == [False, False, True, True]
    step([3, 0, 5, 5])  # rows 2,3 receive the forced phrase tokens
    step([3, 0, 7, 7])
    assert phase.tolist() == [DONE, DONE, ANSWER, ANSWER] and trunc.tolist() == [True, False, False, False]
    step([0, 0, 9, 1])
    step([0, 0, 0, 1])
    assert phase.tolist() == [DONE, DONE, DONE, DONE] and trunc.tolist() == [True, False, False, True]


def test_length_penalty_mode_truncates_at_budget(tiny_spec, tiny_model, tokenizer):
    spec = tiny_spec.model_copy(deep=True)
    spec.generation.length_control = "length_penalty"
    length = length_control(spec, tokenizer)
    assert length.interruption_ids is None
    engine = TorchEngine(tiny_model, tokenizer, seed=5)
    comps = engine.generate(_prompts(tokenizer, ["9+9="], 8), SamplingParams(), length)
    for c in comps:
        assert all(c.loss_mask)
        assert len(c.token_ids) <= length.thinking_budget + length.answer_budget
        if c.thinking_tokens >= length.thinking_budget:
            assert c.finish_reason == "length"


def test_batch_staleness_is_the_newest_announcement_minus_the_oldest_version_in_the_batch():
    def comp(versions):
        n = len(versions)
        return Completion(token_ids=[1] * n, logprobs=[0.0] * n, versions=versions, loss_mask=[True] * n,
                          finish_reason="stop", text="")

    swapped, old = comp([3, 3, 4, 4]), comp([2, 2])  # an in-flight swap 3 -> 4; a sequence started at 2
    assert batch_staleness(5, [swapped, old]) == 5 - 2
    assert batch_staleness(4, [swapped]) == 4 - 3
    assert batch_staleness(0, []) == 0
