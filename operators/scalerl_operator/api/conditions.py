"""Status conditions of an RLJob: the types, their reasons, and the one helper that sets them.

Conditions are metav1.Condition dicts as the API server stores them (`type`, `status`, `reason`,
`message`, `lastTransitionTime`, `observedGeneration`). `set_condition` is pure: it returns a new list
and moves `lastTransitionTime` only when the status flips, so a reconcile that finds nothing new
writes an identical status (no spurious updates, no watch event storms).

An RLJob is ready when `status.observedGeneration == metadata.generation` and `Ready` is True
(`is_ready`): a Ready condition about an older generation says nothing about the current spec.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final, Literal

# ---- condition types --------------------------------------------------------------------------------
READY: Final = "Ready"                      # every role has its desired pods ready on the current policy
PROGRESSING: Final = "Progressing"          # the operator is rolling out a spec change or scaling
SUSPENDED: Final = "Suspended"              # spec.suspend is honoured: every role at zero, checkpoints kept
COMPLETE: Final = "Complete"                # the learner finished train.steps
FAILED: Final = "Failed"                    # terminal: invalid spec, restarts exhausted, deadline passed
DEGRADED: Final = "Degraded"                # running below the desired capacity (pods not ready, fallback)
LEARNER_STARVED: Final = "LearnerStarved"   # the learner waits for batches more than targetStarvation
POLICY_LAG_EXCEEDED: Final = "PolicyLagExceeded"  # measured staleness reached the bound k
SCALING_LIMITED: Final = "ScalingLimited"   # the autoscaler wanted more (or fewer) than it may set
LEARNER_STALLED: Final = "LearnerStalled"   # no new learner step within failurePolicy.progressDeadlineSeconds
QUEUE_ADMITTED: Final = "QueueAdmitted"     # spec.queueName: Kueue admitted the job's Workload (reason: Kueue's)
BUS_REACHABLE: Final = "BusReachable"       # the brokers advertise addresses the pods can reach (not loopback)

CONDITION_TYPES: Final = (READY, PROGRESSING, SUSPENDED, COMPLETE, FAILED, DEGRADED, LEARNER_STARVED,
                          POLICY_LAG_EXCEEDED, SCALING_LIMITED, LEARNER_STALLED, QUEUE_ADMITTED, BUS_REACHABLE)

# ---- phases -----------------------------------------------------------------------------------------
PHASE_PENDING: Final = "Pending"
PHASE_RUNNING: Final = "Running"
PHASE_SUSPENDED: Final = "Suspended"
PHASE_SUCCEEDED: Final = "Succeeded"
PHASE_FAILED: Final = "Failed"
PHASES: Final = (PHASE_PENDING, PHASE_RUNNING, PHASE_SUSPENDED, PHASE_SUCCEEDED, PHASE_FAILED)

# ---- reasons (CamelCase, as metav1 requires) --------------------------------------------------------
# Ready / Progressing / Degraded
REASON_ALL_ROLES_READY: Final = "AllRolesReady"
REASON_ROLES_NOT_READY: Final = "RolesNotReady"
REASON_WAITING_FOR_POLICY: Final = "WaitingForPolicy"      # generator pods up, current policy not loaded
REASON_UNSCHEDULABLE: Final = "Unschedulable"              # pods no node fits (Ready, Degraded, ScalingLimited)
REASON_RECONCILING: Final = "Reconciling"
REASON_RECONCILED: Final = "Reconciled"
REASON_SCALING_UP: Final = "ScalingUp"
REASON_SCALING_DOWN: Final = "ScalingDown"
REASON_REPLICAS_UNAVAILABLE: Final = "ReplicasUnavailable"
REASON_METRICS_UNAVAILABLE: Final = "MetricsUnavailable"   # autoscaler fell back to fallbackReplicas
# Suspended
REASON_SUSPENDED: Final = "SuspendedBySpec"
REASON_RESUMED: Final = "Resumed"
REASON_NOT_SUSPENDED: Final = "NotSuspended"
REASON_WAITING_FOR_KUEUE: Final = "WaitingForKueue"  # spec.queueName: every role at 0 until admitted
# Complete / Failed
REASON_STEPS_COMPLETED: Final = "StepsCompleted"
REASON_FORECAST_PLATEAU: Final = "ForecastPlateau"          # spec.stopPolicy.minGain ended the run
REASON_FORECAST_BELOW_TARGET: Final = "ForecastBelowTarget"  # spec.stopPolicy.target ended the run
REASON_INVALID_SPEC: Final = "InvalidSpec"
REASON_CHILD_APPLY_FAILED: Final = "ChildApplyFailed"
REASON_MAX_RESTARTS_EXCEEDED: Final = "MaxRestartsExceeded"
REASON_DEADLINE_EXCEEDED: Final = "DeadlineExceeded"
REASON_RUNNING: Final = "Running"
# LearnerStarved
REASON_STARVED: Final = "BatchWaitAboveTarget"
REASON_FED: Final = "BatchWaitWithinTarget"
# PolicyLagExceeded
REASON_STALENESS_AT_BOUND: Final = "StalenessAtBound"
REASON_STALENESS_WITHIN_BOUND: Final = "StalenessWithinBound"
# BusReachable
REASON_BROKERS_ADVERTISE_LOOPBACK: Final = "BrokersAdvertiseLoopback"  # metadata names 127.0.0.0/8, ::1, localhost
REASON_BROKERS_ADVERTISED: Final = "BrokersAdvertiseReachableAddresses"
# ScalingLimited
REASON_PARTITION_CAP: Final = "PartitionCap"               # verifiers capped at the topic's partitions
REASON_MAX_REPLICAS: Final = "TooManyReplicas"             # HPA's wording for "capped at maxReplicas"
REASON_MIN_REPLICAS: Final = "TooFewReplicas"
REASON_RATE_LIMITED: Final = "ScaleRateLimited"            # a scale-up/down policy cut the change
REASON_STALENESS_HOLD: Final = "StalenessHold"             # generators held: staleness near the bound
REASON_PAUSED: Final = "AutoscalingPaused"                 # scalerl.dev/autoscaling-paused annotation
REASON_WITHIN_BOUNDS: Final = "DesiredWithinRange"
REASON_AUTOSCALING_DISABLED: Final = "AutoscalingDisabled"
REASON_STEP_NOT_ADVANCING: Final = "StepNotAdvancing"      # LearnerStalled: the group was restarted
REASON_STEP_ADVANCING: Final = "StepAdvancing"

Status = Literal["True", "False", "Unknown"]


def rfc3339(t: datetime) -> str:
    """`2025-01-02T03:04:05Z`: metav1.Time's wire form (whole seconds, UTC)."""
    if t.tzinfo is None:
        raise ValueError("condition times must be timezone-aware (got a naive datetime)")
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_us(t: float) -> str:
    """`2027-01-15T08:00:00.250000Z`: RFC 3339 UTC with microseconds (metav1.MicroTime: Lease times,
    autoscaler cool-downs)."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_rfc3339(s: str) -> float:
    """Epoch seconds of an RFC 3339 time ("...Z" or "+00:00", with or without fractional seconds)."""
    t = datetime.fromisoformat(s.replace("Z", "+00:00"))
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


def get_condition(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> dict[str, Any] | None:
    """The condition of this type, or None (looked up by type, never by position)."""
    for cond in conditions or ():
        if cond.get("type") == type_:
            return dict(cond)
    return None


def is_true(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> bool:
    cond = get_condition(conditions, type_)
    return cond is not None and cond.get("status") == "True"


def set_condition(conditions: Sequence[Mapping[str, Any]] | None, type_: str, status: Status, reason: str,
                  message: str, generation: int | None, now: datetime) -> list[dict[str, Any]]:
    """A copy of `conditions` with the `type_` condition set to these values.

    `lastTransitionTime` becomes `now` only when the condition is new or its status changes; a new
    reason, message or generation with the same status keeps the old time. Other conditions and the
    order of the list are kept; a new type is appended.
    """
    if status not in ("True", "False", "Unknown"):
        raise ValueError(f"condition status must be True, False or Unknown (got {status!r})")
    if not reason:
        raise ValueError(f"condition {type_}: reason must not be empty")
    out = [dict(c) for c in conditions or ()]
    at = next((i for i, cond in enumerate(out) if cond.get("type") == type_), None)
    old: dict[str, Any] = out[at] if at is not None else {}
    kept = old.get("status") == status and old.get("lastTransitionTime")
    new = {"type": type_, "status": status, "reason": reason, "message": message,
           "lastTransitionTime": old["lastTransitionTime"] if kept else rfc3339(now)}
    if generation is not None:
        new["observedGeneration"] = generation
    if at is None:
        out.append(new)
    else:
        out[at] = new
    return out


def is_ready(obj: Mapping[str, Any]) -> bool:
    """Ready = the status describes the current generation and its Ready condition is True."""
    status = obj.get("status") or {}
    generation = (obj.get("metadata") or {}).get("generation")
    return (generation is not None and status.get("observedGeneration") == generation
            and is_true(status.get("conditions"), READY))
