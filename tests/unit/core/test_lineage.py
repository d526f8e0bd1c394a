"""Policy versions that never repeat across learner restarts (scalerl.learner.lineage): the numbering, the
lost lineage, and what the batch does with its rollouts; the highest uploaded version read from a store."""

from __future__ import annotations

import torch

from scalerl.learner.batch import assemble, stale_reason
from scalerl.learner.lineage import Lineage, lineage_of, lineage_state, resume_lineage
from scalerl.messages import Completion, PromptTask, RolloutGroup, ScoredGroup
from scalerl.store.local import LocalStore
from scalerl.weightsync.publisher import publish_weights
from scalerl.weightsync.reader import highest_version


def test_a_resume_numbers_past_every_uploaded_version_and_marks_the_lost_ones() -> None:
    # checkpoint at step 100 (announced as v100), versions up to 112 uploaded before the crash
    first = resume_lineage(100, Lineage(), high_water=112)
    assert first == Lineage(offset=13, lost=((101, 112),))
    assert 100 + first.offset == 113  # the resumed weights (step 100's) are announced as v113
    # crash again at step 105 (v118) with the checkpoint still at step 100: 101..118 are lost
    second = resume_lineage(100, Lineage(), high_water=118)
    assert 100 + second.offset == 119 and second.is_lost(113) and second.is_lost(101) and not second.is_lost(100)
    # a later checkpoint (step 104 = v117) keeps its lineage; a crash at v121 adds 118..121
    third = resume_lineage(104, first, high_water=121)
    assert third == Lineage(offset=18, lost=((101, 112), (118, 121)))
    assert 104 + third.offset == 122


def test_nothing_announced_past_the_checkpoint_keeps_the_numbering() -> None:
    ckpt = Lineage(offset=13, lost=((101, 112),))
    assert resume_lineage(104, ckpt, high_water=117) == ckpt  # v117 is the checkpoint's own weights
    assert resume_lineage(0, None, high_water=None) == Lineage()


def test_a_fresh_start_over_old_versions_counts_them_all_lost() -> None:
    fresh = resume_lineage(0, None, high_water=5)
    assert fresh == Lineage(offset=6, lost=((0, 5),))


def test_the_lineage_round_trips_through_a_learner_state() -> None:
    lin = Lineage(offset=7, lost=((3, 9),))
    assert lineage_of(lineage_state(lin)) == lin
    assert lineage_of({"version": 4}) == Lineage()  # a checkpoint written before lineages


def _group(pid: str, versions: list[int]) -> ScoredGroup:
    comps = [Completion([5, 6, 7], [-0.1] * 3, list(versions), [True] * 3, "stop", "x") for _ in range(2)]
    return ScoredGroup(RolloutGroup(PromptTask(pid, 0, "p", "a", 2, "t"), [1, 2], comps), [1.0, -1.0], [True, False])


def test_rollouts_of_a_lost_lineage_are_dropped_as_stale_and_the_rest_have_non_negative_age() -> None:
    lineage = Lineage(offset=13, lost=((101, 112),))
    groups = [_group("live", [113, 113, 114]), _group("lost", [112, 112, 114]), _group("old", [99, 100, 100])]
    asm = assemble(groups, version=114, k=8, pad_id=0, zero_variance_filter=True, normalization="batch",
                   lineage=lineage)
    assert [g.rollout.task.prompt_id for g in asm.kept_groups] == ["live"]
    assert asm.dropped_stale == 2 and asm.dropped_lost_lineage == 1  # "old": 114 - 99 > k
    assert asm.batch is not None and torch.equal(asm.batch.age, torch.tensor([1, 1]))


def test_the_verdict_on_one_group_names_why_it_can_never_be_trained() -> None:
    lineage = Lineage(offset=13, lost=((101, 112),))
    assert stale_reason(_group("live", [113, 113, 114]), 114, 8, lineage) is None
    assert stale_reason(_group("lost", [112, 113, 114]), 114, 8, lineage) == "lost"  # one lost token is enough
    assert stale_reason(_group("old", [105, 113, 114]), 114, 8) == "stale"  # 114 - 105 > 8
    assert stale_reason(_group("edge", [106, 113, 114]), 114, 8) is None  # exactly k old: still fresh
    assert stale_reason(_group("lost", [112, 113, 114]), 114, 8) is None  # no lineage given: only the age


def test_highest_version_reads_the_store_keys(tmp_path) -> None:
    store = LocalStore(tmp_path)
    assert highest_version(store) is None
    for v in (3, 11, 12):
        publish_weights(store, v, {"w": torch.full((2,), float(v))})
    store.put_bytes("policy_notes.txt", b"not weights")
    assert highest_version(store) == 12
