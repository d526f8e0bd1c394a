"""Unit tests of the pure status logic: the RLJob status from children and learner records
(reconcile.status_patch, rlstatus.fold/to_status), the autoscaler's status block
(scaler.scaling_status) and the Lease rule (leader.next_action)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from scalerl.messages import MetricRecord
from scalerl_operator.api import conditions as c
from scalerl_operator.api.spec import parse_spec
from scalerl_operator.autoscale.autoscaler import LAG, PARTITION_LIMIT, Decision, ScalerState, Timed
from scalerl_operator.autoscale.scaler import scaling_status
from scalerl_operator.cluster.rlstatus import LearnerStatus, fold, to_status
from scalerl_operator.control.jobstatus import is_terminal, status_patch
from scalerl_operator.control.leader import LeaseRecord, next_action

NOW = datetime(2027, 1, 15, 8, 0, 0, tzinfo=UTC)
SPEC = parse_spec({"job": {"off_policy": {"k": 4}}, "bus": {"bootstrap": "k:9092"},
                   "store": {"uri": "s3://bkt/run", "endpoint": "http://m:9000", "credentialsSecret": {"name": "s"}},
                   "activeDeadlineSeconds": 3600})
ALL_READY = {"generator": (1, 1), "verifier": (1, 1), "curriculum": (1, 1), "learner": (1, 1)}


def obj(status: dict[str, Any] | None = None, generation: int = 3) -> dict[str, Any]:
    return {"metadata": {"name": "j", "namespace": "n", "generation": generation}, "status": status or {}}


def cond(status: dict[str, Any], type_: str) -> tuple[str, str]:
    got = c.get_condition(status["conditions"], type_)
    assert got is not None, f"no {type_} condition"
    return got["status"], got["reason"]


def test_pending_until_the_learner_is_ready_then_running_and_ready() -> None:
    pending = status_patch(obj(), SPEC, roles={**ALL_READY, "learner": (0, 1)}, learner=LearnerStatus(), now=NOW)
    assert pending["phase"] == c.PHASE_PENDING and pending["observedGeneration"] == 3
    assert cond(pending, c.READY) == ("False", c.REASON_ROLES_NOT_READY)
    assert cond(pending, c.PROGRESSING) == ("True", c.REASON_RECONCILING)
    assert pending["roles"]["learner"] == {"ready": 0, "desired": 1, "summary": "0/1"}
    running = status_patch(obj(pending), SPEC, roles=ALL_READY, learner=LearnerStatus(), now=NOW)
    assert running["phase"] == c.PHASE_RUNNING
    assert cond(running, c.READY) == ("True", c.REASON_ALL_ROLES_READY)
    assert cond(running, c.DEGRADED)[0] == "False" and cond(running, c.FAILED)[0] == "False"
    # a verifier pod lost while running: still Running, Degraded, not Ready
    degraded = status_patch(obj(running), SPEC, roles={**ALL_READY, "verifier": (0, 1)}, learner=LearnerStatus(),
                            now=NOW)
    assert degraded["phase"] == c.PHASE_RUNNING
    assert cond(degraded, c.DEGRADED) == ("True", c.REASON_REPLICAS_UNAVAILABLE)
    assert cond(degraded, c.READY)[0] == "False"


def test_suspended_deadline_and_completion() -> None:
    susp = SPEC.model_copy(update={"suspend": True})
    s = status_patch(obj(), susp, roles=dict.fromkeys(ALL_READY, (0, 0)), learner=LearnerStatus(), now=NOW)
    assert s["phase"] == c.PHASE_SUSPENDED and cond(s, c.SUSPENDED) == ("True", c.REASON_SUSPENDED)
    assert s["startTime"] is None  # the deadline restarts at resume
    resumed = status_patch(obj(s), SPEC, roles=ALL_READY, learner=LearnerStatus(), now=NOW)
    assert cond(resumed, c.SUSPENDED) == ("False", c.REASON_RESUMED) and resumed["startTime"] == "2027-01-15T08:00:00Z"
    late = status_patch(obj(resumed), SPEC, roles=ALL_READY, learner=LearnerStatus(), now=NOW + timedelta(seconds=3601))
    assert late["phase"] == c.PHASE_FAILED and cond(late, c.FAILED) == ("True", c.REASON_DEADLINE_EXCEEDED)
    assert is_terminal(late)
    # terminal: a later pass keeps Failed even if everything looks fine
    assert status_patch(obj(late), SPEC, roles=ALL_READY, learner=LearnerStatus(), now=NOW)["phase"] == c.PHASE_FAILED
    done = fold(LearnerStatus(), [MetricRecord("done", 40, {"final_pass_rate": 0.75})])
    ok = status_patch(obj(resumed), SPEC, roles=ALL_READY, learner=done, now=NOW)
    assert ok["phase"] == c.PHASE_SUCCEEDED and cond(ok, c.COMPLETE) == ("True", c.REASON_STEPS_COMPLETED)
    assert ok["passRate"] == 0.75 and is_terminal(ok)


def test_invalid_spec_failure_is_not_terminal() -> None:
    failed = {"phase": c.PHASE_FAILED, "conditions": c.set_condition(None, c.FAILED, "True", c.REASON_INVALID_SPEC,
                                                                        "x", 1, NOW)}
    assert not is_terminal(failed)


def test_learner_records_fold_into_rl_status() -> None:
    recs = [MetricRecord("train", 10, {"staleness_max": 2.0, "batch_wait_frac": 0.05}),
            MetricRecord("eval", 10, {"pass_rate": 0.4}),
            MetricRecord("checkpoint", 10, {}),
            MetricRecord("train", 11, {"staleness_max": 4.0, "batch_wait_frac": 0.3}),
            MetricRecord("fit", 11, {"A": 0.8, "B": 1.5, "C_mid": 12.0, "compute": 3.5, "A_low": 0.75,
                                     "A_high": 0.85, "n_points": 9.0}),
            MetricRecord("unknown-kind", 99, {"x": 1.0})]
    s = fold(LearnerStatus(), recs)
    assert (s.step, s.starvation, s.staleness, s.pass_rate, s.checkpoint_step, s.records) == (11, 0.3, 4.0, 0.4, 10, 5)
    st = to_status(s, store_uri="s3://bkt/run/", bound_k=4)
    assert st["policyVersion"] == 11 and st["learnerStep"] == 11
    assert st["lastCheckpoint"] == {"uri": "s3://bkt/run/checkpoints/step_000010", "step": 10}
    assert st["staleness"] == {"current": 4, "bound": 4, "summary": "4/4"}
    assert st["fit"] == {"A": 0.8, "B": 1.5, "Cmid": 12.0, "computeAtFit": 3.5, "ALow": 0.75, "AHigh": 0.85}
    # the RL conditions: starvation 0.3 > 0.1 x 1.1; staleness 4 >= k = 4
    p = status_patch(obj(), SPEC, roles=ALL_READY, learner=s, now=NOW)
    assert cond(p, c.LEARNER_STARVED) == ("True", c.REASON_STARVED)
    assert cond(p, c.POLICY_LAG_EXCEEDED) == ("True", c.REASON_STALENESS_AT_BOUND)
    fed = fold(s, [MetricRecord("train", 12, {"staleness_max": 1.0, "batch_wait_frac": 0.105})])
    p2 = status_patch(obj(p), SPEC, roles=ALL_READY, learner=fed, now=NOW)
    assert cond(p2, c.LEARNER_STARVED) == ("False", c.REASON_FED)  # 0.105 <= 0.11
    assert cond(p2, c.POLICY_LAG_EXCEEDED) == ("False", c.REASON_STALENESS_WITHIN_BOUND)


def test_scaling_status_carries_state_and_the_limited_condition() -> None:
    st = ScalerState(recommendations=(Timed(NOW.timestamp(), 6),), last_scale_time_s=NOW.timestamp(),
                     last_replicas=4)
    capped = Decision(4, 2, 4, 4, LAG, "lag 300 records / 50 per replica = 6, capped at 4 partitions", True,
                      PARTITION_LIMIT, "capped at 4 partitions", st)
    out = scaling_status(obj(), {"verifier": capped}, NOW)
    v = out["scaling"]["verifier"]
    assert v["lastReplicas"] == 4 and v["desiredReplicas"] == 4 and v["recommendations"][0]["replicas"] == 6
    assert ScalerState.from_status(v) == st  # what the next pass (or a restarted operator) reads back
    assert cond(out, c.SCALING_LIMITED) == ("True", PARTITION_LIMIT)
    free = Decision(3, 3, 3, 3, LAG, "ok", state=ScalerState())
    assert cond(scaling_status(obj(out), {"verifier": free}, NOW), c.SCALING_LIMITED) == ("False",
                                                                                         c.REASON_WITHIN_BOUNDS)


@pytest.mark.parametrize(("rec", "want"), [
    (None, "create"),
    (LeaseRecord("me", 1000.0, 15), "renew"),
    (LeaseRecord("other", 1000.0, 15), "wait"),       # renewed 10 s ago, 15 s lease
    (LeaseRecord("other", 994.0, 15), "takeover"),    # 16 s ago: expired
    (LeaseRecord(None, 1009.0, 1), "takeover"),       # released
])
def test_lease_next_action(rec: LeaseRecord | None, want: str) -> None:
    assert next_action(rec, "me", now_s=1010.0) == want


def test_what_the_operator_writes_fits_the_status_schema() -> None:
    """status_patch + scaling_status + lag, merged as the API server merges them, validate against
    the RLJobStatus model the CRD's status schema is generated from (no field the server would prune)."""
    from scalerl_operator.api.status import RLJobStatus

    learner = fold(LearnerStatus(), [MetricRecord("train", 7, {"staleness_max": 2.0, "batch_wait_frac": 0.2}),
                                     MetricRecord("eval", 7, {"pass_rate": 0.5}), MetricRecord("checkpoint", 6, {}),
                                     MetricRecord("fit", 7, {"A": 0.8, "B": 1.2, "C_mid": 3.0, "compute": 1.0})])
    status = status_patch(obj(), SPEC, roles=ALL_READY, learner=learner, now=NOW)
    st = ScalerState(recommendations=(Timed(NOW.timestamp(), 2),), scale_events=(Timed(NOW.timestamp(), 1),),
                     last_scale_time_s=NOW.timestamp(), last_replicas=2)
    status.update(scaling_status(obj(status), {"verifier": Decision(2, 1, 2, 2, LAG, "m", state=st)}, NOW))
    status.update({"lag": {"j.rollouts": 5, "j.scored": 1}, "lagTotal": 6})
    model = RLJobStatus.model_validate(status)
    again = model.model_dump(by_alias=True, mode="json", exclude_none=True)
    for key in ("phase", "policyVersion", "learnerStep", "lastCheckpoint", "staleness", "passRate", "fit", "roles",
                "lag", "lagTotal", "observedGeneration"):
        assert again[key] == status[key], key
    assert again["scaling"]["verifier"]["scaleEvents"] == status["scaling"]["verifier"]["scaleEvents"]


def test_learner_restarts_keep_the_highest_count_and_fail_past_the_policy() -> None:
    spec = SPEC.model_copy(update={"failure_policy": SPEC.failure_policy.model_copy(update={"max_restarts": 2})})
    s = status_patch(obj(), spec, roles=ALL_READY, learner=LearnerStatus(), now=NOW, restarts=2)
    assert (s["phase"], s["restarts"]) == (c.PHASE_RUNNING, 2)  # 2 restarts allowed
    s2 = status_patch(obj(s), spec, roles=ALL_READY, learner=LearnerStatus(), now=NOW, restarts=0)
    assert s2["restarts"] == 2  # the pod was replaced (its count restarted at 0): keep 2
    s3 = status_patch(obj(s2), spec, roles=ALL_READY, learner=LearnerStatus(), now=NOW, restarts=3)
    assert s3["phase"] == c.PHASE_FAILED and cond(s3, c.FAILED) == ("True", c.REASON_MAX_RESTARTS_EXCEEDED)
