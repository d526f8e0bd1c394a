"""Unit tests of scalerl_operator.cluster.scheduling (the scheduler's verdict on Pending pods) and of how the
status reports it (reconcile.status_patch with `pending`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from scalerl_operator.api import conditions as c
from scalerl_operator.api.spec import parse_spec
from scalerl_operator.cluster.rlstatus import LearnerStatus
from scalerl_operator.cluster.scheduling import Unschedulable, missing_resources, summary, unschedulable
from scalerl_operator.control.jobstatus import status_patch

NOW = datetime(2027, 1, 15, 8, 0, 0, tzinfo=UTC)
SPEC = parse_spec({"bus": {"bootstrap": "k:9092"},
                   "store": {"uri": "s3://bkt/run", "endpoint": "http://m:9000", "credentialsSecret": {"name": "s"}}})
GPU_MSG = ("0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 2 Insufficient "
           "nvidia.com/gpu. preemption: 0/3 nodes are available: 1 Preemption is not helpful for scheduling, "
           "2 No preemption victims found for incoming pod.")


def pod(name: str, role: str, phase: str = "Pending", scheduled: tuple[str, str, str] | None = None,
        restarts: int = 0, deleting: bool = False) -> dict[str, Any]:
    conds = [] if scheduled is None else [{"type": "PodScheduled", "status": scheduled[0], "reason": scheduled[1],
                                           "message": scheduled[2]}]
    meta: dict[str, Any] = {"name": name, "labels": {"app.kubernetes.io/component": role}}
    if deleting:
        meta["deletionTimestamp"] = "2027-01-15T08:00:00Z"
    return {"metadata": meta, "status": {"phase": phase, "conditions": conds,
                                         "containerStatuses": [{"restartCount": restarts}]}}


def test_unschedulable_groups_pending_pods_by_role_and_ignores_the_rest() -> None:
    no = ("False", "Unschedulable", GPU_MSG)
    pods = [pod("j-learner-1", "learner", scheduled=no), pod("j-learner-0", "learner", scheduled=no),
            pod("j-gen-a", "generator", scheduled=("False", "Unschedulable", "0/3 nodes are available: 3 "
                                                   "Insufficient cpu, 3 Insufficient memory.")),
            pod("j-ver-a", "verifier"),                                           # not looked at by the scheduler yet
            pod("j-ver-b", "verifier", scheduled=("False", "SchedulingGated", "gated")),  # not its verdict
            pod("j-cur", "curriculum", phase="Running", scheduled=("True", "", "")),
            pod("j-gen-b", "generator", scheduled=no, deleting=True)]            # going away: not waiting
    found = unschedulable(pods)
    assert found == {"generator": Unschedulable(1, "0/3 nodes are available: 3 Insufficient cpu, 3 Insufficient "
                                                   "memory."),
                     "learner": Unschedulable(2, GPU_MSG)}
    assert found["learner"].missing == ["nvidia.com/gpu"]
    assert found["generator"].missing == ["cpu", "memory"]
    assert summary({"learner": found["learner"]}) == (
        f"learner: 2 pod(s) unschedulable (missing nvidia.com/gpu): {GPU_MSG}")


def test_missing_resources_names_each_once_and_nothing_for_taints() -> None:
    assert missing_resources("3 Insufficient nvidia.com/gpu, 1 Insufficient cpu, 2 Insufficient nvidia.com/gpu") \
        == ["nvidia.com/gpu", "cpu"]
    assert missing_resources("0/3 nodes are available: 3 node(s) had untolerated taint {nvidia.com/gpu: present}.") \
        == []


def test_status_says_unschedulable_and_what_is_missing() -> None:
    roles = {"generator": (1, 1), "verifier": (1, 1), "curriculum": (1, 1), "learner": (0, 1)}
    pending = {"learner": Unschedulable(1, GPU_MSG)}
    s = status_patch({"metadata": {"generation": 1}, "status": {}}, SPEC, roles=roles, learner=LearnerStatus(),
                     now=NOW, pending=pending)
    ready = c.get_condition(s["conditions"], c.READY)
    assert ready is not None and (ready["status"], ready["reason"]) == ("False", c.REASON_UNSCHEDULABLE)
    assert ready["message"].startswith("generator 1/1, verifier 1/1, curriculum 1/1, learner 0/1; learner: 1 pod(s) "
                                       "unschedulable (missing nvidia.com/gpu): 0/3 nodes are available")
    # once running, the same shows as Degraded; all ready again: back to AllRolesReady whatever is pending
    running = status_patch({"metadata": {"generation": 1}, "status": {"phase": c.PHASE_RUNNING}}, SPEC, roles=roles,
                           learner=LearnerStatus(), now=NOW, pending=pending)
    degraded = c.get_condition(running["conditions"], c.DEGRADED)
    assert degraded is not None and (degraded["status"], degraded["reason"]) == ("True", c.REASON_UNSCHEDULABLE)
    ok = status_patch({"metadata": {"generation": 1}, "status": {}}, SPEC, roles=dict.fromkeys(roles, (1, 1)),
                      learner=LearnerStatus(), now=NOW, pending=pending)
    assert c.get_condition(ok["conditions"], c.READY)["reason"] == c.REASON_ALL_ROLES_READY  # type: ignore[index]
