"""Scorers: the value head's inputs against an independent teacher-forced pass, a save/load round trip,
a head that learns a separable labelling, the Hugging Face reward-model adapter, and the AUC."""

from __future__ import annotations

import random

import pytest
import torch

from scalerl.evaluation.scorer import (
    OutcomeScorer,
    SequenceClassifierScorer,
    ValueHeadModel,
    encode_pair,
    load_scorer,
    right_pad,
)
from scalerl.evaluation.scorer_training import LabelledRollout, ScorerTrainingConfig, auc, train_outcome_scorer
from scalerl.model.factory import sequence_logprobs


def test_auc_hand_computed():
    # pos {0.9, 0.4}, neg {0.5, 0.1}: pairs (0.9>0.5, 0.9>0.1, 0.4<0.5, 0.4>0.1) -> 3/4
    assert auc([0.9, 0.5, 0.4, 0.1], [True, False, True, False]) == 0.75
    assert auc([0.5, 0.5], [True, False]) == 0.5
    assert auc([0.1], [True]) is None


def test_value_features_match_teacher_forced_log_probs(tiny_model, tokenizer):
    model = ValueHeadModel(tiny_model)
    pairs = [encode_pair(tokenizer, "12+3=", "<think>2+3+0=5</think>15"), encode_pair(tokenizer, "7+8=", "<think>1")]
    ids, mask = right_pad([s for s, _ in pairs], tokenizer.pad_token_id)
    feats = model.features(ids, mask, torch.tensor([n for _, n in pairs]))
    H = tiny_model.config.hidden_size
    assert feats.shape == (2, ids.shape[1], H + 3)
    for i, (seq, n_prompt) in enumerate(pairs):
        full = torch.tensor([seq])
        inp, tgt = full[:, :-1], full[:, 1:]
        logp, _ = sequence_logprobs(tiny_model, inp, torch.ones_like(inp), tgt, fp32_head=True)
        want = logp[0, n_prompt - 1:]  # log-probs of the completion tokens, in order
        got = feats[i, n_prompt:len(seq), H]
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        # running min and mean over the completion so far; 0 on the prompt
        for t in range(n_prompt, len(seq)):
            seen = want[:t - n_prompt + 1]
            assert feats[i, t, H + 1].item() == pytest.approx(seen.min().item(), abs=1e-4)
            assert feats[i, t, H + 2].item() == pytest.approx(seen.mean().item(), abs=1e-4)
        assert feats[i, :n_prompt, H:].abs().max().item() == 0.0


def _rollouts(n: int) -> list[LabelledRollout]:
    """Correct iff the completion's answer digit is even (visible to the scorer's hidden state)."""
    rng = random.Random(0)
    out = []
    for i in range(n):
        a = rng.randrange(10)
        out.append(LabelledRollout(prompt_id=f"p{i % 40}", prompt=f"{i % 40}?", completion=f"<think>{a}</think>{a}",
                                   correct=a % 2 == 0))
    return out


def test_head_learns_and_round_trips(tiny_model, tokenizer, tmp_path):
    rollouts = _rollouts(400)
    scorer = train_outcome_scorer(tiny_model, tokenizer, rollouts,
                                  ScorerTrainingConfig(steps=300, batch_size=32, lr=1e-2, heldout_fraction=0.2))
    assert scorer.meta["heldout_auc"] > 0.95 and scorer.meta["train_rollouts"] == 320
    assert all(p.requires_grad for p in tiny_model.parameters())  # the policy itself is left alone
    even, odd = scorer.score(["3?", "3?"], ["<think>4</think>4", "<think>7</think>7"]).values
    assert even > 0.8 > 0.2 > odd
    folder = scorer.save(tmp_path / "scorer")
    loaded = load_scorer(folder)
    assert isinstance(loaded, OutcomeScorer)
    prompts, texts = [r.prompt for r in rollouts[:20]], [r.completion for r in rollouts[:20]]
    a, b = scorer.score(prompts, texts), loaded.score(prompts, texts)
    assert a.values == pytest.approx(b.values, abs=1e-6)
    # forward tokens: BOS + prompt + completion
    assert a.forward_tokens[0] == 1 + len(prompts[0]) + len(tokenizer(texts[0])["input_ids"])


def test_sequence_classifier_adapter(tiny_spec, tokenizer, tmp_path):
    from transformers import LlamaConfig, LlamaForSequenceClassification

    t = tiny_spec.model.tiny
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
                         num_hidden_layers=t.num_layers, num_attention_heads=t.num_heads, num_labels=1,
                         max_position_embeddings=t.max_positions, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    rm = LlamaForSequenceClassification(config).eval()
    rm.save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    scorer = load_scorer(tmp_path / "rm")
    assert isinstance(scorer, SequenceClassifierScorer)
    prompts, comps = ["1+1=", "12+34="], ["<think>1+1+0=2</think>2", "<think>4"]
    got = scorer.score(prompts, comps)
    for p, c, v in zip(prompts, comps, got.values, strict=True):
        ids = torch.tensor([encode_pair(tokenizer, p, c)[0]])
        with torch.no_grad():
            assert v == pytest.approx(rm(input_ids=ids).logits[0, 0].item(), abs=1e-5)
    with pytest.raises(ValueError, match="neither"):
        load_scorer(tmp_path)
