"""group_advantages: hand-worked cases and a naive-loop reference (spec §2.5, §6.6)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from scalerl.recipe import NORMALIZATIONS, group_advantages

EPS = 1e-6

# Labels are interleaved and non-contiguous on purpose.
#   index:    0   1   2   3   4   5
#   group:    7   3   7  42   3   7
#   reward:  +1  +1  -1  +1  -1  +1
# group 7 = {0, 2, 5}: rewards (1, -1, 1), mean 1/3, centred (2/3, -4/3, 2/3),
#           var = (4/9 + 16/9 + 4/9) / 3 = 8/9, std = 2√2/3
# group 3 = {1, 4}:    rewards (1, -1), mean 0, centred (1, -1), std 1
# group 42 = {3}:      a group of one: mean 1, centred 0, std 0
REWARDS = torch.tensor([1.0, 1.0, -1.0, 1.0, -1.0, 1.0], dtype=torch.float64)
GROUPS = torch.tensor([7, 3, 7, 42, 3, 7])
CENTRED = [2 / 3, 1.0, -4 / 3, 0.0, -1.0, 2 / 3]


def test_none_is_group_centred_only() -> None:
    got = group_advantages(REWARDS, GROUPS, normalization="none")
    assert_close(got, torch.tensor(CENTRED, dtype=torch.float64))


def test_group_divides_by_each_groups_population_std() -> None:
    std7 = 2 * math.sqrt(2) / 3  # (2/3) / std7 = 1/√2,  (-4/3) / std7 = -√2
    expected = [
        (2 / 3) / (std7 + EPS),
        1.0 / (1.0 + EPS),
        (-4 / 3) / (std7 + EPS),
        0.0,  # group of one: 0 / (0 + ε) = 0, not NaN
        -1.0 / (1.0 + EPS),
        (2 / 3) / (std7 + EPS),
    ]
    got = group_advantages(REWARDS, GROUPS, normalization="group")
    assert_close(got, torch.tensor(expected, dtype=torch.float64))
    assert got[0].item() == pytest.approx(1 / math.sqrt(2), abs=1e-5)
    assert got[2].item() == pytest.approx(-math.sqrt(2), abs=1e-5)


def test_batch_divides_by_std_of_all_centred_values() -> None:
    # centred values: (2/3, 1, -4/3, 0, -1, 2/3), mean 0,
    # Σc² = 4/9 + 1 + 16/9 + 0 + 1 + 4/9 = 42/9, population var = 42/54 = 7/9, std = √7/3
    batch_std = math.sqrt(7) / 3
    expected = [c / (batch_std + EPS) for c in CENTRED]
    got = group_advantages(REWARDS, GROUPS, normalization="batch")
    assert_close(got, torch.tensor(expected, dtype=torch.float64))


def test_batch_is_the_default() -> None:
    assert_close(group_advantages(REWARDS, GROUPS), group_advantages(REWARDS, GROUPS, normalization="batch"))


def test_group_of_equal_rewards_gets_zero_advantage_everywhere() -> None:
    rewards = torch.tensor([1.0, 1.0, -1.0, -1.0])
    groups = torch.tensor([0, 0, 1, 1])
    for normalization in NORMALIZATIONS:
        got = group_advantages(rewards, groups, normalization=normalization)
        assert torch.isfinite(got).all()
        assert_close(got, torch.zeros(4))


def test_integer_rewards_are_promoted_and_empty_batch_is_empty() -> None:
    got = group_advantages(torch.tensor([1, -1]), torch.tensor([0, 0]), normalization="none")
    assert got.dtype == torch.float32
    assert_close(got, torch.tensor([1.0, -1.0]))
    assert group_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long)).shape == (0,)


def _reference(rewards: list[float], groups: list[int], normalization: str) -> list[float]:
    """Naive loops: per group, mean and population std; then the chosen scale."""
    centred: list[float] = []
    group_std: list[float] = []
    for r_i, g in zip(rewards, groups, strict=True):
        members = [r for r, h in zip(rewards, groups, strict=True) if h == g]
        mean = sum(members) / len(members)
        centred.append(r_i - mean)
        group_std.append(math.sqrt(sum((r - mean) ** 2 for r in members) / len(members)))
    if normalization == "none":
        return centred
    if normalization == "group":
        return [c / (s + EPS) for c, s in zip(centred, group_std, strict=True)]
    mean_c = sum(centred) / len(centred)
    batch_std = math.sqrt(sum((c - mean_c) ** 2 for c in centred) / len(centred))
    return [c / (batch_std + EPS) for c in centred]


@pytest.mark.parametrize("normalization", NORMALIZATIONS)
def test_matches_naive_loop_reference_on_random_batch(normalization: str) -> None:
    gen = torch.Generator().manual_seed(0)
    groups = torch.randint(-5, 40, (37,), generator=gen)
    rewards = torch.randn(37, generator=gen, dtype=torch.float64)
    expected = _reference(rewards.tolist(), groups.tolist(), normalization)
    got = group_advantages(rewards, groups, normalization=normalization)
    assert_close(got, torch.tensor(expected, dtype=torch.float64))


def test_unknown_normalization_names_the_allowed_values() -> None:
    with pytest.raises(ValueError, match="group, batch, none"):
        group_advantages(REWARDS, GROUPS, normalization="prompt")


def test_mismatched_shapes_raise() -> None:
    with pytest.raises(ValueError, match=r"\[N\]"):
        group_advantages(REWARDS, GROUPS[:3])
