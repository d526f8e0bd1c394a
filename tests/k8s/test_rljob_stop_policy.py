"""spec.stopPolicy on the real API server (issue #31): the operator (in-process) renders the policy into the
learner's JobSpec, reads the learner's records from a REAL Kafka metrics topic, and ends the job Succeeded
with reason ForecastPlateau, the numbers acted on in status.stoppedEarly and an Event. The records are the
ones the learner's own code makes (`LearnerService._stop_fields`); no learner pod runs here."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from operator_helpers import (
    QUIET_KAFKA,
    condition,
    create,
    event_reasons,
    get_job,
    kafka_bootstrap,
    operator,
    rljob,
    unique_job,
    wait_for,
)

from scalerl.bus.kafka import KafkaBus
from scalerl.messages import MetricRecord
from scalerl.runtime.learner_service import LearnerService
from scalerl_operator.api import conditions as c
from scalerl_operator.cluster.kube import Kube

pytestmark = [*QUIET_KAFKA, pytest.mark.infra]
STOP = {"step": 40, "reason": "ForecastPlateau", "message": "m", "compute": 0.02, "budget_compute": 0.05,
        "gain": 0.002, "gain_low": 0.0, "gain_high": 0.006, "A_high": 0.64, "level": 0.95, "min_gain": 0.01,
        "target": None}
FIT = {"A": 0.62, "B": 1.8, "C_mid": 0.004, "compute": 0.02, "A_low": 0.6, "A_high": 0.64,
       "budget_compute": 0.05, "budget_identified": 1.0, "budget_pass_rate": 0.618, "budget_low": 0.58,
       "budget_high": 0.66}


def test_a_forecast_stop_ends_the_rljob_succeeded_forecast_plateau(kube: Kube, namespace: str,
                                                                   k8s_env: dict[str, str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    name = unique_job()
    bus = KafkaBus(kafka_bootstrap(k8s_env))
    try:
        with operator(namespace, k8s_env["KUBECONFIG"], monkeypatch):
            create(kube, namespace, rljob(name, bus.bootstrap[0], stopPolicy={"minGain": 0.01}))
            cm = wait_for("the spec ConfigMap", lambda: kube.get("v1", "ConfigMap", namespace, f"{name}-spec"))
            job = yaml.safe_load(cm["data"]["job.yaml"])
            assert job["stop_policy"] == {"min_gain": 0.01, "target": None, "level": 0.95}

            topic = f"{namespace}.{name}.metrics"
            stop = LearnerService._stop_fields(SimpleNamespace(stopped_early=STOP))  # type: ignore[arg-type]
            bus.publish(topic, MetricRecord("fit", 40, FIT), key="learner")
            bus.publish(topic, MetricRecord("done", 40, {"final_pass_rate": 0.61, **stop}), key="learner")
            bus.flush()
            j: dict[str, Any] = wait_for("Succeeded", lambda: (j := get_job(kube, namespace, name)) and
                                         (j.get("status") or {}).get("phase") == c.PHASE_SUCCEEDED and j)
            assert condition(j, c.COMPLETE) == ("True", c.REASON_FORECAST_PLATEAU)
            assert j["status"]["stoppedEarly"] == {"reason": "ForecastPlateau", "step": 40, "compute": 0.02,
                                                   "budgetCompute": 0.05, "gainHigh": 0.006, "AHigh": 0.64,
                                                   "level": 0.95}
            fit = j["status"]["fit"]
            assert (fit["A"], fit["budgetIdentified"], fit["budgetPassRate"]) == (0.62, True, 0.618)
            wait_for("the ForecastPlateau Event", lambda: "ForecastPlateau" in event_reasons(kube, namespace, name))
    finally:
        bus.close()
