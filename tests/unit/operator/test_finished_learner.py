"""Finishing is not crashing (issue #26): once the learner reported the run done, or the job is terminal,
the operator counts no group restart and deletes no pod, even when a learner container restarted (a
learner that exited after its last step and was restarted by its StatefulSet); the job turns Succeeded
with status.restarts unchanged, and status.report says where the run's files are."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from scalerl.messages import MetricRecord
from scalerl_operator.api import conditions as c
from scalerl_operator.api.spec import parse_spec
from scalerl_operator.api.status import RLJobStatus
from scalerl_operator.cluster.rlstatus import LearnerStatus, fold, to_status
from scalerl_operator.control.jobstatus import status_patch
from scalerl_operator.control.reconcile import gang_pass

NOW = datetime(2027, 1, 15, 8, 0, 0, tzinfo=UTC)
SPEC = parse_spec({"bus": {"bootstrap": "k:9092"}, "store": {"uri": "s3://bkt/run1"},
                   "failurePolicy": {"maxRestarts": 1}})
ALL_READY = {"generator": (1, 1), "verifier": (1, 1), "curriculum": (1, 1), "learner": (1, 1)}


class FakeKube:
    """What gang_pass calls: the learner pods listed, pod deletions and Events recorded."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods, self.deleted, self.events = pods, [], []  # type: ignore[var-annotated]

    def list_objects(self, api_version: str, kind: str, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return self.pods

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        return {}

    def request(self, method: str, url_path: str, **_: Any) -> dict[str, Any]:
        self.deleted.append((method, url_path))
        return {}

    def event(self, owner: dict[str, Any], type_: str, reason: str, message: str, action: str) -> None:
        self.events.append((type_, reason, message))


def restarted_pod() -> dict[str, Any]:
    return {"metadata": {"name": "j-learner-0", "uid": "u1"}, "status": {"phase": "Running", "containerStatuses": [
        {"name": "learner", "restartCount": 1, "lastState": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}}


def rljob(phase: str = c.PHASE_RUNNING, restarts: int = 0) -> dict[str, Any]:
    return {"metadata": {"name": "j", "namespace": "n", "generation": 1},
            "status": {"phase": phase, "restarts": restarts}}


def run_gang(kube: FakeKube, obj: dict[str, Any], learner: LearnerStatus) -> int:
    g = gang_pass(kube, obj, SPEC, learner=learner, group_up=True, sts=None, spec_hash="h",  # type: ignore[arg-type]
                  now=NOW)
    assert g.stall is None
    return g.restarts


def test_a_restarted_rank_of_a_running_job_restarts_the_group() -> None:
    # the control: without `done`, a container restart is a failure of the group
    kube = FakeKube([restarted_pod()])
    assert run_gang(kube, rljob(), LearnerStatus(step=3, records=1)) == 1
    assert [e[1] for e in kube.events] == ["GroupRestart"] and len(kube.deleted) == 1


@pytest.mark.parametrize("passes", [1, 2])
def test_a_learner_that_reported_done_is_not_restarted_nor_counted(passes: int) -> None:
    done = fold(LearnerStatus(), [MetricRecord("train", 5, {}),
                                  MetricRecord("done", 5, {"final_pass_rate": 0.5, "run_files": 4.0,
                                                           "report_html": 1.0})])
    kube, obj = FakeKube([restarted_pod()]), rljob()
    for _ in range(passes):  # the periodic pass and an event-triggered one, in the same second
        restarts = run_gang(kube, obj, done)
        patch = status_patch(obj, SPEC, roles=ALL_READY, learner=done, now=NOW, restarts=restarts)
        assert patch["restarts"] == 0, "finishing counted as a restart"
        assert patch["phase"] == c.PHASE_SUCCEEDED
    assert kube.events == [] and kube.deleted == []


def test_a_terminal_job_counts_no_restart() -> None:
    kube = FakeKube([restarted_pod()])
    assert run_gang(kube, rljob(c.PHASE_SUCCEEDED, restarts=0), LearnerStatus(step=5, records=1)) == 0
    assert kube.events == [] and kube.deleted == []


def test_status_report_points_at_the_uploaded_run_files() -> None:
    done = fold(LearnerStatus(), [MetricRecord("done", 5, {"final_pass_rate": 0.5, "run_files": 4.0,
                                                           "report_html": 1.0})])
    report = to_status(done, store_uri="s3://bkt/run1/", bound_k=4)["report"]
    assert report == {"uri": "s3://bkt/run1/run", "summary": "s3://bkt/run1/run/summary.json",
                      "html": "s3://bkt/run1/run/report.html",
                      "fetch": "scalerl fetch-run s3://bkt/run1/run --out <folder>"}
    RLJobStatus.model_validate({"report": report})  # the CRD's schema takes it
    no_html = fold(LearnerStatus(), [MetricRecord("done", 5, {"run_files": 3.0, "report_html": 0.0})])
    assert to_status(no_html, store_uri="s3://bkt/run1", bound_k=4)["report"]["html"] is None
    # a learner from before the upload says nothing of run files: no report, rather than a wrong URI
    old = fold(LearnerStatus(), [MetricRecord("done", 5, {"final_pass_rate": 0.5})])
    assert to_status(old, store_uri="s3://bkt/run1", bound_k=4)["report"] is None
    assert to_status(LearnerStatus(step=2, records=1), store_uri="s3://bkt/run1", bound_k=4)["report"] is None
