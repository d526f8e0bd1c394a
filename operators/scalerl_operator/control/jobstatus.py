"""The status of one RLJob: phase, conditions, ready/desired per role and the RL fields, computed from
what a reconcile pass observed (`status_patch`, pure), and the one place it is written (`write_status`:
a /status patch, and an Event when the phase changes).

Succeeded, and Failed for a reason a new spec cannot fix, are terminal (`is_terminal`): the reconciler
then scales every role to zero and leaves the objects for inspection.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from scalerl.scaling.devices import DevicePool
from scalerl_operator.api import conditions as c
from scalerl_operator.api.spec import RLJobSpec
from scalerl_operator.cluster.kube import Kube
from scalerl_operator.cluster.rlstatus import LearnerStatus, to_status
from scalerl_operator.cluster.scheduling import Unschedulable, summary
from scalerl_operator.control import kueue
from scalerl_operator.render.devices import devices_status

MAX_MESSAGE = 4000  # characters of a condition message (the scheduler's messages can be long)
SPEC_REPLICAS = "specReplicas"  # status.scaling.<role>: spec replicas last applied (autoscaling off)


def is_terminal(status: dict[str, Any]) -> bool:
    """Succeeded, or Failed for a reason a new spec cannot fix."""
    if status.get("phase") == c.PHASE_SUCCEEDED:
        return True
    failed = c.get_condition(status.get("conditions"), c.FAILED)
    return status.get("phase") == c.PHASE_FAILED and failed is not None and failed["reason"] not in (
        c.REASON_INVALID_SPEC, c.REASON_CHILD_APPLY_FAILED)


def failed_status(obj: dict[str, Any], reason: str, message: str, now: datetime) -> dict[str, Any]:
    gen = obj["metadata"].get("generation")
    conds = (obj.get("status") or {}).get("conditions")
    for t, s in ((c.FAILED, "True"), (c.READY, "False"), (c.PROGRESSING, "False")):
        conds = c.set_condition(conds, t, s, reason, message, gen, now)  # type: ignore[arg-type]
    return {"observedGeneration": gen, "phase": c.PHASE_FAILED, "conditions": conds}


def _summary(roles: dict[str, tuple[int, int]]) -> str:
    return ", ".join(f"{r} {ready}/{want}" for r, (ready, want) in roles.items())


def status_patch(obj: dict[str, Any], spec: RLJobSpec, *, roles: dict[str, tuple[int, int]],
                 learner: LearnerStatus, now: datetime, restarts: int = 0,
                 devices: DevicePool | None = None,
                 pending: dict[str, Unschedulable] | None = None, queue: kueue.Queue | None = None) -> dict[str, Any]:
    """The status of a realisable RLJob (pure): phase, conditions, ready/desired per role, RL fields.
    `restarts`: learner group restarts so far (gang_pass: one per restart of the whole torchrun group);
    more than failurePolicy.maxRestarts fails the job.
    `devices`: the pool rendered into pool.json this pass (status.devices).
    `pending`: per role, the pods the scheduler cannot place (scalerl_operator.cluster.scheduling): while
    some are, Ready=False says `Unschedulable` and names the missing resources.
    `queue`: where the job stands in Kueue (spec.queueName; scalerl_operator.control.kueue): until admitted the
    job is held like a suspended one (phase Suspended, Suspended reason WaitingForKueue), and the
    QueueAdmitted condition carries Kueue's reason and message."""
    gen = obj["metadata"].get("generation")
    prev = obj.get("status") or {}
    conds = prev.get("conditions")
    out: dict[str, Any] = {"observedGeneration": gen, "restarts": max(int(prev.get("restarts") or 0), restarts),
                           "roles": {r: {"ready": rd, "desired": d, "summary": f"{rd}/{d}"}
                                     for r, (rd, d) in roles.items()}}
    if devices is not None:
        out["devices"] = devices_status(devices)
    k = spec.job_spec("status").off_policy.k
    if learner.records:
        out.update(to_status(learner, store_uri=spec.store.uri, bound_k=k))
    start = prev.get("startTime")
    deadline = spec.active_deadline_seconds
    held = spec.suspend or (queue is not None and not queue.admitted)
    if is_terminal(prev):
        return {**out, "phase": prev["phase"]}
    if learner.done:
        phase, why = c.PHASE_SUCCEEDED, finished_why(learner)
    elif held:
        phase, why = c.PHASE_SUSPENDED, (c.REASON_SUSPENDED, "spec.suspend: every role at 0, checkpoints kept" + (
            f" (queue {spec.queue_name}: the Workload is inactive)" if spec.queue_name else "")) if spec.suspend else (
            c.REASON_WAITING_FOR_KUEUE, f"every role at 0 until Kueue admits the job: {queue.message if queue else ''}")
        start = None  # as for a Job, the deadline counts from the last resume
    elif out["restarts"] > spec.failure_policy.max_restarts:
        phase, why = c.PHASE_FAILED, (c.REASON_MAX_RESTARTS_EXCEEDED, f"the learner restarted {out['restarts']} "
                                      f"times, failurePolicy.maxRestarts is {spec.failure_policy.max_restarts}")
    elif deadline is not None and start and now.timestamp() - c.parse_rfc3339(start) > deadline:
        phase, why = c.PHASE_FAILED, (c.REASON_DEADLINE_EXCEEDED, f"activeDeadlineSeconds {deadline} passed")
    else:
        ready_all = all(rd >= d for rd, d in roles.values())
        learner_up = roles["learner"][0] >= max(1, roles["learner"][1])
        was_running = prev.get("phase") == c.PHASE_RUNNING
        phase = c.PHASE_RUNNING if learner_up or was_running else c.PHASE_PENDING
        why = (c.REASON_ALL_ROLES_READY if ready_all else c.REASON_ROLES_NOT_READY, _summary(roles))
        if not ready_all and pending:
            why = (c.REASON_UNSCHEDULABLE, f"{_summary(roles)}; {summary(pending)}"[:MAX_MESSAGE])
        start = start or c.rfc3339(now)
    out["startTime"] = start
    ready = phase in (c.PHASE_RUNNING, c.PHASE_PENDING) and why[0] == c.REASON_ALL_ROLES_READY
    progressing = phase in (c.PHASE_RUNNING, c.PHASE_PENDING) and not ready
    degraded = phase == c.PHASE_RUNNING and not ready
    susp_reason = why[0] if held else (
        c.REASON_RESUMED if c.is_true(conds, c.SUSPENDED) else c.REASON_NOT_SUSPENDED)
    updates: list[tuple[str, bool, str, str]] = [
        (c.READY, ready, why[0], why[1]),
        (c.PROGRESSING, progressing, c.REASON_RECONCILING if progressing else c.REASON_RECONCILED, _summary(roles)),
        (c.DEGRADED, degraded, (why[0] if why[0] == c.REASON_UNSCHEDULABLE else c.REASON_REPLICAS_UNAVAILABLE)
         if degraded else c.REASON_ALL_ROLES_READY, why[1] if degraded else _summary(roles)),
        (c.SUSPENDED, held, susp_reason, why[1] if held else "spec.suspend is false" + (
            f" and Kueue admitted the job ({queue.message})" if queue else "")),
        (c.COMPLETE, phase == c.PHASE_SUCCEEDED, why[0] if learner.done else c.REASON_RUNNING,
         why[1] if learner.done else "training"),
        (c.FAILED, phase == c.PHASE_FAILED, why[0] if phase == c.PHASE_FAILED else c.REASON_RUNNING,
         why[1] if phase == c.PHASE_FAILED else "no failure"),
    ]
    if queue is not None:
        updates.append((c.QUEUE_ADMITTED, queue.admitted, queue.reason, queue.message[:MAX_MESSAGE]))
    target = spec.roles.generator.autoscaling.target_starvation
    tol = spec.roles.generator.autoscaling.tolerance
    if learner.starvation is not None:
        starved = learner.starvation > target * (1 + tol)
        updates.append((c.LEARNER_STARVED, starved, c.REASON_STARVED if starved else c.REASON_FED,
                        f"the learner waits {learner.starvation:.1%} of its step time for batches (target "
                        f"{target:.0%})"))
    if learner.staleness is not None:
        at = learner.staleness >= k
        lag_reason = c.REASON_STALENESS_AT_BOUND if at else c.REASON_STALENESS_WITHIN_BOUND
        updates.append((c.POLICY_LAG_EXCEEDED, at, lag_reason,
                        f"staleness {learner.staleness:g} policy versions, bound k={k}"))
    for type_, flag, reason, message in updates:
        conds = c.set_condition(conds, type_, "True" if flag else "False", reason, message, gen, now)
    return {**out, "phase": phase, "conditions": conds}


def bus_reachable_patch(obj: dict[str, Any], problem: str | None,
                        now: datetime) -> tuple[dict[str, Any] | None, bool]:
    """(the /status patch of condition BusReachable, None when it says that already; whether to post a
    Warning Event: it has just turned False). `problem`: `kafka_access.loopback_problem`'s line, or None."""
    prev = (obj.get("status") or {}).get("conditions")
    was = c.get_condition(prev, c.BUS_REACHABLE)
    reason = c.REASON_BROKERS_ADVERTISE_LOOPBACK if problem else c.REASON_BROKERS_ADVERTISED
    message = problem or "the brokers advertise addresses other than loopback"
    conds = c.set_condition(prev, c.BUS_REACHABLE, "False" if problem else "True", reason, message[:MAX_MESSAGE],
                            obj["metadata"].get("generation"), now)
    if conds == prev:
        return None, False
    return {"conditions": conds}, problem is not None and (was is None or was["status"] != "False")


def spec_replicas_status(spec: RLJobSpec, *, terminal: bool) -> dict[str, Any]:
    """status.scaling.<role>.specReplicas of the pools the operator does not autoscale: the spec
    replicas applied now (None while suspended or terminal, so a resume applies spec.replicas again)."""
    off = [r for r in ("generator", "verifier") if not getattr(spec.roles, r).autoscaling.enabled]
    return {r: {SPEC_REPLICAS: None if spec.suspend or terminal else getattr(spec.roles, r).replicas} for r in off}


def finished_why(learner: LearnerStatus) -> tuple[str, str]:
    """(reason, message) of a learner that reported the run done: its steps, or spec.stopPolicy's forecast."""
    stop = learner.stopped_early
    if stop is None:
        return c.REASON_STEPS_COMPLETED, f"the learner finished at step {learner.step}"
    if stop["reason"] == c.REASON_FORECAST_PLATEAU:
        detail = (f"the rest of the budget ({stop['compute']:.4g} -> {stop['budgetCompute']:.4g} device-hours) adds "
                  f"at most {stop['gainHigh']:+.3f} to the pass rate ({stop['level']:.0%} interval)")
    else:
        detail = f"the ceiling A is at most {stop['AHigh']:.3f} ({stop['level']:.0%} interval)"
    return stop["reason"], f"spec.stopPolicy stopped the run at step {stop['step']}: {detail}"[:MAX_MESSAGE]


def write_status(kube: Kube, obj: dict[str, Any], patch: dict[str, Any]) -> None:
    """Patch /status; post an Event when the phase changes."""
    old = (obj.get("status") or {}).get("phase")
    kube.patch_status(obj["metadata"]["namespace"], obj["metadata"]["name"], patch)
    new = patch.get("phase")
    if new is not None and new != old:
        failed = c.get_condition(patch.get("conditions"), c.FAILED)
        complete = c.get_condition(patch.get("conditions"), c.COMPLETE)
        warn = new == c.PHASE_FAILED
        forecast = (new == c.PHASE_SUCCEEDED and complete is not None
                    and complete["reason"] in (c.REASON_FORECAST_PLATEAU, c.REASON_FORECAST_BELOW_TARGET))
        msg = f"phase {old or 'None'} -> {new}" + (f": {failed['message']}" if warn and failed else "")
        if forecast and complete is not None:  # the Event names the forecast and the numbers it rested on
            msg = f"{msg}: {complete['message']}"
        reason = failed["reason"] if warn and failed else complete["reason"] if forecast and complete else f"Phase{new}"
        kube.event(obj, "Warning" if warn else "Normal", reason, msg, "PhaseChange")
