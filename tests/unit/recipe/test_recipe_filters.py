"""Zero-variance filtering and No-Positive-Resampling (spec §2.6, §2.7, §6.5, §6.10)."""

from __future__ import annotations

import json

import pytest
import torch

from scalerl.recipe import NPR_THRESHOLD, PassRateHistory, npr_keep, zero_variance_mask


def test_zero_variance_mask_keeps_only_groups_with_unequal_rewards() -> None:
    #  index:   0   1   2   3   4   5   6   7
    #  group:  40  -3  40  -3  17  40   8   8
    #  reward: +1  -1  +1  -1  +1  -1  +1  +1
    # group 40 = (+1, +1, −1): mixed -> keep;  group −3 = (−1, −1): all wrong -> drop
    # group 17 = (+1): a group of one has nothing to compare -> drop;  group 8 = (+1, +1): all right -> drop
    rewards = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, 1.0])
    groups = torch.tensor([40, -3, 40, -3, 17, 40, 8, 8])
    expected = torch.tensor([True, False, True, False, False, True, False, False])
    assert torch.equal(zero_variance_mask(rewards, groups), expected)


def test_zero_variance_mask_tolerance_and_non_binary_rewards() -> None:
    rewards = torch.tensor([0.5, 0.5 + 1e-12, 0.5, 0.5 + 1e-6], dtype=torch.float64)
    groups = torch.tensor([0, 0, 1, 1])
    # group 0 differs by 1e-12 < 1e-9 -> equal (drop); group 1 differs by 1e-6 -> keep
    assert zero_variance_mask(rewards, groups).tolist() == [False, False, True, True]


def test_zero_variance_mask_empty_and_bad_shapes() -> None:
    assert zero_variance_mask(torch.zeros(0), torch.zeros(0, dtype=torch.long)).shape == (0,)
    with pytest.raises(ValueError, match=r"\[N\]"):
        zero_variance_mask(torch.zeros(3), torch.zeros(2, dtype=torch.long))


def test_pass_rate_is_cumulative_over_observations() -> None:
    h = PassRateHistory()
    assert h.pass_rate("p") is None
    h.update("p", 16, 16)  # a lucky first group...
    h.update("p", 4, 16)  # ...then a poor one: cumulative (16 + 4) / 32 = 0.625, not the latest 0.25
    assert h.pass_rate("p") == pytest.approx(0.625)
    assert h.retired() == set()
    assert "p" in h and "q" not in h and len(h) == 1


def test_threshold_boundary_is_inclusive() -> None:
    h = PassRateHistory()
    h.update("exactly_0.9", 9, 10)  # 9/10 = 0.9 -> retired (≥ 0.9)
    h.update("0.89", 89, 100)  # 0.89 < 0.9 -> kept
    h.update("perfect", 16, 16)
    h.update("no_data", 0, 0)  # recorded but no completions: no rate, never retired
    assert NPR_THRESHOLD == 0.9
    assert h.retired() == {"exactly_0.9", "perfect"}
    assert h.retired(threshold=0.89) == {"exactly_0.9", "0.89", "perfect"}
    assert h.pass_rate("no_data") is None


def test_npr_keep_preserves_order_and_keeps_unseen_prompts() -> None:
    h = PassRateHistory()
    h.update("easy", 15, 16)
    h.update("hard", 1, 16)
    ids = ["hard", "new", "easy", "hard"]
    assert npr_keep(ids, h) == ["hard", "new", "hard"]
    assert npr_keep(ids, h, threshold=1.0) == ids  # 15/16 < 1.0


def test_state_dict_round_trips_through_json() -> None:
    h = PassRateHistory()
    h.update("a", 3, 16)
    h.update("b", 15, 16)
    h.update("a", 5, 16)
    restored = PassRateHistory()
    restored.update("stale", 1, 1)  # load replaces, not merges
    restored.load_state_dict(json.loads(json.dumps(h.state_dict())))
    assert restored.state_dict() == h.state_dict()
    assert restored.pass_rate("a") == pytest.approx(8 / 32)
    assert restored.pass_rate("stale") is None
    assert restored.retired() == {"b"}


def test_invalid_inputs_raise() -> None:
    h = PassRateHistory()
    with pytest.raises(ValueError, match="n_correct"):
        h.update("p", 5, 4)
    with pytest.raises(ValueError, match="n_correct"):
        h.update("p", -1, 4)
    with pytest.raises(ValueError, match="threshold"):
        h.retired(threshold=0.0)
    with pytest.raises(ValueError, match="threshold"):
        npr_keep(["p"], h, threshold=1.5)
    with pytest.raises(ValueError, match="version"):
        h.load_state_dict({"version": 99, "counts": {}})
    with pytest.raises(ValueError, match="corrupt"):
        h.load_state_dict({"version": 1, "counts": {"p": [5, 4]}})
