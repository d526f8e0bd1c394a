"""Unit tests of the pure parts of the Kueue integration (operators/scalerl_operator/control/kueue.py): the
Workload's podSets (learner × nodes, pools × their minimum, curriculum × 1), where a Workload stands
from its status, and the admitted placement merged into the pod templates. The integration against a
real Kueue is tests/k8s/test_kueue.py."""

from __future__ import annotations

import copy
from typing import Any

from scalerl_operator.api import conditions as c
from scalerl_operator.api.spec import RLJobSpec, parse_spec
from scalerl_operator.control.kueue import (
    HASH_ANNOTATION,
    REASON_ADMITTED,
    REASON_QUEUED,
    holds,
    place,
    render_workload,
    state,
    workload_name,
)
from scalerl_operator.render.children import render
from scalerl_operator.render.images import ImageDefaults
from scalerl_operator.render.names import QUEUE_LABEL

ROLES = ("learner", "generator", "verifier", "curriculum")


def make_spec(**over: Any) -> RLJobSpec:
    return parse_spec({
        "job": {"train": {"steps": 5}, "off_policy": {"k": 4}},
        "bus": {"bootstrap": "kafka:9092"}, "store": {"uri": "s3://bucket/runs"}, "queueName": "team-a",
        "roles": {
            "learner": {"nodes": 2, "devicesPerNode": 4, "resources": {"limits": {"nvidia.com/gpu": 4}}},
            "generator": {"replicas": 3, "resources": {"limits": {"nvidia.com/gpu": 1}},
                          "autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 6}},
            "verifier": {"replicas": 3, "resources": {"requests": {"cpu": "2"}}},
        }, **over})


def children(spec: RLJobSpec) -> list[dict[str, Any]]:
    return render("j1", "ns", spec, dict.fromkeys(ROLES, 0), ImageDefaults("img:1"))


def test_pod_sets_are_the_learner_and_every_pool_at_its_minimum() -> None:
    spec = make_spec()
    wl = render_workload("j1", "ns", spec, children(spec))
    assert wl["apiVersion"] == "kueue.x-k8s.io/v1beta2" and wl["metadata"]["name"] == workload_name("j1") == "rljob-j1"
    assert wl["metadata"]["labels"][QUEUE_LABEL] == "team-a" and wl["spec"]["queueName"] == "team-a"
    assert wl["spec"]["active"] is True
    counts = {p["name"]: p["count"] for p in wl["spec"]["podSets"]}
    # generator autoscaled: minReplicas (2), not replicas (3); verifier fixed: replicas; curriculum 1
    assert counts == {"learner": 2, "generator": 2, "verifier": 3, "curriculum": 1}
    by = {p["name"]: p["template"]["spec"] for p in wl["spec"]["podSets"]}
    assert by["learner"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 4}
    assert by["generator"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert by["verifier"]["containers"][0]["resources"]["requests"] == {"cpu": "2"}
    assert "priorityClassRef" not in wl["spec"]


def test_a_pool_with_minimum_zero_has_no_pod_set_and_suspend_deactivates() -> None:
    spec = make_spec(suspend=True, roles={
        "learner": {"nodes": 1}, "generator": {"replicas": 1},
        "verifier": {"replicas": 1, "autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 2}}})
    wl = render_workload("j1", "ns", spec, children(spec))
    assert [p["name"] for p in wl["spec"]["podSets"]] == ["learner", "generator", "curriculum"]
    assert wl["spec"]["active"] is False


def test_the_hash_follows_the_pod_sets_and_priority_only() -> None:
    spec = make_spec()
    a = render_workload("j1", "ns", spec, children(spec))
    assert render_workload("j1", "ns", spec, children(spec))["metadata"]["annotations"] == a["metadata"]["annotations"]
    changed_job = make_spec(job={"train": {"steps": 7}, "off_policy": {"k": 4}})  # rolls pods, same quota
    assert render_workload("j1", "ns", changed_job, children(changed_job))["metadata"]["annotations"][
        HASH_ANNOTATION] == a["metadata"]["annotations"][HASH_ANNOTATION]
    suspended = make_spec(suspend=True)
    assert render_workload("j1", "ns", suspended, children(suspended))["metadata"]["annotations"][
        HASH_ANNOTATION] == a["metadata"]["annotations"][HASH_ANNOTATION]
    prio = render_workload("j1", "ns", spec, children(spec), ({"group": "kueue.x-k8s.io",
                                                               "kind": "WorkloadPriorityClass", "name": "hi"}, 100))
    assert prio["spec"]["priority"] == 100 and prio["spec"]["priorityClassRef"]["name"] == "hi"
    assert prio["metadata"]["annotations"][HASH_ANNOTATION] != a["metadata"]["annotations"][HASH_ANNOTATION]


def _wl(conditions: list[dict[str, Any]], admission: dict[str, Any] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": conditions}
    if admission is not None:
        status["admission"] = admission
    return {"spec": {"queueName": "team-a"}, "status": status}


def _c(type_: str, status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message}


def test_state_of_a_workload() -> None:
    assert state(_wl([])).reason == REASON_QUEUED
    pending = state(_wl([_c("QuotaReserved", "False", "Pending", "insufficient quota for nvidia.com/gpu")]))
    assert (pending.admitted, pending.reason) == (False, "Pending")
    assert "insufficient quota for nvidia.com/gpu" in pending.message and "team-a" in pending.message
    adm = {"clusterQueue": "cq", "podSetAssignments": []}
    ok = state(_wl([_c("QuotaReserved", "True", "QuotaReserved"), _c("Admitted", "True", "Admitted")], adm))
    assert (ok.admitted, ok.reason) == (True, REASON_ADMITTED) and "cq" in ok.message
    # reserved but not yet Admitted (admission checks): not admitted
    assert not state(_wl([_c("QuotaReserved", "True", "QuotaReserved")], adm)).admitted
    ev = state(_wl([_c("QuotaReserved", "True", "QuotaReserved"), _c("Admitted", "True", "Admitted"),
                    _c("Evicted", "True", "Preempted", "preempted by a higher priority workload")], adm))
    assert (ev.admitted, ev.reason) == (False, "Preempted") and "higher priority" in ev.message
    assert state(_wl([_c("Finished", "True", "Succeeded", "done")])).reason == "Finished"


def test_place_merges_the_flavors_node_labels_and_tolerations() -> None:
    spec = make_spec(roles={"learner": {"nodes": 1, "nodeSelector": {"zone": "a"}}, "generator": {"replicas": 1}})
    out = children(spec)
    before = copy.deepcopy(out)
    tol = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    place(out, {"learner": {"nodeSelector": {"pool": "h100"}, "tolerations": [tol]},
                "generator": {"nodeSelector": {}, "tolerations": []}})
    tpl = {ch["metadata"]["labels"]["app.kubernetes.io/component"]: ch["spec"]["template"]["spec"]
           for ch in out if ch["kind"] in ("Deployment", "StatefulSet")}
    assert tpl["learner"]["nodeSelector"] == {"zone": "a", "pool": "h100"}
    assert tol in tpl["learner"]["tolerations"]
    old = {ch["metadata"]["labels"]["app.kubernetes.io/component"]: ch["spec"]["template"]["spec"]
           for ch in before if ch["kind"] in ("Deployment", "StatefulSet")}
    assert tpl["generator"] == old["generator"] and tpl["verifier"] == old["verifier"]


def test_children_carry_no_queue_label() -> None:
    """The queue label is on the Workload only: Kueue's pod/deployment/statefulset integrations would
    otherwise queue each child a second time."""
    for ch in children(make_spec()):
        assert QUEUE_LABEL not in ch["metadata"]["labels"]
        if ch["kind"] in ("Deployment", "StatefulSet"):
            assert QUEUE_LABEL not in ch["spec"]["template"]["metadata"]["labels"]


def test_the_autoscaler_leaves_a_held_job_alone() -> None:
    queued, plain = make_spec(), make_spec(queueName="")
    admitted = {"status": {"conditions": [_c(c.QUEUE_ADMITTED, "True", "Admitted")]}}
    waiting = {"status": {"conditions": [_c(c.QUEUE_ADMITTED, "False", "Pending")]}}
    assert holds({}, queued) and holds(waiting, queued) and not holds(admitted, queued)
    assert not holds({}, plain) and not holds(waiting, plain)
