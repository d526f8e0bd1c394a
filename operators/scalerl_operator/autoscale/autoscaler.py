"""RL-aware autoscaling: what each pool's metric asks for. Pure functions, no I/O.

Two metric proposals feed the HPA v2 normaliser of `scalerl_operator.autoscale.hpa` (`decide`):

- **verifiers** on the consumer-group lag of `<job>.rollouts` (KEDA's Kafka scaler semantics):
  desired = ceil(total lag / targetLagPerReplica), left unchanged while lag / (target × current) is
  within `tolerance` of 1 (HPA's AverageValue rule); lag at or below `activationLag` → minReplicas
  (the scaler is inactive); capped at the partition count (a consumer beyond it would own no
  partition and sit idle), reported as ScalingLimited / PartitionCap. A group with no committed
  offset at all (a fresh job, or offsets expired) follows `noOffsetPolicy`:
    * `minReplicas` — treat the group as inactive and scale to minReplicas (KEDA's
      `offsetResetPolicy: latest`): the safe default, a new job starts small and grows once the
      verifiers commit;
    * `hold` — keep the current replica count until a commit appears (an operator restart or an
      offsets-retention expiry must not resize a pool that was fine);
    * `lagFromEarliest` — count every retained record as lag (KEDA's `offsetResetPolicy:
      earliest`): right when the verifiers will indeed start from the earliest offset, as ours do
      (`auto_offset_reset="earliest"`), so a backlog produced before the first commit scales them.
- **verifiers serving tool calls** (`environment.tools`: the generators wait on each observation, so their
  load shows as busy execution slots, not as lag) also on the mean `busy_fraction` the replicas report
  (`environment_proposal`, an HPA utilisation metric: desired = ceil(current × busy / targetBusyFraction));
  the pool takes the larger of the two proposals, as an HPA with two metrics does. Reports older than
  `ENV_REPORT_MAX_AGE_S` (a replica gone) are not counted;
- **generators** on what the learner reports: *starvation* s (fraction of the learner's step wall
  time spent waiting for a batch) drives desired = ceil(current × s / targetStarvation), as an HPA
  utilisation metric would; *staleness* (policy versions between the samples' generating weights and
  the learner) overrides it: within `stalenessHeadroom` versions of the bound k the pool is held (no
  scale-up — extra generators would only make samples the learner drops as older than k; a
  starvation-driven shrink is still allowed), at or beyond k it shrinks by one replica per decision
  (then the scale-down stabilisation window paces it like any other shrink).

Three traps the plain HPA formulas fall into, handled here:
- **scale from zero**: ratio × 0 replicas is 0, so a generator pool at 0 would never grow; at 0 it
  scales to one replica when prompts wait for the generators (`scale_from_zero`, the prompts topic's
  lag), as KEDA activates a pool;
- **never zero with work waiting**: a verifier pool at 0 commits nothing, so with `minReplicas: 0`
  and `noOffsetPolicy: minReplicas` (or lag below `activationLag`) it would stay at 0 forever; any
  lag keeps at least one verifier;
- **Pending pods are not capacity**: pods the scheduler cannot place (`PodScheduled=False`,
  `Unschedulable`) do not count as replicas serving; the generator ratio is taken over the placed
  ones and no scale-up happens while some do not fit (`cap_unschedulable`, ScalingLimited
  `Unschedulable` naming the missing resource, e.g. "Insufficient nvidia.com/gpu").

Example decision (verifier, target 50 records/replica, 8 partitions, current 2, lag 260 records):
ratio 260 / (50 × 2) = 2.6 → ceil(260 / 50) = 6 → the default scale-up policy allows max(2 + 4,
2 × 2) = 6 within 15 s → 6 replicas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from scalerl_operator.api import conditions as c
from scalerl_operator.autoscale.hpa import (
    DEFAULT_SCALE_DOWN,
    DEFAULT_SCALE_UP,
    DESIRED_WITHIN_RANGE,
    FAILED_GET_METRIC,
    FALLBACK,
    PAUSE_ANNOTATION,
    PAUSED,
    RATE_LIMITED,
    SCALING_DISABLED,
    TOO_FEW,
    TOO_MANY,
    Decision,
    Proposal,
    ScalerConfig,
    ScalerState,
    ScalingPolicy,
    ScalingRules,
    Timed,
    decide,
    direction_changes,
    scale_down_limit,
    scale_up_limit,
    stabilize,
)
from scalerl_operator.cluster.scheduling import missing_resources, scheduling_block

__all__ = [
    "BELOW_ACTIVATION",
    "DEFAULT_SCALE_DOWN",
    "DEFAULT_SCALE_UP",
    "DESIRED_WITHIN_RANGE",
    "ENVIRONMENT_BUSY",
    "ENV_REPORT_MAX_AGE_S",
    "FAILED_GET_METRIC",
    "FALLBACK",
    "LAG",
    "NO_COMMITTED_OFFSET",
    "PARTITION_LIMIT",
    "PAUSED",
    "PAUSE_ANNOTATION",
    "RATE_LIMITED",
    "SCALING_DISABLED",
    "STALENESS_AT_BOUND",
    "STALENESS_HEADROOM",
    "STARVATION",
    "TOO_FEW",
    "TOO_MANY",
    "WITHIN_TOLERANCE",
    "BusyReading",
    "Decision",
    "LagReading",
    "LagTarget",
    "LearnerReading",
    "Proposal",
    "ScalerConfig",
    "ScalerState",
    "ScalingPolicy",
    "ScalingRules",
    "StarvationTarget",
    "Timed",
    "busy_reading",
    "decide",
    "direction_changes",
    "environment_proposal",
    "generator_proposal",
    "larger",
    "scale_down_limit",
    "scale_up_limit",
    "stabilize",
    "verifier_proposal",
]

NoOffsetPolicy = Literal["minReplicas", "hold", "lagFromEarliest"]
NO_OFFSET_POLICIES: tuple[str, ...] = ("minReplicas", "hold", "lagFromEarliest")

# proposal reasons (the Event reason of a scale); the ScalingLimited ones come from api/conditions.py
WITHIN_TOLERANCE = "WithinTolerance"
LAG = "ConsumerLag"
BELOW_ACTIVATION = "BelowActivation"
NO_COMMITTED_OFFSET = "NoCommittedOffset"
STARVATION = "LearnerStarvation"
ENVIRONMENT_BUSY = "EnvironmentBusy"
ENV_REPORT_MAX_AGE_S = 30.0
STALENESS_AT_BOUND = c.REASON_STALENESS_AT_BOUND
STALENESS_HEADROOM = c.REASON_STALENESS_HOLD
PARTITION_LIMIT = c.REASON_PARTITION_CAP
SCALE_FROM_ZERO = "ScaleFromZero"
WORK_WAITING = "WorkWaiting"
UNSCHEDULABLE = c.REASON_UNSCHEDULABLE


@dataclass(frozen=True, slots=True)
class Unschedulable:
    """Pods of a pool the scheduler could not place, and why (e.g. "Insufficient nvidia.com/gpu")."""

    pods: int = 0
    why: str = ""


def unschedulable(pods: list[dict[str, Any]]) -> Unschedulable:
    """Count the Pending pods whose PodScheduled condition is False/Unschedulable (or SchedulingGated:
    a queue such as Kueue has not admitted them; `scheduling.scheduling_block`); `why` names the
    missing resources from the scheduler's message ("0/4 nodes are available: 4 Insufficient
    nvidia.com/gpu." → "Insufficient nvidia.com/gpu"), else the message's first 200 characters."""
    n, missing, other = 0, set(), ""
    for p in pods:
        block = scheduling_block(p)
        if block is None:
            continue
        n += 1
        reason, msg = block
        if reason == "SchedulingGated":  # Kueue holds it until quota admits it: not capacity either
            other = other or "SchedulingGated (waiting for admission)"
            continue
        found = missing_resources(msg)
        missing.update(found)
        if not found and not other:
            other = msg[:200] or "Unschedulable"
    why = ", ".join(f"Insufficient {r}" for r in sorted(missing)) or other
    return Unschedulable(n, why)


def cap_unschedulable(p: Proposal, *, current: int, role: str, u: Unschedulable) -> Proposal:
    """No scale-up while pods of the pool do not fit (they would only queue behind the others)."""
    if u.pods == 0 or p.replicas <= current:
        return p
    return Proposal(current, p.reason, f"{role}: {u.pods} of {current} pod(s) unschedulable ({u.why}): "
                    f"held at {current} instead of {p.replicas}", limit_reason=UNSCHEDULABLE)


def scale_from_zero(backlog: int) -> Proposal:
    """A pool at zero replicas: one replica when `backlog` records wait for it, else stay at zero."""
    if backlog > 0:
        return Proposal(1, SCALE_FROM_ZERO, f"{backlog} record(s) waiting and no replica: scale from zero")
    return Proposal(0, BELOW_ACTIVATION, "no replica and nothing waiting")


@dataclass(frozen=True, slots=True)
class LagTarget:
    """Verifier metric: records of `<job>.rollouts` not yet committed by the verifier group."""

    target_lag_per_replica: int
    activation_lag: int = 0
    no_offset_policy: NoOffsetPolicy = "minReplicas"

    def __post_init__(self) -> None:
        if self.target_lag_per_replica < 1:
            raise ValueError(f"autoscaling.targetLagPerReplica: must be >= 1, got {self.target_lag_per_replica}")
        if self.no_offset_policy not in NO_OFFSET_POLICIES:
            raise ValueError(f"autoscaling.noOffsetPolicy: {self.no_offset_policy!r} is not one of "
                             f"{', '.join(NO_OFFSET_POLICIES)}")


@dataclass(frozen=True, slots=True)
class LagReading:
    """`total_lag`: Σ over partitions (end offset − committed offset), records; partitions never
    committed count from their earliest offset (KafkaBus.lag). `committed`: the group has committed
    at least one partition of the topic."""

    total_lag: int
    partitions: int
    committed: bool


@dataclass(frozen=True, slots=True)
class StarvationTarget:
    """Generator metrics: learner starvation (target fraction) and policy staleness headroom."""

    target_starvation: float = 0.1
    staleness_headroom: int = 1

    def __post_init__(self) -> None:
        if not 0 < self.target_starvation <= 1:
            raise ValueError(f"autoscaling.targetStarvation: must be in (0, 1], got {self.target_starvation}")


@dataclass(frozen=True, slots=True)
class LearnerReading:
    """`starvation`: fraction of the learner's step time spent waiting for a batch (0..1);
    `staleness`: policy versions between the samples' generating weights and the learner;
    `bound`: the off-policy bound k (versions)."""

    starvation: float
    staleness: float
    bound: int


def verifier_proposal(reading: LagReading, *, current: int, target: LagTarget, cfg: ScalerConfig) -> Proposal:
    """Replicas for the verifier pool from the lag of its input topic (see the module docstring);
    never 0 while records wait (a pool at zero would never commit, so never see its lag fall).

    Example (target 50/replica, 4 partitions): lag 260 with 2 replicas → ceil(260/50) = 6 → capped
    at 4 partitions (limit_reason PartitionCap)."""
    p = _verifier_metric(reading, current=current, target=target, cfg=cfg)
    if p.replicas == 0 and reading.total_lag > 0:
        return Proposal(1, WORK_WAITING, f"{p.message}; but {reading.total_lag} record(s) wait: at least one "
                        "verifier")
    return p


def _verifier_metric(reading: LagReading, *, current: int, target: LagTarget, cfg: ScalerConfig) -> Proposal:
    lag, tgt = reading.total_lag, target.target_lag_per_replica
    if not reading.committed:
        if target.no_offset_policy == "minReplicas":
            return Proposal(cfg.min_replicas, NO_COMMITTED_OFFSET,
                            "the verifier group has no committed offset: noOffsetPolicy=minReplicas")
        if target.no_offset_policy == "hold":
            return Proposal(current, NO_COMMITTED_OFFSET,
                            "the verifier group has no committed offset: noOffsetPolicy=hold")
    if lag <= target.activation_lag:
        return Proposal(cfg.min_replicas, BELOW_ACTIVATION,
                        f"lag {lag} records <= activationLag {target.activation_lag}: inactive")
    if current > 0 and abs(lag / (tgt * current) - 1.0) <= cfg.tolerance:
        return Proposal(current, WITHIN_TOLERANCE,
                        f"lag {lag} records is within tolerance of {tgt}/replica x {current}")
    desired = math.ceil(lag / tgt)
    msg = f"lag {lag} records / {tgt} per replica = {desired}"
    if 0 < reading.partitions < desired:
        return Proposal(reading.partitions, LAG,
                        f"{msg}, capped at {reading.partitions} partitions (extra consumers would idle)",
                        limit_reason=PARTITION_LIMIT)
    return Proposal(desired, LAG, msg)


@dataclass(frozen=True, slots=True)
class BusyReading:
    """`busy`: the mean fraction of execution slots in use over the replicas that reported (0..1);
    `replicas`: how many reported."""

    busy: float
    replicas: int


def busy_reading(reports: dict[str, tuple[float, float]], now_s: float,
                 max_age_s: float = ENV_REPORT_MAX_AGE_S) -> BusyReading | None:
    """The mean of the fresh reports ({replica: (busy fraction, Unix time)}); None when none is fresh."""
    fresh = [busy for busy, t in reports.values() if now_s - t <= max_age_s]
    return BusyReading(sum(fresh) / len(fresh), len(fresh)) if fresh else None


def environment_proposal(reading: BusyReading, *, current: int, target_busy: float, cfg: ScalerConfig) -> Proposal:
    """Replicas for the verifier pool from how busy its tool-call slots are (HPA utilisation semantics).

    Example (target 0.6): 2 replicas at a mean 0.9 busy → ceil(2 × 0.9 / 0.6) = 3."""
    ratio = reading.busy / target_busy
    what = f"tool calls keep {reading.busy:.0%} of the execution slots busy (mean of {reading.replicas} replica(s))"
    if current == 0 or abs(ratio - 1.0) <= cfg.tolerance:
        return Proposal(current, WITHIN_TOLERANCE, f"{what}: within tolerance of the target {target_busy:.0%}")
    desired = math.ceil(current * ratio)
    return Proposal(desired, ENVIRONMENT_BUSY, f"{what} / target {target_busy:.0%} x {current} replicas = {desired}")


def larger(a: Proposal, b: Proposal | None) -> Proposal:
    """The proposal asking for more replicas (`a` on a tie): an HPA with several metrics takes the largest."""
    return b if b is not None and b.replicas > a.replicas else a


def generator_proposal(reading: LearnerReading, *, current: int, target: StarvationTarget,
                       cfg: ScalerConfig) -> Proposal:
    """Replicas for the generator pool from learner starvation, held or shrunk by staleness.

    Example (target 0.1, bound k=8, headroom 1): 2 replicas, starvation 0.35, staleness 3 →
    ceil(2 × 0.35/0.1) = 7; staleness 7 (≥ k − 1) → held at 2; staleness 8 (≥ k) → 1."""
    s, k = reading.starvation, reading.bound
    if k > 0 and reading.staleness >= k:
        return Proposal(max(current - 1, 0), STALENESS_AT_BOUND,
                        f"staleness {reading.staleness:g} versions reached the bound k={k}: shrink by one")
    ratio = s / target.target_starvation
    if current == 0 or abs(ratio - 1.0) <= cfg.tolerance:
        raw, reason = current, WITHIN_TOLERANCE
        msg = f"starvation {s:.3f} is within tolerance of the target {target.target_starvation:g}"
    else:
        raw, reason = math.ceil(current * ratio), STARVATION
        msg = f"starvation {s:.3f} / target {target.target_starvation:g} x {current} replicas = {raw}"
    if k > 0 and reading.staleness >= k - target.staleness_headroom and raw > current:
        return Proposal(current, STALENESS_HEADROOM,
                        f"staleness {reading.staleness:g} versions is within {target.staleness_headroom} of "
                        f"k={k}: hold (more generators would only produce dropped samples)",
                        limit_reason=STALENESS_HEADROOM)
    return Proposal(raw, reason, msg)
