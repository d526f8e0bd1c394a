"""Table tests of the autoscaler math (operators/scalerl_operator/autoscale/autoscaler.py); every expected
number is worked by hand in the row's comment."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from scalerl_operator.autoscale.autoscaler import (
    BELOW_ACTIVATION,
    DEFAULT_SCALE_UP,
    FAILED_GET_METRIC,
    FALLBACK,
    LAG,
    NO_COMMITTED_OFFSET,
    PARTITION_LIMIT,
    PAUSED,
    RATE_LIMITED,
    SCALING_DISABLED,
    STALENESS_AT_BOUND,
    STALENESS_HEADROOM,
    STARVATION,
    TOO_FEW,
    TOO_MANY,
    WITHIN_TOLERANCE,
    LagReading,
    LagTarget,
    LearnerReading,
    Proposal,
    ScalerConfig,
    ScalerState,
    ScalingPolicy,
    ScalingRules,
    StarvationTarget,
    Timed,
    decide,
    direction_changes,
    generator_proposal,
    scale_down_limit,
    scale_up_limit,
    stabilize,
    verifier_proposal,
)

SIGNAL = Path(__file__).resolve().parents[2] / "data" / "verifier_lag_signal.csv"
T0 = 1_800_000_000.0  # an arbitrary epoch time (s); every test counts from it
CFG = ScalerConfig(min_replicas=1, max_replicas=8)


# ---- verifier proposals ---------------------------------------------------------------------------

@pytest.mark.parametrize(("lag", "partitions", "committed", "current", "target", "want", "reason", "limit"), [
    (0, 8, True, 3, LagTarget(50), 1, BELOW_ACTIVATION, None),            # lag 0 <= activation 0 -> min
    (260, 8, True, 2, LagTarget(50), 6, LAG, None),                       # ceil(260/50) = 6
    (260, 4, True, 2, LagTarget(50), 4, LAG, PARTITION_LIMIT),            # 6 > 4 partitions -> 4
    (105, 8, True, 2, LagTarget(50), 2, WITHIN_TOLERANCE, None),          # 105/(50*2) = 1.05, |0.05| <= 0.1
    (111, 8, True, 2, LagTarget(50), 3, LAG, None),                       # 1.11 > 1.1 -> ceil(111/50) = 3
    (89, 8, True, 2, LagTarget(50), 2, LAG, None),                        # 0.89 < 0.9 -> ceil(89/50) = 2
    (100, 8, True, 4, LagTarget(50, activation_lag=100), 1, BELOW_ACTIVATION, None),  # 100 <= 100 -> min
    (101, 8, True, 1, LagTarget(50, activation_lag=100), 3, LAG, None),   # ceil(101/50) = 3
    (500, 16, False, 5, LagTarget(50, no_offset_policy="minReplicas"), 1, NO_COMMITTED_OFFSET, None),
    (500, 16, False, 5, LagTarget(50, no_offset_policy="hold"), 5, NO_COMMITTED_OFFSET, None),
    (500, 16, False, 1, LagTarget(50, no_offset_policy="lagFromEarliest"), 10, LAG, None),  # 500/50
])
def test_verifier_proposal(lag: int, partitions: int, committed: bool, current: int, target: LagTarget,
                           want: int, reason: str, limit: str | None) -> None:
    p = verifier_proposal(LagReading(lag, partitions, committed), current=current, target=target, cfg=CFG)
    assert (p.replicas, p.reason, p.limit_reason) == (want, reason, limit)


def test_bad_lag_target_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"autoscaling.noOffsetPolicy: 'latest' is not one of minReplicas, hold"):
        LagTarget(50, no_offset_policy="latest")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="targetLagPerReplica"):
        LagTarget(0)
    with pytest.raises(ValueError, match="minReplicas <= maxReplicas"):
        ScalerConfig(min_replicas=3, max_replicas=2)


# ---- generator proposals --------------------------------------------------------------------------

@pytest.mark.parametrize(("starvation", "staleness", "current", "want", "reason"), [
    (0.35, 3, 2, 7, STARVATION),           # ceil(2 * 0.35/0.1) = ceil(7.0) = 7
    (0.105, 3, 4, 4, WITHIN_TOLERANCE),    # ratio 1.05 -> within 0.1
    (0.12, 3, 4, 5, STARVATION),           # ratio 1.2 -> ceil(4.8) = 5
    (0.0, 0, 4, 0, STARVATION),            # never waits -> ceil(0) = 0 (min clamps it later)
    (0.35, 7, 2, 2, STALENESS_HEADROOM),   # 7 >= k - headroom = 7 -> hold instead of 7
    (0.02, 7, 4, 1, STARVATION),           # near the bound a shrink is still allowed: ceil(4 * 0.2) = 1
    (0.35, 8, 2, 1, STALENESS_AT_BOUND),   # at k = 8: 2 - 1
    (0.9, 9.5, 1, 0, STALENESS_AT_BOUND),  # beyond k: 1 - 1
])
def test_generator_proposal(starvation: float, staleness: float, current: int, want: int, reason: str) -> None:
    p = generator_proposal(LearnerReading(starvation, staleness, bound=8), current=current,
                           target=StarvationTarget(0.1, staleness_headroom=1), cfg=CFG)
    assert (p.replicas, p.reason) == (want, reason)


# ---- HPA building blocks --------------------------------------------------------------------------

def test_stabilize_takes_the_safest_recommendation_in_each_window() -> None:
    hist = (Timed(T0, 6), Timed(T0 + 100, 2), Timed(T0 + 250, 4))
    # at T0+260, down window 300: max(6, 2, 4, desired 1) = 6 -> stays at current 6
    assert stabilize(hist, desired=1, current=6, now_s=T0 + 260, up_window_s=0, down_window_s=300) == 6
    # at T0+301 the 6 left the window: max(2, 4, 1) = 4
    assert stabilize(hist, desired=1, current=6, now_s=T0 + 301, up_window_s=0, down_window_s=300) == 4
    # scale up with an up window of 200 s at T0+260: min(2, 4, desired 9) = 2 < current 3 -> 3
    assert stabilize(hist, desired=9, current=3, now_s=T0 + 260, up_window_s=200, down_window_s=0) == 3
    # ... and once the 2 is out (T0+301): min(4, 9) = 4
    assert stabilize(hist, desired=9, current=3, now_s=T0 + 301, up_window_s=200, down_window_s=0) == 4


def test_rate_limits_follow_the_hpa_formulas() -> None:
    up = ScalingRules(0, (ScalingPolicy("Pods", 4, 15), ScalingPolicy("Percent", 100, 15)))
    assert scale_up_limit(2, (), up, T0) == 6                                  # max(2+4, ceil(2*2)=4)
    assert scale_up_limit(2, (), ScalingRules(0, up.policies, "Min"), T0) == 4  # min(6, 4)
    assert scale_up_limit(2, (), ScalingRules(0, up.policies, "Disabled"), T0) == 2
    # +4 five seconds ago: the period started at 6 - 4 = 2 -> max(2+4, 4) = 6 (no further growth)
    assert scale_up_limit(6, (Timed(T0 - 5, 4),), up, T0) == 6
    # Percent 50 of 5 replicas, rounded down for scale-down: int(5 * 0.5) = 2
    down = ScalingRules(0, (ScalingPolicy("Percent", 50, 60), ScalingPolicy("Pods", 1, 60)))
    assert scale_down_limit(5, (), down, T0) == 2                                # Max change: min(2, 4)
    assert scale_down_limit(5, (), ScalingRules(0, down.policies, "Min"), T0) == 4  # max(2, 4)
    # -1 thirty seconds ago: the period started at 4 + 1 = 5 -> min(int(2.5)=2, 4) = 2
    assert scale_down_limit(4, (Timed(T0 - 30, -1),), down, T0) == 2


def _run(cfg: ScalerConfig, current: int, steps: list[tuple[float, Proposal | None]],
         state: ScalerState | None = None) -> tuple[list[int], ScalerState, list[str]]:
    sizes, reasons, st = [], [], state or ScalerState()
    for t, p in steps:
        d = decide(current=current, proposal=p, cfg=cfg, state=st, now_s=T0 + t)
        current, st = d.replicas, d.state
        sizes.append(current)
        reasons.append(d.limit_reason if d.limited else d.reason)
    return sizes, st, reasons


def test_scale_up_is_paced_by_the_default_policies() -> None:
    cfg = ScalerConfig(min_replicas=1, max_replicas=30)
    want20 = Proposal(20, LAG, "")
    # t=0: 2 -> max(2+4, 2*2) = 6; t=5: the period (15 s) started at 2 -> still 6;
    # t=16: period starts at 6 -> max(10, 12) = 12; t=32: max(16, 24) -> 20 (the desired)
    sizes, st, reasons = _run(cfg, 2, [(0, want20), (5, want20), (16, want20), (32, want20)])
    assert sizes == [6, 6, 12, 20]
    assert reasons[:3] == [RATE_LIMITED] * 3 and reasons[3] == LAG
    assert [e.value for e in st.scale_events] == [8]  # at t=32 only the +8 is inside the 15 s period


def test_scale_down_waits_for_the_stabilisation_window() -> None:
    cfg = ScalerConfig(min_replicas=1, max_replicas=8)  # scaleDown window 300 s, 100 % per 15 s
    sizes, _, _ = _run(cfg, 6, [(0, Proposal(6, LAG, "")), (100, Proposal(2, LAG, "")),
                                (299, Proposal(2, LAG, "")), (301, Proposal(2, LAG, ""))])
    # max over the window keeps 6 until the t=0 recommendation leaves it (t > 300)
    assert sizes == [6, 6, 6, 2]


def test_scale_down_pods_policy_and_min_max_clamps() -> None:
    cfg = ScalerConfig(min_replicas=2, max_replicas=8,
                       scale_down=ScalingRules(0, (ScalingPolicy("Pods", 1, 60),)))
    one = Proposal(1, LAG, "")
    sizes, _, reasons = _run(cfg, 5, [(0, one), (30, one), (61, one), (122, one), (183, one)])
    # 5 -> 4 (1 pod per 60 s); at 30 s the period began at 5 -> 4 again; 61 s: 3; 122 s: 2 = min
    assert sizes == [4, 4, 3, 2, 2]
    assert reasons == [RATE_LIMITED] * 3 + [TOO_FEW, TOO_FEW]
    big = ScalerConfig(min_replicas=1, max_replicas=8, scale_up=ScalingRules(0, (ScalingPolicy("Pods", 100, 15),)))
    d = decide(current=3, proposal=Proposal(20, LAG, ""), cfg=big, state=ScalerState(), now_s=T0)
    assert (d.replicas, d.limited, d.limit_reason) == (8, True, TOO_MANY)
    d = decide(current=12, proposal=Proposal(12, LAG, ""), cfg=big, state=ScalerState(), now_s=T0)
    assert (d.replicas, d.reason) == (8, TOO_MANY)  # out of range: straight to maxReplicas


def test_partition_cap_is_reported_as_scaling_limited() -> None:
    p = verifier_proposal(LagReading(1000, 4, True), current=1, target=LagTarget(50), cfg=CFG)
    d = decide(current=1, proposal=p, cfg=CFG, state=ScalerState(), now_s=T0)
    # ceil(1000/50) = 20 -> 4 partitions; the default up policies allow max(1+4, 2) = 5 >= 4
    assert (d.replicas, d.limited, d.limit_reason) == (4, True, PARTITION_LIMIT)
    assert "4 partitions" in d.limit_message


def test_fallback_after_failure_threshold_and_reset_on_success() -> None:
    cfg = ScalerConfig(min_replicas=1, max_replicas=8, fallback_replicas=3, failure_threshold=3,
                       scale_down=ScalingRules(0, (ScalingPolicy("Percent", 100, 15),)))
    sizes, st, reasons = _run(cfg, 6, [(0, None), (15, None), (30, None), (45, Proposal(5, LAG, "")), (60, None)])
    # two failures keep 6; the third gives fallbackReplicas 3; a good read resets the count (5);
    # the next failure is 1/3 again and keeps 5
    assert sizes == [6, 6, 3, 5, 5]
    assert reasons == [FAILED_GET_METRIC, FAILED_GET_METRIC, FALLBACK, LAG, FAILED_GET_METRIC]
    assert st.consecutive_failures == 1


def test_paused_and_zero_replicas_change_nothing() -> None:
    st = ScalerState(recommendations=(Timed(T0, 4),), consecutive_failures=2)
    d = decide(current=4, proposal=Proposal(8, LAG, ""), cfg=CFG, state=st, now_s=T0 + 1, paused=True)
    assert (d.replicas, d.reason, d.state) == (4, PAUSED, st)
    d = decide(current=0, proposal=Proposal(8, LAG, ""), cfg=CFG, state=st, now_s=T0 + 1)
    assert (d.replicas, d.reason, d.state) == (0, SCALING_DISABLED, st)


def test_state_round_trips_through_status_and_keeps_cooldowns() -> None:
    cfg = ScalerConfig(min_replicas=1, max_replicas=8)
    d1 = decide(current=2, proposal=Proposal(8, LAG, ""), cfg=cfg, state=ScalerState(), now_s=T0 + 0.25)
    assert d1.replicas == 6  # max(2+4, 4)
    status = d1.state.to_status()
    assert status["lastReplicas"] == 6 and status["lastScaleTime"].endswith(".250000Z")
    restored = ScalerState.from_status(status)
    assert restored == d1.state
    # a "restarted operator" 10 s later is still inside the 15 s period: no further scale-up
    d2 = decide(current=6, proposal=Proposal(8, LAG, ""), cfg=cfg, state=restored, now_s=T0 + 10.25)
    assert (d2.replicas, d2.limit_reason) == (6, RATE_LIMITED)
    assert ScalerState.from_status({}) == ScalerState()


@pytest.mark.parametrize(("series", "want"), [([1, 2, 2, 1, 3], 2), ([1, 2, 3, 3, 3], 0), ([3, 2, 2, 2, 1], 0),
                                             ([1, 2, 1, 2, 1], 3), ([], 0)])
def test_direction_changes(series: list[int], want: int) -> None:
    assert direction_changes(series) == want


def test_recorded_noisy_lag_signal_does_not_flap() -> None:
    """tests/data/verifier_lag_signal.csv was recorded from the real broker (tests/data/
    record_lag_signal.py): bursty arrivals, a load peak of ~800 records, noise of 0..~70 records
    around it. Each sample is replayed as one 15 s operator tick (HPA's sync period), target 50
    records/replica, 8 partitions, scaleUp window 60 s, scaleDown window 300 s (HPA default)."""
    rows = [int(r["lag_records"]) for r in csv.DictReader(SIGNAL.open())]
    assert len(rows) > 200
    cfg = ScalerConfig(min_replicas=1, max_replicas=8, scale_up=ScalingRules(60, DEFAULT_SCALE_UP.policies))
    naive = [max(1, min(8, math.ceil(lag / 50))) for lag in rows]  # ceil(lag/target), no behaviour
    current, st, sizes = 1, ScalerState(), [1]
    for i, lag in enumerate(rows):
        p = verifier_proposal(LagReading(lag, 8, True), current=current, target=LagTarget(50), cfg=cfg)
        d = decide(current=current, proposal=p, cfg=cfg, state=st, now_s=T0 + 15 * i)
        current, st = d.replicas, d.state
        sizes.append(current)
    assert direction_changes(naive) > 20  # the raw signal flaps constantly
    assert direction_changes(sizes) == 1  # one rise with the load peak, one fall after it
    assert max(sizes) == 8 and sizes[-1] == 1
    # never more than one size change per tick in the same direction as the last one: monotone runs
    peak = sizes.index(8)
    assert sizes[:peak + 1] == sorted(sizes[:peak + 1]) and sizes[peak:] == sorted(sizes[peak:], reverse=True)


def test_generator_staleness_hold_and_shrink_go_through_the_normaliser() -> None:
    tgt, k8 = StarvationTarget(0.1, staleness_headroom=1), 8
    hold = generator_proposal(LearnerReading(0.35, 7, k8), current=2, target=tgt, cfg=CFG)
    d = decide(current=2, proposal=hold, cfg=CFG, state=ScalerState(), now_s=T0)
    assert (d.replicas, d.limited, d.limit_reason) == (2, True, STALENESS_HEADROOM)
    # at the bound: 3 -> 2 wanted; the 300 s scale-down window holds 3 while the t=0 recommendation
    # (3, made when staleness was fine) is inside it, then 2 at t=301; at t=302 the recommendations
    # of 2 (t=60, t=301) are still in the window -> 2; at t=602 only the t=302 one (1) is -> 1
    cfg = ScalerConfig(min_replicas=1, max_replicas=8)
    fine = generator_proposal(LearnerReading(0.1, 2, k8), current=3, target=tgt, cfg=cfg)
    assert fine.replicas == 3  # ratio 1.0: within tolerance
    st, current, sizes = ScalerState(), 3, []
    for t, reading in [(0, LearnerReading(0.1, 2, k8)), (60, LearnerReading(0.5, 8, k8)),
                       (301, LearnerReading(0.5, 8, k8)), (302, LearnerReading(0.5, 9, k8)),
                       (602, LearnerReading(0.5, 9, k8))]:
        p = generator_proposal(reading, current=current, target=tgt, cfg=cfg)
        d = decide(current=current, proposal=p, cfg=cfg, state=st, now_s=T0 + t)
        current, st = d.replicas, d.state
        sizes.append(current)
    assert sizes == [3, 3, 2, 2, 1]
