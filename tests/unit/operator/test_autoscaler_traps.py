"""The autoscaler traps (scalerl_operator.autoscale.autoscaler, render.desired_replicas), pure: scale from zero, never
zero with work waiting, unschedulable Pending pods are not capacity, and pools the operator does not
autoscale keep what an external scaler set. Every expected number is worked by hand in the comments."""

from __future__ import annotations

from typing import Any

import pytest

from scalerl.config import SpecError
from scalerl_operator.api import conditions as c
from scalerl_operator.api.spec import parse_spec
from scalerl_operator.autoscale.autoscaler import (
    BELOW_ACTIVATION,
    LAG,
    NO_COMMITTED_OFFSET,
    SCALE_FROM_ZERO,
    STARVATION,
    WORK_WAITING,
    LagReading,
    LagTarget,
    Proposal,
    ScalerConfig,
    ScalerState,
    Unschedulable,
    cap_unschedulable,
    decide,
    scale_from_zero,
    unschedulable,
    verifier_proposal,
)
from scalerl_operator.render.children import desired_replicas

T0 = 1_800_000_000.0
ZERO_MIN = ScalerConfig(min_replicas=0, max_replicas=8)


def test_scale_from_zero_on_backlog() -> None:
    assert scale_from_zero(12) == Proposal(1, SCALE_FROM_ZERO, "12 record(s) waiting and no replica: scale from zero")
    assert scale_from_zero(0).replicas == 0 and scale_from_zero(0).reason == BELOW_ACTIVATION
    # through the normaliser: a pool at 0 with minReplicas 0 grows to 1 (ratio x 0 would have held it at 0)
    d = decide(current=0, proposal=scale_from_zero(5), cfg=ZERO_MIN, state=ScalerState(), now_s=T0)
    assert (d.replicas, d.reason) == (1, SCALE_FROM_ZERO)


@pytest.mark.parametrize(("lag", "committed", "current", "target", "want", "reason"), [
    # minReplicas 0, noOffsetPolicy minReplicas, no commit yet (a pool at 0 never commits): 37 waiting -> 1
    (37, False, 0, LagTarget(10, no_offset_policy="minReplicas"), 1, WORK_WAITING),
    (37, False, 0, LagTarget(10, no_offset_policy="hold"), 1, WORK_WAITING),  # hold at 0 would be forever
    (3, True, 0, LagTarget(10, activation_lag=5), 1, WORK_WAITING),  # 3 <= activation 5, but 3 wait
    (0, True, 2, LagTarget(10, activation_lag=5), 0, BELOW_ACTIVATION),  # nothing waits: zero is fine
    (0, False, 1, LagTarget(10, no_offset_policy="minReplicas"), 0, NO_COMMITTED_OFFSET),
    (45, True, 0, LagTarget(10), 5, LAG),  # ceil(45/10) = 5: the formula already leaves zero
])
def test_verifiers_never_zero_with_work_waiting(lag: int, committed: bool, current: int, target: LagTarget,
                                                want: int, reason: str) -> None:
    p = verifier_proposal(LagReading(lag, 8, committed), current=current, target=target, cfg=ZERO_MIN)
    assert (p.replicas, p.reason) == (want, reason)


def pod(phase: str, scheduled: dict[str, str] | None, deleting: bool = False) -> dict[str, Any]:
    conds = [] if scheduled is None else [{"type": "PodScheduled", **scheduled}]
    meta: dict[str, Any] = {"name": "p"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"phase": phase, "conditions": conds}}


GPU_MSG = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu. preemption: 0/4 nodes are available."


def test_unschedulable_counts_and_names_the_missing_resource() -> None:
    pods = [
        pod("Running", {"status": "True"}),
        pod("Pending", {"status": "False", "reason": "Unschedulable", "message": GPU_MSG}),
        pod("Pending", {"status": "False", "reason": "Unschedulable",
                        "message": "0/4 nodes are available: 2 Insufficient cpu, 2 Insufficient nvidia.com/gpu."}),
        pod("Pending", None),  # not yet seen by the scheduler: not counted
        pod("Pending", {"status": "False", "reason": "Unschedulable", "message": GPU_MSG}, deleting=True),
    ]
    assert unschedulable(pods) == Unschedulable(2, "Insufficient cpu, Insufficient nvidia.com/gpu")
    gated = pod("Pending", {"status": "False", "reason": "SchedulingGated", "message": "blocked by gates"})
    assert unschedulable([gated]) == Unschedulable(1, "SchedulingGated (waiting for admission)")  # Kueue quota
    taint = pod("Pending", {"status": "False", "reason": "Unschedulable",
                            "message": "0/2 nodes are available: 2 node(s) had untolerated taint {gpu: x}."})
    assert unschedulable([taint]) == Unschedulable(1, "0/2 nodes are available: 2 node(s) had untolerated taint "
                                                      "{gpu: x}.")
    assert unschedulable([]) == Unschedulable(0, "")


def test_unschedulable_pods_stop_scale_up_and_report_it() -> None:
    u = Unschedulable(2, "Insufficient nvidia.com/gpu")
    want_more = Proposal(6, STARVATION, "starvation 0.300 / target 0.1 x 2 replicas = 6")
    capped = cap_unschedulable(want_more, current=4, role="generator", u=u)
    assert capped.replicas == 4 and capped.limit_reason == c.REASON_UNSCHEDULABLE
    assert "2 of 4 pod(s) unschedulable (Insufficient nvidia.com/gpu)" in capped.message
    assert cap_unschedulable(Proposal(2, STARVATION, "m"), current=4, role="generator", u=u).replicas == 2  # shrink ok
    assert cap_unschedulable(want_more, current=4, role="generator", u=Unschedulable()) == want_more
    d = decide(current=4, proposal=capped, cfg=ScalerConfig(min_replicas=1, max_replicas=8), state=ScalerState(),
               now_s=T0)
    assert (d.replicas, d.limited, d.limit_reason) == (4, True, c.REASON_UNSCHEDULABLE)
    assert "Insufficient nvidia.com/gpu" in d.limit_message


def spec(generator: dict[str, Any]) -> Any:
    return parse_spec({"bus": {"bootstrap": "k:9092"}, "store": {"uri": "s3://bucket/p"},
                       "roles": {"generator": generator}})


@pytest.mark.parametrize(("generator", "live", "applied", "want"), [
    ({"replicas": 2}, None, None, 2),                   # new workload: spec replicas
    ({"replicas": 2}, 5, 2, 5),                         # kubectl scale / HPA set 5, spec unchanged: kept
    ({"replicas": 3}, 5, 2, 3),                         # the user changed spec.replicas 2 -> 3: applied
    ({"replicas": 2}, 0, None, 2),                      # resumed from suspension (applied cleared): spec
    ({"replicas": 2}, 5, None, 2),                      # first pass of an upgraded operator: as before
    ({"replicas": 3, "autoscaling": {"external": True}}, 5, 2, 5),  # external scaler: no spec change applied
    ({"replicas": 3, "autoscaling": {"external": True}}, None, None, 3),  # ... but the initial size is
])
def test_pools_without_autoscaling_keep_what_others_set(generator: dict[str, Any], live: int | None,
                                                         applied: int | None, want: int) -> None:
    got = desired_replicas(spec(generator), live={"generator": live}, remembered={},
                           applied={"generator": applied})
    assert got["generator"] == want


def test_external_and_enabled_cannot_both_own_replicas() -> None:
    with pytest.raises(SpecError, match=r"^spec\.roles\.generator\.autoscaling\.external: "):
        spec({"autoscaling": {"enabled": True, "external": True}})
