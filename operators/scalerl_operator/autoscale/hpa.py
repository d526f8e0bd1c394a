"""The HPA v2 normaliser behind the RL autoscaler: pure functions, no I/O, no clock (`now_s` is given).

It follows the HorizontalPodAutoscaler controller (k8s pkg/controller/podautoscaler, read, not
copied), with the same field names. A metric proposal is recorded, then stabilised (scale-up: the
*minimum* of the recommendations inside `scaleUp.stabilizationWindowSeconds`; scale-down: the
*maximum* inside `scaleDown.stabilizationWindowSeconds`, 300 s by default), then rate-limited by
the policies (Pods / Percent per `periodSeconds`, measured from the replica count at the start of
the period, combined by `selectPolicy` Max / Min / Disabled) and clamped to [minReplicas,
maxReplicas]. KEDA's fallback: after `failureThreshold` consecutive failed metric reads the proposal
becomes `fallbackReplicas` (still normalised); before that a failed read changes nothing. The pause
annotation freezes everything. All history lives in `ScalerState`, which round-trips through the
RLJob status (`status.scaling.<role>`), so a restarted operator keeps its cool-downs.

Departures from HPA, on purpose:
1. One `tolerance` for both directions (HPA ≥1.33 has one per direction, behind a feature gate);
   it is applied by the metric proposals (scalerl_operator.autoscale.autoscaler), as HPA does per metric.
2. Scale events are one signed list instead of two lists; the sums per period are the same.
3. A cap the metric itself hit (partition count, staleness hold) is carried by the proposal and
   reported as ScalingLimited, like a rate limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from scalerl_operator.api import conditions as c

PAUSE_ANNOTATION = "scalerl.dev/autoscaling-paused"
"""`scalerl.dev/autoscaling-paused: "true"` on the RLJob freezes both pools at their current size."""

PolicyType = Literal["Pods", "Percent"]
SelectPolicy = Literal["Max", "Min", "Disabled"]

# decision reasons; the ones that can become the ScalingLimited condition's reason are api/conditions.py's
FAILED_GET_METRIC = "FailedGetMetric"
FALLBACK = c.REASON_METRICS_UNAVAILABLE
PAUSED = c.REASON_PAUSED
SCALING_DISABLED = c.REASON_AUTOSCALING_DISABLED
TOO_MANY = c.REASON_MAX_REPLICAS
TOO_FEW = c.REASON_MIN_REPLICAS
RATE_LIMITED = c.REASON_RATE_LIMITED
DESIRED_WITHIN_RANGE = c.REASON_WITHIN_BOUNDS


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    """At most `value` pods (Pods) or `value` % of the period's starting size (Percent) per
    `period_seconds` (HPAScalingPolicy)."""

    type: PolicyType
    value: int
    period_seconds: int


@dataclass(frozen=True, slots=True)
class ScalingRules:
    """One direction of HPAScalingRules."""

    stabilization_window_seconds: int
    policies: tuple[ScalingPolicy, ...]
    select_policy: SelectPolicy = "Max"


# HPA v2 defaults (autoscaling/v2 HorizontalPodAutoscalerBehavior)
DEFAULT_SCALE_UP = ScalingRules(0, (ScalingPolicy("Pods", 4, 15), ScalingPolicy("Percent", 100, 15)))
DEFAULT_SCALE_DOWN = ScalingRules(300, (ScalingPolicy("Percent", 100, 15),))


@dataclass(frozen=True, slots=True)
class ScalerConfig:
    """The role-independent part of a role's `autoscaling` block."""

    min_replicas: int
    max_replicas: int
    tolerance: float = 0.1
    fallback_replicas: int = 1
    failure_threshold: int = 3
    scale_up: ScalingRules = DEFAULT_SCALE_UP
    scale_down: ScalingRules = DEFAULT_SCALE_DOWN

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"autoscaling: need 0 <= minReplicas <= maxReplicas, got "
                             f"{self.min_replicas} > {self.max_replicas}")
        if self.tolerance < 0:
            raise ValueError(f"autoscaling.tolerance: must be >= 0, got {self.tolerance}")


@dataclass(frozen=True, slots=True)
class Proposal:
    """A metric's replica recommendation before normalisation."""

    replicas: int
    reason: str
    message: str
    limit_reason: str | None = None  # set when the metric itself was capped (partitions, staleness)


@dataclass(frozen=True, slots=True)
class Timed:
    """A value stamped with the epoch time (s) it was recorded at."""

    time_s: float
    value: int


@dataclass(frozen=True, slots=True)
class ScalerState:
    """What a pool's autoscaler remembers between decisions (kept in status.scaling.<role>)."""

    recommendations: tuple[Timed, ...] = ()  # raw (unstabilised) proposals
    scale_events: tuple[Timed, ...] = ()  # signed replica changes actually applied
    last_scale_time_s: float | None = None
    last_replicas: int | None = None
    consecutive_failures: int = 0

    def to_status(self) -> dict[str, Any]:
        """camelCase JSON for status.scaling.<role> (spec.ScalingState; scaleEvents is an extra key)."""
        return {
            "lastScaleTime": None if self.last_scale_time_s is None else c.rfc3339_us(self.last_scale_time_s),
            "lastReplicas": self.last_replicas,
            "consecutiveFailures": self.consecutive_failures,
            "recommendations": [{"time": c.rfc3339_us(r.time_s), "replicas": r.value} for r in self.recommendations],
            "scaleEvents": [{"time": c.rfc3339_us(e.time_s), "change": e.value} for e in self.scale_events],
        }

    @classmethod
    def from_status(cls, d: dict[str, Any] | None) -> ScalerState:
        """Inverse of `to_status`; a missing or empty status gives a fresh state."""
        if not d:
            return cls()
        t = d.get("lastScaleTime")
        return cls(
            recommendations=tuple(Timed(c.parse_rfc3339(r["time"]), int(r["replicas"]))
                                  for r in d.get("recommendations") or []),
            scale_events=tuple(Timed(c.parse_rfc3339(e["time"]), int(e["change"])) for e in d.get("scaleEvents") or []),
            last_scale_time_s=c.parse_rfc3339(t) if t else None,
            last_replicas=d.get("lastReplicas"),
            consecutive_failures=int(d.get("consecutiveFailures") or 0),
        )


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one autoscaler pass for one pool."""

    replicas: int  # write this to /scale (== current when nothing changes)
    current: int
    proposed: int  # the metric's (or fallback's) recommendation
    stabilized: int
    reason: str
    message: str
    limited: bool = False  # the ScalingLimited condition
    limit_reason: str = DESIRED_WITHIN_RANGE
    limit_message: str = ""
    state: ScalerState = field(default_factory=ScalerState)

    @property
    def changed(self) -> bool:
        return self.replicas != self.current


def stabilize(history: tuple[Timed, ...], *, desired: int, current: int, now_s: float,
              up_window_s: int, down_window_s: int) -> int:
    """HPA stabilisation: the result lies in [min of recommendations in the up window,
    max of recommendations in the down window], both including `desired`; start from `current`."""
    up = down = desired
    for r in history:
        if r.time_s > now_s - up_window_s:
            up = min(up, r.value)
        if r.time_s > now_s - down_window_s:
            down = max(down, r.value)
    return min(max(current, up), down)


def _period_start(current: int, events: tuple[Timed, ...], period_s: int, now_s: float) -> int:
    """Replicas at the start of the policy period: current − added + removed inside it."""
    return current - sum(e.value for e in events if e.time_s > now_s - period_s)


def scale_up_limit(current: int, events: tuple[Timed, ...], rules: ScalingRules, now_s: float) -> int:
    """Largest size the scale-up policies allow now (HPA calculateScaleUpLimitWithScalingRules)."""
    if rules.select_policy == "Disabled" or not rules.policies:
        return current
    proposals = []
    for p in rules.policies:
        start = _period_start(current, events, p.period_seconds, now_s)
        proposals.append(start + p.value if p.type == "Pods" else math.ceil(start * (1 + p.value / 100)))
    return min(proposals) if rules.select_policy == "Min" else max(proposals)


def scale_down_limit(current: int, events: tuple[Timed, ...], rules: ScalingRules, now_s: float) -> int:
    """Smallest size the scale-down policies allow now (HPA calculateScaleDownLimitWithBehaviors)."""
    if rules.select_policy == "Disabled" or not rules.policies:
        return current
    proposals = []
    for p in rules.policies:
        start = _period_start(current, events, p.period_seconds, now_s)
        proposals.append(start - p.value if p.type == "Pods" else int(start * (1 - p.value / 100)))
    return max(proposals) if rules.select_policy == "Min" else min(proposals)


def limit_rate(desired: int, *, current: int, cfg: ScalerConfig, events: tuple[Timed, ...],
               now_s: float) -> tuple[int, str, str]:
    """Clamp `desired` by the behaviour policies and [min, max] (HPA
    convertDesiredReplicasWithBehaviorRate); returns (replicas, reason, message)."""
    if desired > current:
        up = max(scale_up_limit(current, events, cfg.scale_up, now_s), current)
        if cfg.max_replicas > up:
            allowed, reason, msg = up, RATE_LIMITED, "the desired count rises faster than scaleUp allows"
        else:
            allowed, reason, msg = cfg.max_replicas, TOO_MANY, f"desired count above maxReplicas {cfg.max_replicas}"
        if desired > allowed:
            return allowed, reason, msg
    elif desired < current:
        down = min(scale_down_limit(current, events, cfg.scale_down, now_s), current)
        if cfg.min_replicas < down:
            allowed, reason, msg = down, RATE_LIMITED, "the desired count falls faster than scaleDown allows"
        else:
            allowed, reason, msg = cfg.min_replicas, TOO_FEW, f"desired count below minReplicas {cfg.min_replicas}"
        if desired < allowed:
            return allowed, reason, msg
    return desired, DESIRED_WITHIN_RANGE, "the desired count is within the acceptable range"


def _prune(state: ScalerState, cfg: ScalerConfig, now_s: float) -> ScalerState:
    keep_recs = max(cfg.scale_up.stabilization_window_seconds, cfg.scale_down.stabilization_window_seconds)
    periods = [p.period_seconds for p in cfg.scale_up.policies + cfg.scale_down.policies] or [0]
    return replace(state,
                   recommendations=tuple(r for r in state.recommendations if r.time_s > now_s - keep_recs),
                   scale_events=tuple(e for e in state.scale_events if e.time_s > now_s - max(periods)))


def decide(*, current: int, proposal: Proposal | None, cfg: ScalerConfig, state: ScalerState,
           now_s: float, paused: bool = False) -> Decision:
    """One autoscaler pass for one pool. `proposal` None means the metric could not be read.

    Order (HPA reconcileAutoscaler + normalizeDesiredReplicasWithBehaviors): paused → nothing;
    current 0 with minReplicas > 0 → autoscaling disabled (suspended or scaled to zero by hand);
    failed read → nothing until `failureThreshold` failures, then `fallbackReplicas`; out of
    [min, max] → straight to the bound; record the proposal; stabilise; rate-limit and clamp."""
    if paused:
        return Decision(current, current, current, current, PAUSED,
                        f"{PAUSE_ANNOTATION}=true: autoscaling paused", state=state)
    if current == 0 and cfg.min_replicas > 0:
        return Decision(0, 0, 0, 0, SCALING_DISABLED, "current replicas 0: autoscaling is disabled", state=state)
    state = _prune(state, cfg, now_s)
    if proposal is None:
        state = replace(state, consecutive_failures=state.consecutive_failures + 1)
        if state.consecutive_failures < cfg.failure_threshold:
            return Decision(current, current, current, current, FAILED_GET_METRIC,
                            f"metric read failed ({state.consecutive_failures}/{cfg.failure_threshold}): "
                            f"keeping {current} replicas", state=state)
        proposal = Proposal(cfg.fallback_replicas, FALLBACK,
                            f"{state.consecutive_failures} consecutive failed metric reads: fallbackReplicas "
                            f"{cfg.fallback_replicas}")
    else:
        state = replace(state, consecutive_failures=0)
    if current > cfg.max_replicas or current < cfg.min_replicas:
        bound = cfg.max_replicas if current > cfg.max_replicas else cfg.min_replicas
        reason = TOO_MANY if bound < current else TOO_FEW
        return _applied(Decision(bound, current, proposal.replicas, bound, reason,
                                 f"current {current} is outside [{cfg.min_replicas}, {cfg.max_replicas}]",
                                 True, reason, f"current {current} replicas is outside the bounds",
                                 state=state), now_s)
    stabilized = stabilize(state.recommendations, desired=proposal.replicas, current=current, now_s=now_s,
                           up_window_s=cfg.scale_up.stabilization_window_seconds,
                           down_window_s=cfg.scale_down.stabilization_window_seconds)
    state = replace(state, recommendations=(*state.recommendations, Timed(now_s, proposal.replicas)))
    replicas, limit_reason, limit_msg = limit_rate(stabilized, current=current, cfg=cfg,
                                                   events=state.scale_events, now_s=now_s)
    limited = replicas != stabilized
    if not limited and proposal.limit_reason is not None:
        limited, limit_reason, limit_msg = True, proposal.limit_reason, proposal.message
    msg = proposal.message + (f"; stabilised to {stabilized}" if stabilized != proposal.replicas else "")
    return _applied(Decision(replicas, current, proposal.replicas, stabilized, proposal.reason, msg, limited,
                             limit_reason, limit_msg, state), now_s)


def _applied(d: Decision, now_s: float) -> Decision:
    """Record a size change as a scale event (for the rate policies) and as the last scale."""
    if not d.changed:
        return d
    s = replace(d.state, scale_events=(*d.state.scale_events, Timed(now_s, d.replicas - d.current)),
                last_scale_time_s=now_s, last_replicas=d.replicas)
    return replace(d, state=s)


def direction_changes(sizes: list[int]) -> int:
    """How often a replica series reverses direction (up then down, or down then up): the flapping
    count of a run. Example: [1, 2, 2, 1, 3] → 2."""
    changes, last = 0, 0
    for i in range(1, len(sizes)):
        step = (sizes[i] > sizes[i - 1]) - (sizes[i] < sizes[i - 1])
        if step and last and step != last:
            changes += 1
        last = step or last
    return changes
