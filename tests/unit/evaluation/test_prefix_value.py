"""The partial-state value: Monte-Carlo labels of every step prefix from chain outcomes (hand-computed),
training at the state's last token only, and its held-out report."""

from __future__ import annotations

import pytest
import torch

from scalerl.evaluation.scorer import ValueHeadModel
from scalerl.evaluation.scorer_training import (
    LabelledPrefix,
    ScorerTrainingConfig,
    _featurise,
    prefix_value_labels,
    train_prefix_value,
)


def test_prefix_labels_are_the_fraction_of_chains_through_a_state_that_won():
    a, ab, ac = "<think>5*3=15", "<think>5*3=15,15+7=22", "<think>5*3=15,15-7=8"
    chains = [
        ("p1", "3 5 7 -> 22:", [a, ab], True),
        ("p1", "3 5 7 -> 22:", [a, ac], False),
        ("p1", "3 5 7 -> 22:", [a, ab], True),
        ("p1", "3 5 7 -> 22:", ["<think>7+5=12"], False),
        ("p2", "1 2 9 -> 11:", ["<think>9+2=11", "<think>9+2=11"], True),  # a state listed twice counts once
        ("p2", "1 2 9 -> 11:", [a], False),  # the same text under another problem is another state
    ]
    got = {(x.prompt_id, x.prefix): x.value for x in prefix_value_labels(chains)}
    assert got == {("p1", a): pytest.approx(2 / 3), ("p1", ab): 1.0, ("p1", ac): 0.0, ("p1", "<think>7+5=12"): 0.0,
                   ("p2", "<think>9+2=11"): 1.0, ("p2", a): 0.0}
    assert [x.prompt for x in prefix_value_labels(chains) if x.prompt_id == "p2"] == ["1 2 9 -> 11:"] * 2


def test_last_only_features_are_the_last_row_of_the_full_ones(tiny_model, tokenizer):
    model = ValueHeadModel(tiny_model)
    items = [("3 5 7 -> 22:", "<think>5*3=15", 1.0), ("1 2 -> 3:", "<think>2+1=3,", 0.25)]
    full = _featurise(model, tokenizer, items, torch.device("cpu"))
    last = _featurise(model, tokenizer, items, torch.device("cpu"), last_only=True)
    for (f, y), (g, z) in zip(full, last, strict=True):
        assert g.shape[0] == 1 and torch.allclose(g[0], f[-1]) and float(y) == float(z)
    assert float(last[1][1]) == 0.25  # soft labels are kept as they are


def test_prefix_value_learns_a_visible_rule(tiny_model, tokenizer):
    # the label is 0.9 when the last step's result is even, 0.1 when odd: learnable from the last tokens
    prefixes = []
    for i in range(300):
        c = 10 + i % 17
        prefixes.append(LabelledPrefix(f"p{i % 30}", f"{i % 30} 1 -> 5:", f"<think>{c}+1={c + 1}",
                                       0.9 if (c + 1) % 2 == 0 else 0.1))
    scorer, held = train_prefix_value(tiny_model, tokenizer, prefixes,
                                      ScorerTrainingConfig(steps=300, batch_size=32, lr=1e-2, heldout_fraction=0.2))
    assert len(held) == 60 and scorer.meta["train_prefixes"] == 240
    assert scorer.meta["heldout_auc_vs_mc_label"] > 0.9
    even, odd = scorer.score(["3 1 -> 5:"] * 2, ["<think>13+1=14", "<think>14+1=15"]).values
    assert even > odd


def test_no_labelled_prefixes_is_a_one_line_error_of_scalerl_eval(tiny_model, tokenizer, monkeypatch, capsys):
    """A policy that never writes a legal step leaves the prefix value nothing to learn: `scalerl eval`
    says so in one line and exits 1 (no traceback)."""
    import argparse

    from scalerl.evaluation import commands, session
    from scalerl.evaluation.scorer_training import ScorerDataError

    with pytest.raises(ScorerDataError, match="no legal step"):
        train_prefix_value(tiny_model, tokenizer, [], ScorerTrainingConfig())

    def no_prefixes(_plan):
        train_prefix_value(tiny_model, tokenizer, [], ScorerTrainingConfig())

    monkeypatch.setattr(commands, "plan", lambda args: object())
    monkeypatch.setattr(session, "run_plan", no_prefixes)
    assert commands.eval_command(argparse.Namespace()) == 1
    err = capsys.readouterr().err
    assert err.startswith("scalerl eval: error: the prefix value needs labelled prefixes") and err.count("\n") == 1
