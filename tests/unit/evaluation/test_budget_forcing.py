"""Budget forcing (s1) runs through the torch engine's forced-token phase, the one the training-time
interruption uses: exact token ids at exact positions, forced tokens masked out of the loss.

The policy here is a deterministic bigram model (the next token is a fixed function of the last one,
decoded greedily), so every completion can be written down by hand:

    BOS -> a -> b -> </think> -> c -> EOS          (the unforced completion: a b </think> c EOS)
    F -> c,  W1 -> W2 -> b                          (after the answer prefix / after "Wait")
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from scalerl.generator.engine import LengthControl, SamplingParams, budget_forcing
from scalerl.generator.torch_engine import TorchEngine

PAD, BOS, EOS, CLOSE, A, B, C, F, W1, W2 = range(10)
V = 10
NEXT = {BOS: A, A: B, B: CLOSE, CLOSE: C, C: EOS, F: C, W1: W2, W2: B, EOS: EOS, PAD: PAD}


class _Trunk(torch.nn.Module):
    """Hidden state = one-hot of the input token (so the head reads off the bigram table)."""

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=True):
        return SimpleNamespace(last_hidden_state=torch.nn.functional.one_hot(input_ids, V).float(),
                               past_key_values=None)


class BigramModel(torch.nn.Module):
    base_model_prefix = "model"

    def __init__(self) -> None:
        super().__init__()
        self.model = _Trunk()
        self.lm_head = torch.nn.Linear(V, V, bias=False)
        with torch.no_grad():
            self.lm_head.weight.fill_(0.0)
            for prev, nxt in NEXT.items():
                self.lm_head.weight[nxt, prev] = 10.0
        self.config = SimpleNamespace(max_position_embeddings=64)

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.lm_head


class _Tok:
    pad_token_id = PAD

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))


def _generate(length: LengthControl, rows: int = 2):
    engine = TorchEngine(BigramModel(), _Tok(), fp32_head=True, seed=0)
    return engine.generate([[BOS]] * rows, SamplingParams(temperature=0.0), length)


BASE = LengthControl(thinking_budget=20, answer_budget=5, think_close_ids=(CLOSE,), eos_id=EOS)


def test_unforced_completion_is_the_bigram_chain():
    for c in _generate(BASE):
        assert c.token_ids == [A, B, CLOSE, C, EOS]
        assert all(c.loss_mask) and c.finish_reason == "stop" and c.thinking_tokens == 3


def test_max_budget_forces_the_delimiter_and_answer_prefix_at_position_B():
    # max_thinking = 1: one thinking token (a), then </think> F forced at positions 1 and 2, then the
    # model answers from F: c, EOS.
    length = budget_forcing(BASE, max_thinking=1, answer_prefix_ids=[F])
    assert length.interruption_ids == (CLOSE, F) and length.window == (1, 1)
    for c in _generate(length):
        assert c.token_ids == [A, CLOSE, F, C, EOS]
        assert c.loss_mask == [True, False, False, True, True]
        assert c.finish_reason == "interrupted" and c.thinking_tokens == 1


def test_max_budget_at_two_cuts_after_b():
    length = budget_forcing(BASE, max_thinking=2)  # a b | </think> forced at position 2 (the model's own
    for c in _generate(length):                      # </think> would also have come there, one step later)
        assert c.token_ids == [A, B, CLOSE, C, EOS]
        assert c.loss_mask == [True, True, False, True, True]


def test_min_budget_replaces_early_close_by_wait_until_min_reached():
    # a(1) b(2) </think> sampled at 2 < 5 thinking tokens -> W1(3) W2(4) forced in its place; then the
    # model: b(5); </think> sampled with 5 >= 5 thinking tokens is accepted -> c EOS.
    length = budget_forcing(BASE, min_thinking=5, wait_ids=[W1, W2], max_waits=3)
    for c in _generate(length):
        assert c.token_ids == [A, B, W1, W2, B, CLOSE, C, EOS]
        assert c.loss_mask == [True, True, False, False, True, True, True, True]
        assert c.thinking_tokens == 6 and c.finish_reason == "stop"


def test_min_budget_stops_after_max_waits():
    # min 100 is never reached: two waits are used, then the third </think> is accepted.
    length = budget_forcing(BASE, min_thinking=100, wait_ids=[W1, W2], max_waits=2)
    for c in _generate(length):
        assert c.token_ids == [A, B, W1, W2, B, W1, W2, B, CLOSE, C, EOS]
        forced = [i for i, m in enumerate(c.loss_mask) if not m]
        assert forced == [2, 3, 5, 6]


def test_min_and_max_together_interrupt_after_the_wait():
    # a b W1 W2 (4 thinking tokens >= max 4) -> the interruption (</think> F) follows the wait directly.
    length = budget_forcing(BASE, max_thinking=4, answer_prefix_ids=[F], min_thinking=10, wait_ids=[W1, W2],
                            max_waits=5)
    for c in _generate(length):
        assert c.token_ids == [A, B, W1, W2, CLOSE, F, C, EOS]
        assert c.loss_mask == [True, True, False, False, False, False, True, True]
        assert c.finish_reason == "interrupted"


def test_stop_ids_end_a_step():
    length = LengthControl(thinking_budget=20, answer_budget=5, think_close_ids=(CLOSE,), eos_id=EOS, stop_ids=(B,))
    for c in _generate(length):
        assert c.token_ids == [A, B] and c.finish_reason == "stop"


def test_forced_log_probs_are_recorded_but_masked():
    length = budget_forcing(BASE, max_thinking=1, answer_prefix_ids=[F])
    c = _generate(length, rows=1)[0]
    # the policy puts ~all mass on b after a; the forced </think> has log-prob ~ -10, and is masked
    assert c.logprobs[1] < -9.0 and not c.loss_mask[1]
    assert c.logprobs[0] > -1e-3


def test_bad_rules_are_rejected():
    with pytest.raises(ValueError, match="wait_ids"):
        LengthControl(thinking_budget=4, answer_budget=2, think_close_ids=(CLOSE,), eos_id=EOS, max_waits=1)
    with pytest.raises(ValueError, match="max_thinking"):
        budget_forcing(BASE, max_thinking=0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1.0)


@pytest.mark.parametrize("kwargs", [
    {"max_thinking": 3, "answer_prefix_ids": (F,)},
    {"max_thinking": 5},
    {"min_thinking": 4, "wait_ids": (W1, W2), "max_waits": 2},
    {"max_thinking": 6, "answer_prefix_ids": (F, C), "min_thinking": 2, "wait_ids": (W1,), "max_waits": 1},
])
def test_budget_forcing_of_inverts_budget_forcing(kwargs) -> None:
    """What a generator service is sent (`budget_forcing_of`) rebuilds the same rules on its side."""
    from scalerl.generator.engine import budget_forcing_of

    base = LengthControl(thinking_budget=8, answer_budget=4, interruption_ids=None, think_close_ids=(CLOSE,),
                         eos_id=EOS, window=(8, 8))
    forced = budget_forcing(base, **kwargs)
    sent = budget_forcing_of(forced)
    assert sent is not None
    assert budget_forcing(base, **sent) == forced
    assert budget_forcing_of(base) is None  # plain rules: nothing to send
