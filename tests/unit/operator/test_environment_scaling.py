"""The verifier pool's second autoscaling input: how busy the replicas' tool-call slots are, from the
`environment` records they publish on the metrics topic (pure: fold and the proposals)."""

from __future__ import annotations

import pytest

from scalerl.messages import MetricRecord
from scalerl.rpc.convert import decode_envelope, encode_envelope
from scalerl_operator.autoscale.autoscaler import (
    ENVIRONMENT_BUSY,
    LAG,
    WITHIN_TOLERANCE,
    BusyReading,
    LagReading,
    LagTarget,
    ScalerConfig,
    busy_reading,
    environment_proposal,
    larger,
    verifier_proposal,
)
from scalerl_operator.cluster.rlstatus import LearnerStatus, fold

CFG = ScalerConfig(min_replicas=1, max_replicas=8, tolerance=0.1)


def env_record(source: str, busy: float, t: float) -> MetricRecord:
    return MetricRecord("environment", 0, {"busy_fraction": busy, "slots": 4.0, "time_s": t}, source=source)


def test_each_replica_keeps_its_latest_report_and_learner_records_are_not_counted():
    records = [env_record("verifier-0", 0.2, 100.0), MetricRecord("train", 3, {"batch_wait_frac": 0.4}),
               env_record("verifier-1", 0.9, 101.0), env_record("verifier-0", 0.5, 105.0),
               MetricRecord("environment", 0, {"busy_fraction": 1.0, "time_s": 1.0})]  # no source: ignored
    s = fold(LearnerStatus(), [decode_envelope(encode_envelope(r)) for r in records])  # as read from the topic
    assert s.environment == {"verifier-0": (0.5, 105.0), "verifier-1": (0.9, 101.0)}
    assert s.records == 1 and s.starvation == 0.4


def test_a_reading_is_the_mean_of_the_fresh_reports():
    reports = {"a": (0.5, 100.0), "b": (0.9, 110.0), "gone": (1.0, 50.0)}
    assert busy_reading(reports, now_s=120.0) == BusyReading(pytest.approx(0.7), 2)
    assert busy_reading(reports, now_s=500.0) is None
    assert busy_reading({}, now_s=0.0) is None


@pytest.mark.parametrize(("busy", "current", "want", "reason"), [
    (0.9, 2, 3, ENVIRONMENT_BUSY),  # ceil(2 x 0.9 / 0.6)
    (1.0, 4, 7, ENVIRONMENT_BUSY),  # ceil(4 x 1 / 0.6) = ceil(6.67)
    (0.63, 3, 3, WITHIN_TOLERANCE),  # |0.63/0.6 - 1| = 0.05 <= 0.1
    (0.1, 4, 1, ENVIRONMENT_BUSY),  # ceil(4 x 0.1 / 0.6) = ceil(0.67)
])
def test_the_proposal_follows_the_hpa_utilisation_rule(busy, current, want, reason):
    p = environment_proposal(BusyReading(busy, current), current=current, target_busy=0.6, cfg=CFG)
    assert (p.replicas, p.reason) == (want, reason)
    assert f"{busy:.0%}" in p.message


def test_the_pool_takes_the_larger_of_lag_and_busy_slots():
    idle_bus = verifier_proposal(LagReading(total_lag=0, partitions=4, committed=True), current=2,
                                 target=LagTarget(50), cfg=CFG)
    busy = environment_proposal(BusyReading(0.95, 2), current=2, target_busy=0.6, cfg=CFG)
    assert idle_bus.replicas == 1 and busy.replicas == 4
    assert larger(idle_bus, busy) is busy
    backlog = verifier_proposal(LagReading(total_lag=400, partitions=8, committed=True), current=2,
                                target=LagTarget(50), cfg=CFG)
    assert backlog.reason == LAG and larger(backlog, busy) is backlog  # 8 replicas for the lag
    assert larger(idle_bus, None) is idle_bus
