"""`scalerl.bus.dedup.DecidedSet`: exact (every copy of a decided group recognised, no undecided group taken for
one) against a plain set of every id, and bounded by the out-of-order span, not by the run's length (#27)."""

from __future__ import annotations

import random

import pytest

from scalerl.bus.dedup import DecidedSet


def test_the_watermark_passes_every_number_decided_in_order():
    d = DecidedSet()
    for s in (2, 3, 5):
        assert d.add(s, f"p{s}@0")
    assert (d.below, d.window) == (0, 3)
    assert d.add(1, "p1@0")
    assert (d.below, sorted(d.above)) == (3, [5])
    assert (4, "p4@0") not in d and (3, "p3@0") in d and (5, "p5@0") in d
    assert not d.add(2, "p2@0") and d.count == 4  # a copy: nothing changes


def test_dead_letters_learned_of_are_decided_but_not_counted():
    d = DecidedSet()
    d.add(1, "a@0")
    assert d.add(2, "b@0", counted=False)
    assert d.count == 1 and d.below == 2 and not d.add(2, "b@0")


def test_groups_without_an_issue_number_are_kept_by_id():
    d = DecidedSet()
    d.add(0, "hand@0")
    assert (0, "hand@0") in d and (0, "other@0") not in d and d.below == 0 and d.count == 1


def test_the_state_round_trips_and_an_older_checkpoints_ids_are_read():
    d = DecidedSet()
    for s in (1, 2, 4, 7):
        d.add(s, f"p{s}@0")
    d.add(0, "hand@0", counted=False)
    back = DecidedSet.from_state({"decided": d.state_dict()})
    assert back.state_dict() == d.state_dict() == {"below": 2, "above": [4, 7], "ids": ["hand@0"], "count": 4}
    old = DecidedSet.from_state({"consumed_ids": ["a@0", "b@1"]})
    assert ((0, "a@0") in old, (0, "b@1") in old, old.count) == (True, True, 2)


def test_a_state_with_numbers_below_its_watermark_is_refused():
    with pytest.raises(ValueError, match="watermark 3"):
        DecidedSet.from_state({"decided": {"below": 3, "above": [2, 9], "ids": [], "count": 3}})


@pytest.mark.parametrize("span", [1, 8, 64])
def test_exact_against_every_id_and_bounded_by_the_span_not_the_run(span):
    """20,000 groups decided out of order within `span` (blocks shuffled), each copy of a decided group offered
    again later (within 3 spans): the answers match a set of every id, and the kept numbers stay ≤ 2 spans."""
    rng = random.Random(span)
    order: list[int] = []
    for lo in range(1, 20_001, span):
        block = list(range(lo, min(lo + span, 20_001)))
        rng.shuffle(block)
        order += block
    d, every = DecidedSet(), set()
    copies: list[int] = []
    widest = 0
    for i, s in enumerate(order):
        if copies and rng.random() < 0.3:
            c = copies.pop(rng.randrange(len(copies)))
            assert (c, f"p{c}") in d and not d.add(c, f"p{c}")
        undecided = rng.randint(1, 20_000)
        assert ((undecided, "x") in d) == (undecided in every)
        assert d.add(s, f"p{s}") and s not in every
        every.add(s)
        copies.append(s)
        copies = copies[-3 * span:]
        widest = max(widest, d.window)
        assert d.count == i + 1
    assert d.below == 20_000 and d.window == 0
    assert widest <= 2 * span  # a set of every id: 20,000
