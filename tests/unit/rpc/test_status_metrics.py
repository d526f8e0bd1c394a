"""The side port's metrics follow the role's status(): counters by delta, gauges by value."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from scalerl.runtime.telemetry_glue import StatusMetrics


def _values(metrics: StatusMetrics) -> dict[str, float]:
    return {s.name: s.value for fam in text_string_to_metric_families(metrics.render().decode())
            for s in fam.samples if not s.labels}


def test_learner_status_becomes_metrics():
    status = {"ready": True, "tokens_trained": 100, "groups_consumed": 8, "policy_version": 2,
              "staleness_versions": 0.5, "eval_pass_rate": 0.41, "compute_device_hours": 0.002,
              "fit_A": 0.8, "fit_A_low": 0.7, "fit_A_high": 0.9, "fit_B": 1.5, "fit_C_mid": 0.01, "fit_R0": 0.4,
              "staleness_bound": 8.0}
    m = StatusMetrics("learner", lambda: status)
    v = _values(m)
    assert v["scalerl_learner_tokens_total"] == 100 and v["scalerl_learner_groups_in_total"] == 8
    status.update(tokens_trained=250)  # a counter grows by the difference, never resets
    v = _values(m)
    assert v["scalerl_learner_tokens_total"] == 250
    assert v["scalerl_learner_policy_version"] == 2 and v["scalerl_learner_ready"] == 1
    assert v["scalerl_learner_eval_pass_rate"] == 0.41 and v["scalerl_learner_fit_a_high"] == 0.9
    assert v["scalerl_learner_fit_c_mid_device_hours"] == 0.01
    assert v["scalerl_learner_staleness_bound_versions"] == 8
