"""The learner's torchrun group as one gang, against the REAL kube-apiserver (operator in-process): one rank
restarting restarts every rank and counts once, and so does a rank's pod deleted by hand; the failure policy
counts group restarts; a template change recreates the group; the progress watchdog restarts a group whose step
does not advance; the group has a PodDisruptionBudget. No StatefulSet controller or kubelet runs: the pods it
would create, and their container restarts, are written by hand (as the controller would recreate them after a
group restart)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from operator_helpers import (
    QUIET_KAFKA,
    children,
    condition,
    create,
    event_reasons,
    get_job,
    operator,
    patch_spec,
    replicas,
    rljob,
    simulate_ready,
    unique_job,
    wait_for,
)

from scalerl_operator.api import conditions as c
from scalerl_operator.cluster.kube import Kube, path
from scalerl_operator.render.children import SPEC_HASH_ANNOTATION

pytestmark = [*QUIET_KAFKA, pytest.mark.infra]


def ranks(kube: Kube, namespace: str, name: str, nodes: int, restarts: dict[int, int] | None = None) -> list[str]:
    """The learner pods the StatefulSet would run (its template's spec-hash), with these container restarts."""
    sts = kube.get("apps/v1", "StatefulSet", namespace, f"{name}-learner")
    assert sts is not None
    spec_hash = sts["spec"]["template"]["metadata"]["annotations"][SPEC_HASH_ANNOTATION]
    uids = []
    for i in range(nodes):
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": f"{name}-learner-{i}", "annotations": {SPEC_HASH_ANNOTATION: spec_hash},
            "labels": {"app.kubernetes.io/instance": name, "app.kubernetes.io/component": "learner",
                       "app.kubernetes.io/managed-by": "scalerl-operator", "scalerl.dev/job": name}},
            "spec": {"containers": [{"name": "learner", "image": "scalerl:0.1.0"}]}}
        uids.append(kube.request("POST", path("v1", "Pod", namespace), body=pod)["metadata"]["uid"])
        n = (restarts or {}).get(i, 0)
        if n:
            kube.request("PATCH", path("v1", "Pod", namespace, f"{name}-learner-{i}", "status"),
                         content_type="application/merge-patch+json",
                         body={"status": {"containerStatuses": [{"name": "learner", "ready": False, "restartCount": n,
                                                                 "image": "scalerl:0.1.0", "imageID": ""}]}})
    return uids


def learner_pods(kube: Kube, namespace: str, name: str) -> list[str]:
    return [p["metadata"]["uid"] for p in kube.list_objects(
        "v1", "Pod", namespace, f"app.kubernetes.io/instance={name},app.kubernetes.io/component=learner")]


def status(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    return (get_job(kube, namespace, name) or {}).get("status") or {}


def test_one_rank_restarting_restarts_the_group_once_and_counts_one(
        kube: Kube, namespace: str, bootstrap: str, k8s_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    name = unique_job()
    with operator(namespace, k8s_env["KUBECONFIG"], monkeypatch):
        create(kube, namespace, rljob(name, bootstrap, failurePolicy={"maxRestarts": 1},
                                      roles={"learner": {"nodes": 3}}))
        wait_for("children", lambda: len(children(kube, namespace, name)) == 8, timeout_s=60)
        # (the PDB is applied after the 8 children the contract names: waited for, not sampled once)
        pdb = wait_for("the learner's PodDisruptionBudget",
                       lambda: kube.get("policy/v1", "PodDisruptionBudget", namespace, f"{name}-learner"), timeout_s=60)
        assert pdb["spec"]["minAvailable"] == 3
        assert pdb["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/instance": name,
                                                          "app.kubernetes.io/component": "learner"}
        # rank 1's container restarted (its node rebooted): every rank goes, one restart is counted
        ranks(kube, namespace, name, 3, restarts={1: 1})
        wait_for("all 3 ranks deleted", lambda: learner_pods(kube, namespace, name) == [], timeout_s=30)
        wait_for("one group restart", lambda: status(kube, namespace, name).get("restarts") == 1, timeout_s=30)
        # (the Event is posted after the status: waited for, not sampled once)
        wait_for("the GroupRestart event", lambda: "GroupRestart" in event_reasons(kube, namespace, name), timeout_s=30)
        # the controller recreates the group; two ranks fail together (one node lost, 2 ranks on it): 1 more
        ranks(kube, namespace, name, 3, restarts={0: 1, 2: 1})
        j = wait_for("phase Failed", lambda: (j := get_job(kube, namespace, name)) and
                     j["status"].get("phase") == c.PHASE_FAILED and j, timeout_s=30)
        assert condition(j, c.FAILED) == ("True", c.REASON_MAX_RESTARTS_EXCEEDED) and j["status"]["restarts"] == 2
        wait_for("every role at 0", lambda: set(replicas(kube, namespace, name).values()) == {0}, timeout_s=30)


def test_a_rank_deleted_by_hand_restarts_the_group_once(
        kube: Kube, namespace: str, bootstrap: str, k8s_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    name = unique_job()
    with operator(namespace, k8s_env["KUBECONFIG"], monkeypatch):
        create(kube, namespace, rljob(name, bootstrap, roles={"learner": {"nodes": 2}}))
        wait_for("children", lambda: len(children(kube, namespace, name)) == 8, timeout_s=60)
        uids = ranks(kube, namespace, name, 2)
        wait_for("the running group recorded", lambda: sorted(g["uid"] for g in status(kube, namespace, name).get(
            "learnerGroup") or []) == sorted(uids), timeout_s=30)
        # `kubectl delete pod` of rank 1 (no kubelet here: an unscheduled pod goes at once); rank 0 would be stuck
        kube.request("DELETE", path("v1", "Pod", namespace, f"{name}-learner-1"))
        wait_for("rank 0 deleted too", lambda: learner_pods(kube, namespace, name) == [], timeout_s=30)
        wait_for("one group restart", lambda: status(kube, namespace, name).get("restarts") == 1, timeout_s=30)
        # (the Event is posted after the status: waited for, not sampled once)
        wait_for("the GroupRestart event", lambda: "GroupRestart" in event_reasons(kube, namespace, name), timeout_s=30)
        # the StatefulSet controller would make both ranks again: new pods, not another restart
        ranks(kube, namespace, name, 2)
        time.sleep(1.5)  # 3 passes
        assert status(kube, namespace, name).get("restarts") == 1 and len(learner_pods(kube, namespace, name)) == 2


def test_a_template_change_recreates_the_whole_group(
        kube: Kube, namespace: str, bootstrap: str, k8s_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    name = unique_job()
    with operator(namespace, k8s_env["KUBECONFIG"], monkeypatch):
        create(kube, namespace, rljob(name, bootstrap, roles={"learner": {"nodes": 2}}))
        wait_for("children", lambda: len(children(kube, namespace, name)) == 8, timeout_s=60)
        sts = kube.get("apps/v1", "StatefulSet", namespace, f"{name}-learner")
        assert sts is not None and sts["spec"]["updateStrategy"] == {"type": "OnDelete"}
        before = ranks(kube, namespace, name, 2)
        time.sleep(1.5)  # 3 passes: pods on the current template stay
        assert sorted(learner_pods(kube, namespace, name)) == sorted(before)
        patch_spec(kube, namespace, name, {"job": {"train": {"steps": 30, "prompts_per_step": 4},
                                                   "off_policy": {"k": 4}}})
        wait_for("both ranks deleted together", lambda: learner_pods(kube, namespace, name) == [], timeout_s=30)
        # (the operator posts the Event after deleting the ranks: waited for, not sampled once)
        wait_for("the GroupRecreated event", lambda: "GroupRecreated" in event_reasons(kube, namespace, name),
                 timeout_s=30)
        assert status(kube, namespace, name).get("restarts", 0) == 0  # an update is not a restart


def test_the_progress_watchdog_restarts_a_stalled_group(
        kube: Kube, namespace: str, bootstrap: str, k8s_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    name = unique_job()
    with operator(namespace, k8s_env["KUBECONFIG"], monkeypatch):
        create(kube, namespace, rljob(name, bootstrap, failurePolicy={"progressDeadlineSeconds": 2}))
        wait_for("children", lambda: len(children(kube, namespace, name)) == 8, timeout_s=60)
        ranks(kube, namespace, name, 1)
        simulate_ready(kube, namespace, name)  # the group runs; no step ever comes
        wait_for("the stalled group deleted", lambda: learner_pods(kube, namespace, name) == [], timeout_s=30)
        j = wait_for("LearnerStalled", lambda: (j := get_job(kube, namespace, name)) and
                     condition(j, c.LEARNER_STALLED) == ("True", c.REASON_STEP_NOT_ADVANCING) and j, timeout_s=30)
        assert j["status"]["restarts"] == 1
        assert "LearnerStalled" in event_reasons(kube, namespace, name)
