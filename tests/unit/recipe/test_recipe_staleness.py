"""Per-token ages under PipelineRL-k: hand-computed histograms, their merge and summary statistics."""

from __future__ import annotations

import pytest

from scalerl.recipe import age_stats, merge_age_counts, token_age_counts


def test_token_ages_by_hand():
    # Learner trains version 5. Sequence 1 was swapped in flight (3 -> 4 -> 5); its third token is an
    # interruption-phrase token (mask False) and is not counted. Sequence 2 is on-policy.
    versions = [[3, 3, 4, 5], [5, 5]]
    masks = [[True, True, False, True], [True, True]]
    counts = token_age_counts(versions, masks, learner_version=5)
    assert counts == {2: 2, 0: 3}
    st = age_stats(counts)
    assert st == {"tokens": 5, "mean": pytest.approx(4 / 5), "max": 2, "share_age_ge_1": pytest.approx(2 / 5)}


def test_merge_and_empty():
    assert merge_age_counts([{0: 1, 2: 3}, {2: 1, 1: 4}]) == {0: 1, 1: 4, 2: 4}
    assert list(merge_age_counts([{3: 1}, {0: 1}])) == [0, 3]
    assert age_stats({}) == {"tokens": 0, "mean": None, "max": None, "share_age_ge_1": None}


def test_lengths_must_match():
    with pytest.raises(ValueError, match="differ in length"):
        token_age_counts([[1, 2]], [[True]], learner_version=2)
