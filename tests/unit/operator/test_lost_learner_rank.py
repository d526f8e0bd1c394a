"""A learner pod deleted, evicted or lost with its node is a restart of the torchrun group (issue #26, real
node): `gang_pass` restarts the whole group and counts one in status.restarts, from the group recorded in
status.learnerGroup (so a restarted operator sees it too); the operator's own deletions (group restarts,
template updates) and a learner at zero (suspended, finished) are never counted."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from scalerl_operator.api import conditions as c
from scalerl_operator.api.spec import RLJobSpec, parse_spec
from scalerl_operator.cluster.rlstatus import LearnerStatus
from scalerl_operator.control.gang import group_status
from scalerl_operator.control.reconcile import GangPass, gang_pass

NOW = datetime(2027, 1, 15, 8, 0, 0, tzinfo=UTC)
BASE = {"bus": {"bootstrap": "k:9092"}, "store": {"uri": "s3://bkt/run1"}}
SPEC = parse_spec(BASE)
SPEC_HASH = "h"


class FakeKube:
    """What gang_pass calls, in order: status patches, pod deletions and Events."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.calls: list[tuple[str, Any]] = []

    def list_objects(self, api_version: str, kind: str, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return self.pods

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("status", status))
        return {}

    def request(self, method: str, url_path: str, **_: Any) -> dict[str, Any]:
        self.calls.append((method, url_path.rsplit("/", 1)[-1]))
        return {}

    def event(self, owner: dict[str, Any], type_: str, reason: str, message: str, action: str) -> None:
        self.calls.append(("event", (type_, reason, message)))

    def deleted(self) -> list[str]:
        return [what for kind, what in self.calls if kind == "DELETE"]

    def events(self) -> list[tuple[str, str, str]]:
        return [what for kind, what in self.calls if kind == "event"]


def pod(ordinal: int, uid: str, *, deleting: bool = False, spec_hash: str = SPEC_HASH) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"j-learner-{ordinal}", "uid": uid, "annotations": {"scalerl.dev/spec-hash":
                                                                                          spec_hash}}
    if deleting:
        meta["deletionTimestamp"] = "2027-01-15T07:59:59Z"
    return {"metadata": meta, "status": {"phase": "Running", "containerStatuses": [
        {"name": "learner", "restartCount": 0}]}}


def rljob(group: dict[str, str], restarts: int = 0, phase: str = c.PHASE_RUNNING) -> dict[str, Any]:
    return {"metadata": {"name": "j", "namespace": "n", "generation": 1},
            "status": {"phase": phase, "restarts": restarts, "learnerGroup": group_status(group)}}


def run(kube: FakeKube, obj: dict[str, Any], spec: RLJobSpec = SPEC,
        learner: LearnerStatus | None = None) -> GangPass:
    return gang_pass(kube, obj, spec, learner=learner or LearnerStatus(step=8, records=8), group_up=True,  # type: ignore[arg-type]
                     sts=None, spec_hash=SPEC_HASH, now=NOW)


def test_a_running_group_is_recorded_and_nothing_happens() -> None:
    kube = FakeKube([pod(0, "a0"), pod(1, "a1")])
    g = run(kube, rljob({}))
    assert (g.restarts, g.group, kube.calls) == (0, {"j-learner-0": "a0", "j-learner-1": "a1"}, [])
    kube = FakeKube([pod(0, "a0"), pod(1, "a1")])  # the next pass: the same pods, nothing happens
    assert run(kube, rljob(g.group)).restarts == 0 and kube.calls == []


def test_the_deleted_pod_of_a_one_node_learner_counts_one_restart_then_its_replacement_is_the_group() -> None:
    # kubectl delete pod j-learner-0: it terminates (checkpointing on SIGTERM); nothing live is left to delete
    kube = FakeKube([pod(0, "a0", deleting=True)])
    g = run(kube, rljob({"j-learner-0": "a0"}))
    assert g.restarts == 1 and g.group == {} and kube.deleted() == []
    assert kube.calls[0] == ("status", {"restarts": 1, "learnerGroup": []})
    assert kube.events() == [("Warning", "GroupRestart", "restarting the whole learner group (1 so far): pod "
                              "j-learner-0 is being deleted outside the operator")]
    # the old pod is gone and the StatefulSet made j-learner-0 again (new UID): not a second restart
    after = rljob(g.group, restarts=g.restarts)
    for pods in ([], [pod(0, "b0")], [pod(0, "b0")]):
        kube = FakeKube(pods)
        g = run(kube, after)
        after = rljob(g.group, restarts=g.restarts)
        assert g.restarts == 1 and kube.calls == []
    assert g.group == {"j-learner-0": "b0"}


def test_a_replacement_seen_only_after_the_fact_counts_too() -> None:
    # the operator was down while the pod was deleted and recreated: the record in status still names a0
    kube = FakeKube([pod(0, "b0")])
    g = run(kube, rljob({"j-learner-0": "a0"}))
    assert g.restarts == 1 and kube.deleted() == ["j-learner-0"]  # the whole group again, as for a crash
    assert "pod j-learner-0 was replaced (UID a0 → b0)" in kube.events()[0][2]


def test_one_lost_rank_of_three_deletes_every_rank_and_counts_one() -> None:
    # rank 1's node is lost: its pod is being deleted; ranks 0 and 2 are stuck in a collective
    pods = [pod(0, "a0"), pod(1, "a1", deleting=True), pod(2, "a2")]
    group = {"j-learner-0": "a0", "j-learner-1": "a1", "j-learner-2": "a2"}
    kube = FakeKube(pods)
    g = run(kube, rljob(group))
    assert g.restarts == 1 and kube.deleted() == ["j-learner-0", "j-learner-2"]
    # the record is emptied (and the restart written) before any pod is deleted
    assert kube.calls[0] == ("status", {"restarts": 1, "learnerGroup": []})
    # the operator's own deletions, seen on the next pass (all three terminating), and the new pods: no more
    for pods in ([pod(i, f"a{i}", deleting=True) for i in range(3)], [pod(i, f"b{i}") for i in range(3)]):
        kube = FakeKube(pods)
        g = run(kube, rljob(g.group, restarts=g.restarts))
        assert g.restarts == 1 and kube.calls == []
    assert g.group == {f"j-learner-{i}": f"b{i}" for i in range(3)}


def test_a_template_update_empties_the_record_and_is_not_counted() -> None:
    group = {"j-learner-0": "a0", "j-learner-1": "a1"}
    kube = FakeKube([pod(0, "a0", spec_hash="old"), pod(1, "a1", spec_hash="old")])
    g = run(kube, rljob(group))
    assert g.restarts == 0 and g.group == {} and kube.deleted() == ["j-learner-0", "j-learner-1"]
    assert kube.calls[0] == ("status", {"restarts": 0, "learnerGroup": []})
    assert [e[1] for e in kube.events()] == ["GroupRecreated"]
    kube = FakeKube([pod(0, "b0")])  # recreated on the new template
    assert run(kube, rljob(g.group)).restarts == 0 and kube.calls == []


def test_scale_to_zero_of_a_suspended_or_finished_job_is_not_a_lost_rank() -> None:
    group = {"j-learner-0": "a0"}
    suspended = parse_spec({**BASE, "suspend": True})
    for obj, spec in ((rljob(group), suspended), (rljob(group, phase=c.PHASE_SUCCEEDED), SPEC)):
        kube = FakeKube([pod(0, "a0", deleting=True)])
        g = run(kube, obj, spec)
        assert (g.restarts, g.group, kube.calls) == (0, {}, [])
    # resumed: the record was emptied while at zero, the new pod is the group
    kube = FakeKube([pod(0, "b0")])
    assert run(kube, rljob({})).group == {"j-learner-0": "b0"} and kube.calls == []
