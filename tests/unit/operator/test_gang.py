"""The learner gang's pure decisions (scalerl_operator.control.gang): when the whole torchrun group restarts,
which pods are outdated, and the progress watchdog's clock."""

from __future__ import annotations

from typing import Any

from scalerl_operator.control.gang import (
    Progress,
    failure,
    group_of,
    group_status,
    live,
    lost,
    outdated,
    remember,
    watchdog,
)


def pod(name: str, restarts: int = 0, phase: str = "Running", deleting: bool = False, rev: str | None = None,
        spec_hash: str | None = None, uid: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": uid or f"uid-{name}", "labels": {}, "annotations": {}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    if rev is not None:
        meta["labels"]["controller-revision-hash"] = rev
    if spec_hash is not None:
        meta["annotations"]["scalerl.dev/spec-hash"] = spec_hash
    return {"metadata": meta, "status": {"phase": phase, "containerStatuses": [
        {"name": "learner", "restartCount": restarts}]}}


def test_any_rank_restarting_or_failing_restarts_the_group_once() -> None:
    assert failure([pod("j-learner-0"), pod("j-learner-1")]) is None
    assert failure([pod("j-learner-0"), pod("j-learner-1", restarts=2)]) == \
        "pod j-learner-1: container learner restarted 2 time(s)"
    assert failure([pod("j-learner-0", phase="Failed")]) == "pod j-learner-0 failed: phase Failed"
    # pods of a restart in progress (being deleted) are not seen again: one group restart, not two
    assert failure([pod("j-learner-0", restarts=1, deleting=True), pod("j-learner-1", deleting=True)]) is None
    assert [p["metadata"]["name"] for p in live([pod("a", deleting=True), pod("b")])] == ["b"]


def test_outdated_by_revision_or_spec_hash() -> None:
    sts = {"status": {"updateRevision": "j-learner-7d9"}}
    pods = [pod("j-learner-0", rev="j-learner-7d9", spec_hash="h2"), pod("j-learner-1", rev="j-learner-5c1",
                                                                          spec_hash="h2")]
    assert outdated(pods, sts, "h2", "scalerl.dev/spec-hash") == ["j-learner-1"]  # an older revision
    # no controller reported a revision (or it lags): the rendered job's hash decides
    assert outdated([pod("j-learner-0", spec_hash="h1")], None, "h2", "scalerl.dev/spec-hash") == ["j-learner-0"]
    assert outdated([pod("j-learner-0", spec_hash="h2")], {"status": {}}, "h2", "scalerl.dev/spec-hash") == []


def test_watchdog_clock() -> None:
    off = watchdog(Progress(3, 100.0), 3, group_up=True, now_s=10_000.0, deadline_s=None)
    assert off == (Progress(3, None), False)
    p, stalled = watchdog(Progress(None, None), 7, group_up=True, now_s=0.0, deadline_s=600)
    assert (p, stalled) == (Progress(7, 0.0), False)  # the clock starts
    assert watchdog(p, 7, group_up=True, now_s=600.0, deadline_s=600) == (p, False)  # not past yet
    assert watchdog(p, 7, group_up=True, now_s=601.0, deadline_s=600) == (p, True)  # no new step in 600 s
    assert watchdog(p, 8, group_up=True, now_s=601.0, deadline_s=600) == (Progress(8, 601.0), False)  # new step
    # the group not up (starting, scaled to zero): no clock
    assert watchdog(p, 7, group_up=False, now_s=5_000.0, deadline_s=600) == (Progress(7, None), False)
    # nothing reported yet: the clock runs from the group's start (a first step must come within the deadline)
    p0, _ = watchdog(Progress(None, None), None, group_up=True, now_s=0.0, deadline_s=60)
    assert watchdog(p0, None, group_up=True, now_s=61.0, deadline_s=60)[1] is True


def test_a_rank_of_the_running_group_deleted_gone_or_replaced_is_lost() -> None:
    group = {"j-learner-0": "a0", "j-learner-1": "a1"}
    running = [pod("j-learner-0", uid="a0"), pod("j-learner-1", uid="a1")]
    assert lost(running, group) is None
    # kubectl delete pod j-learner-1: it terminates (checkpointing) with its UID, deleted by someone else
    deleting = [pod("j-learner-0", uid="a0"), pod("j-learner-1", uid="a1", deleting=True)]
    assert lost(deleting, group) == "pod j-learner-1 is being deleted outside the operator"
    evicted = pod("j-learner-1", uid="a1", deleting=True)
    evicted["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True",
                                        "reason": "EvictionByEvictionAPI"}]
    assert lost([running[0], evicted], group) == \
        "pod j-learner-1 is being deleted outside the operator (DisruptionTarget: EvictionByEvictionAPI)"
    # gone (force-deleted, or never seen terminating) and not yet recreated
    assert lost([running[0]], group) == \
        "pod j-learner-1 is gone: deleted outside the operator (kubectl delete, eviction or a lost node)"
    # the StatefulSet made it again under the same name: a new UID, restartCount 0 (failure() sees nothing)
    replaced = [pod("j-learner-0", uid="a0"), pod("j-learner-1", uid="b1")]
    assert failure(replaced) is None
    assert lost(replaced, group) == ("pod j-learner-1 was replaced (UID a1 → b1): deleted outside the operator "
                                     "(kubectl delete, eviction or a lost node)")
    # both ranks lost at once (a node with both): one reason, so one restart
    assert lost([pod("j-learner-0", uid="b0"), pod("j-learner-1", uid="b1")], group) is not None


def test_ranks_not_in_the_record_are_not_lost() -> None:
    # nothing recorded (a new group, or the operator emptied it before deleting the pods itself, or the
    # learner was at zero): pods seen for the first time are the group, not replacements
    assert lost([pod("j-learner-0", uid="b0")], {}) is None
    # a group still coming up: rank 1 appears after rank 0 was recorded
    assert lost([pod("j-learner-0", uid="a0"), pod("j-learner-1", uid="a1")], {"j-learner-0": "a0"}) is None


def test_the_record_is_the_live_pods_and_round_trips_through_status() -> None:
    pods = [pod("j-learner-1", uid="a1"), pod("j-learner-0", uid="a0"), pod("j-learner-2", uid="a2", deleting=True)]
    group = remember(pods)
    assert group == {"j-learner-0": "a0", "j-learner-1": "a1"}  # the pod being deleted is no longer the group
    assert group_status(group) == [{"name": "j-learner-0", "uid": "a0"}, {"name": "j-learner-1", "uid": "a1"}]
    assert group_of({"learnerGroup": group_status(group)}) == group
    assert group_of({}) == {}  # a status written before the record existed: nothing to compare with
