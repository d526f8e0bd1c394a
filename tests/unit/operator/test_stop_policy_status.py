"""spec.stopPolicy (issue #31): the RLJob field reaches the learner's JobSpec, and a learner that stopped on
its forecast turns the job Succeeded with reason ForecastPlateau / ForecastBelowTarget, the numbers it acted
on in status.stoppedEarly, the budget's forecast in status.fit, and an Event naming the reason."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from scalerl.messages import MetricRecord
from scalerl.runtime.learner_service import LearnerService
from scalerl_operator.api import conditions as c
from scalerl_operator.api.spec import parse_spec
from scalerl_operator.api.status import RLJobStatus
from scalerl_operator.cluster.rlstatus import LearnerStatus, fold
from scalerl_operator.control.jobstatus import status_patch, write_status

NOW = datetime(2027, 1, 15, 8, 0, 0, tzinfo=UTC)
BASE = {"bus": {"bootstrap": "k:9092"}, "store": {"uri": "s3://bkt/run1"}}
ALL_READY = {"generator": (1, 1), "verifier": (1, 1), "curriculum": (1, 1), "learner": (1, 1)}
STOP = {"step": 120, "reason": "ForecastPlateau", "message": "words", "compute": 1.5, "budget_compute": 4.0,
        "gain": 0.004, "gain_low": 0.0, "gain_high": 0.008, "A_high": 0.71, "level": 0.95, "min_gain": 0.01,
        "target": None}
FIT = {"A": 0.7, "B": 1.4, "C_mid": 0.5, "compute": 1.5, "A_low": 0.66, "A_high": 0.72, "budget_compute": 4.0,
       "budget_identified": 1.0, "budget_pass_rate": 0.69, "budget_low": 0.64, "budget_high": 0.74}


class Events:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        return {}

    def event(self, owner: dict[str, Any], type_: str, reason: str, message: str, action: str) -> None:
        self.events.append((type_, reason, message))


def test_stop_policy_reaches_the_learner_and_not_twice() -> None:
    spec = parse_spec({**BASE, "stopPolicy": {"minGain": 0.01, "target": 0.8}})
    job = spec.job_spec("j")
    assert (job.stop_policy.min_gain, job.stop_policy.target, job.stop_policy.level) == (0.01, 0.8, 0.95)
    assert not parse_spec(BASE).job_spec("j").stop_policy.enabled  # off by default
    with pytest.raises(ValueError, match=r"stop_policy: not allowed here \(set spec.stopPolicy\)"):
        parse_spec({**BASE, "job": {"stop_policy": {"min_gain": 0.01}}})
    with pytest.raises(ValueError, match="minGain"):
        parse_spec({**BASE, "stopPolicy": {"minGain": 0.0}})


def _done_and_stopped(stop: dict[str, Any] | None) -> LearnerStatus:
    """What the learner publishes: its fit record, then `done` with `_stop_fields` (the learner's own code)."""
    fields = LearnerService._stop_fields(SimpleNamespace(stopped_early=stop))  # type: ignore[arg-type]
    return fold(LearnerStatus(), [MetricRecord("fit", 120, FIT),
                                  MetricRecord("done", 120, {"final_pass_rate": 0.69, **fields})])


@pytest.mark.parametrize("reason", ["ForecastPlateau", "ForecastBelowTarget"])
def test_a_forecast_stop_ends_succeeded_with_its_reason_numbers_and_event(reason: str) -> None:
    spec = parse_spec({**BASE, "stopPolicy": {"minGain": 0.01, "target": 0.8}})
    learner = _done_and_stopped({**STOP, "reason": reason})
    obj = {"metadata": {"name": "j", "namespace": "n", "generation": 1}, "status": {"phase": c.PHASE_RUNNING}}
    patch = status_patch(obj, spec, roles=ALL_READY, learner=learner, now=NOW)
    assert patch["phase"] == c.PHASE_SUCCEEDED
    complete = c.get_condition(patch["conditions"], c.COMPLETE)
    assert complete is not None and (complete["status"], complete["reason"]) == ("True", reason)
    assert "step 120" in complete["message"]
    assert ("+0.008" if reason == "ForecastPlateau" else "0.710") in complete["message"]
    assert patch["stoppedEarly"] == {"reason": reason, "step": 120, "compute": 1.5, "budgetCompute": 4.0,
                                     "gainHigh": 0.008, "AHigh": 0.71, "level": 0.95}
    assert patch["fit"]["budgetIdentified"] is True and patch["fit"]["budgetPassRate"] == 0.69
    RLJobStatus.model_validate(patch)  # the CRD's schema takes it
    kube = Events()
    write_status(kube, obj, patch)  # type: ignore[arg-type]
    assert [(t, r) for t, r, _ in kube.events] == [("Normal", reason)]
    assert complete["message"] in kube.events[0][2]


def test_a_run_that_ran_its_steps_completes_as_before() -> None:
    learner = _done_and_stopped(None)
    obj = {"metadata": {"name": "j", "namespace": "n", "generation": 1}, "status": {"phase": c.PHASE_RUNNING}}
    patch = status_patch(obj, parse_spec(BASE), roles=ALL_READY, learner=learner, now=NOW)
    complete = c.get_condition(patch["conditions"], c.COMPLETE)
    assert complete is not None and complete["reason"] == c.REASON_STEPS_COMPLETED
    assert patch["stoppedEarly"] is None
    kube = Events()
    write_status(kube, obj, patch)  # type: ignore[arg-type]
    assert [(t, r) for t, r, _ in kube.events] == [("Normal", "PhaseSucceeded")]
    # an unidentified budget forecast: the flag is false and no point is given
    unidentified = {k: v for k, v in FIT.items() if k != "budget_pass_rate"} | {"budget_identified": 0.0}
    fit = fold(LearnerStatus(), [MetricRecord("fit", 10, unidentified)]).fit
    assert fit is not None and fit["budgetIdentified"] is False and "budgetPassRate" not in fit
