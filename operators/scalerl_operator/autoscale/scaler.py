"""One autoscaler pass for one RLJob: read the metrics, decide, write `/scale`, remember.

- verifiers: the lag of `<job>.rollouts` for the group `<job>.verifiers`, read from the real Kafka
  (`KafkaBus.lag` / `committed` / `partitions`);
- generators: the learner's starvation and staleness (scalerl_operator.cluster.rlstatus); until the learner
  has reported anything the pool is held (a warm-up is not a metric failure), a failed read of the
  metrics topic counts towards `failureThreshold`; at zero replicas the lag of `<job>.prompts` for
  `<job>.generators` decides (scale from zero when prompts wait);
- both: the role's pods the scheduler cannot place are read from the API server; they are not
  capacity (no scale-up while some are Pending/Unschedulable, ScalingLimited names the resource).
The decision math is scalerl_operator.autoscale.autoscaler / hpa (pure). The replica count is written through
the Deployment's /scale subresource, as HPA does, so `kubectl scale` and an external HPA/KEDA see
the same field. The autoscaler state goes to `status.scaling.<role>` with every pass, so an operator
restarted mid-cool-down picks up the same windows; every size change posts a `Scaled` Event.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

from scalerl_operator.api import conditions as c
from scalerl_operator.api.autoscaling import GeneratorAutoscaling, ScaleDownRules, ScaleUpRules, VerifierAutoscaling
from scalerl_operator.api.spec import RLJobSpec
from scalerl_operator.autoscale.autoscaler import (
    PAUSE_ANNOTATION,
    UNSCHEDULABLE,
    Decision,
    LagReading,
    LagTarget,
    LearnerReading,
    Proposal,
    ScalerConfig,
    ScalerState,
    ScalingPolicy,
    ScalingRules,
    StarvationTarget,
    Unschedulable,
    busy_reading,
    cap_unschedulable,
    decide,
    environment_proposal,
    generator_proposal,
    larger,
    scale_from_zero,
    unschedulable,
    verifier_proposal,
)
from scalerl_operator.cluster.kube import Kube
from scalerl_operator.cluster.rlstatus import LearnerStatus
from scalerl_operator.render.names import bus_prefix, child_name, selector

if TYPE_CHECKING:
    from scalerl.bus.kafka import KafkaBus

log = logging.getLogger(__name__)

AWAITING_LEARNER = "AwaitingLearner"
# (topic kind, consumer group role) whose lag the status reports
LAG_TOPICS = (("prompts", "generators"), ("rollouts", "verifiers"), ("scored", "learner"))


def _rules(r: ScaleUpRules | ScaleDownRules) -> ScalingRules:
    return ScalingRules(r.stabilization_window_seconds,
                        tuple(ScalingPolicy(p.type, p.value, p.period_seconds) for p in r.policies), r.select_policy)


def scaler_config(a: GeneratorAutoscaling | VerifierAutoscaling) -> ScalerConfig:
    """The HPA part of a role's `autoscaling` block."""
    return ScalerConfig(min_replicas=a.min_replicas, max_replicas=a.max_replicas, tolerance=a.tolerance,
                        fallback_replicas=a.fallback_replicas, failure_threshold=a.failure_threshold,
                        scale_up=_rules(a.behavior.scale_up), scale_down=_rules(a.behavior.scale_down))


def lag_reading(bus: KafkaBus, job: str) -> LagReading:
    """Lag of `<job>.rollouts` for the verifiers' consumer group, from the broker."""
    topic, group = f"{job}.rollouts", f"{job}.verifiers"
    return LagReading(total_lag=bus.lag(group, topic), partitions=len(bus.partitions(topic)),
                      committed=bool(bus.committed(group, topic)))


def lag_status(bus: KafkaBus, job: str) -> dict[str, Any]:
    """status.lag (records not yet committed per topic by the group that consumes it) and lagTotal."""
    lag = {f"{job}.{kind}": bus.lag(f"{job}.{group}", f"{job}.{kind}") for kind, group in LAG_TOPICS}
    return {"lag": lag, "lagTotal": sum(lag.values())}


def _proposal(role: str, spec: RLJobSpec, name: str, job: str, current: int, cfg: ScalerConfig, bus: KafkaBus,
              learner: LearnerStatus | None, pending: Unschedulable, now_s: float) -> Proposal | None:
    """`name`: the RLJob's; `job`: its topics' prefix (`render.bus_prefix`); `pending`: the pool's
    pods the scheduler cannot place (not capacity)."""
    if role == "verifier":
        a = spec.roles.verifier.autoscaling
        target = LagTarget(a.target_lag_per_replica, a.activation_lag, a.no_offset_policy)
        try:
            reading = lag_reading(bus, job)
        except Exception as exc:  # any broker or client failure is a failed metric read
            log.warning("%s: reading the verifier lag failed: %s", job, exc)
            return None
        p = verifier_proposal(reading, current=current, target=target, cfg=cfg)
        busy = busy_reading(learner.environment, now_s) if learner is not None else None
        if busy is not None:  # the replicas serve tool calls: their slots' load counts too
            p = larger(p, environment_proposal(busy, current=current, target_busy=a.target_busy_fraction, cfg=cfg))
        return cap_unschedulable(p, current=current, role=role, u=pending)
    if current == 0:  # ratio x 0 is 0: the prompts waiting for the generators decide
        try:
            return scale_from_zero(bus.lag(f"{job}.generators", f"{job}.prompts"))
        except Exception as exc:
            log.warning("%s: reading the prompts lag failed: %s", job, exc)
            return None
    if learner is None:
        return None
    if learner.starvation is None or learner.staleness is None:
        return Proposal(current, AWAITING_LEARNER, "no starvation/staleness reported by the learner yet: hold")
    placed = current - pending.pods
    if placed <= 0:  # nothing placed: hold (shrinking would only drop the pods a cluster autoscaler waits on)
        return Proposal(current, UNSCHEDULABLE, f"{role}: none of {current} pod(s) placed ({pending.why}): held",
                        limit_reason=UNSCHEDULABLE)
    g = spec.roles.generator.autoscaling
    k = spec.job_spec(name).off_policy.k
    p = generator_proposal(LearnerReading(learner.starvation, learner.staleness, k), current=placed,
                           target=StarvationTarget(g.target_starvation, g.staleness_headroom), cfg=cfg)
    return cap_unschedulable(p, current=current, role=role, u=pending)


def autoscale(kube: Kube, obj: dict[str, Any], spec: RLJobSpec, *, bus: KafkaBus,
              learner: LearnerStatus | None, now_s: float) -> dict[str, Decision]:
    """Decide and apply both pools' sizes; returns the decisions (empty when nothing is autoscaled)."""
    m = obj["metadata"]
    name, ns = m["name"], m["namespace"]
    paused = (m.get("annotations") or {}).get(PAUSE_ANNOTATION) == "true"
    scaling = (obj.get("status") or {}).get("scaling") or {}
    decisions: dict[str, Decision] = {}
    for role in ("verifier", "generator"):
        a = getattr(spec.roles, role).autoscaling
        scale = kube.get_scale(ns, child_name(name, role)) if a.enabled and not spec.suspend else None
        if scale is None:
            continue
        current = int(scale["spec"].get("replicas") or 0)
        cfg = scaler_config(a)
        pods = kube.list_objects("v1", "Pod", ns, ",".join(f"{k}={v}" for k, v in selector(name, role).items()))
        proposal = None if paused else _proposal(role, spec, name, bus_prefix(name, ns), current, cfg, bus, learner,
                                                 unschedulable(pods), now_s)
        d = decide(current=current, proposal=proposal, cfg=cfg, state=ScalerState.from_status(scaling.get(role)),
                   now_s=now_s, paused=paused)
        if d.changed:
            kube.set_scale(ns, child_name(name, role), d.replicas)
            kube.event(obj, "Normal", "Scaled", f"{role}: {d.current} -> {d.replicas} replicas ({d.reason}: "
                       f"{d.message})", "Scale")
            log.info("%s/%s %s: %d -> %d replicas (%s)", ns, name, role, d.current, d.replicas, d.message)
        decisions[role] = d
    return decisions


def scaling_status(obj: dict[str, Any], decisions: dict[str, Decision], now: datetime) -> dict[str, Any]:
    """status.scaling and the ScalingLimited condition for these decisions (pure)."""
    gen = obj["metadata"].get("generation")
    conds = (obj.get("status") or {}).get("conditions")
    scaling = {role: {**d.state.to_status(), "desiredReplicas": d.replicas, "reason": d.reason,
                      "message": d.message[:1024]} for role, d in decisions.items()}
    limited = [(role, d) for role, d in decisions.items() if d.limited]
    if limited:
        reason = limited[0][1].limit_reason
        msg = "; ".join(f"{role}: {d.limit_message}" for role, d in limited)
        conds = c.set_condition(conds, c.SCALING_LIMITED, "True", reason, msg, gen, now)
    elif decisions:
        paused = all(d.reason == c.REASON_PAUSED for d in decisions.values())
        conds = c.set_condition(conds, c.SCALING_LIMITED, "False",
                                c.REASON_PAUSED if paused else c.REASON_WITHIN_BOUNDS,
                                "autoscaling paused" if paused else "every pool is within its bounds",
                                gen, now)
    return {"scaling": scaling, "conditions": conds}

