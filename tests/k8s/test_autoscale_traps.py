"""The autoscaler traps end to end: the operator (in-process, KopfRunner) against the REAL kube-apiserver and
the REAL Kafka. Generators scale up from zero on a prompt backlog; verifiers at minReplicas 0 come back
while records wait; Pending pods the scheduler cannot place stop a scale-up and the status names the
missing resource; pools the operator does not autoscale keep what an external scaler wrote. No
scheduler runs: the Pending pod and its PodScheduled condition are written by hand."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest
from operator_helpers import (
    QUIET_KAFKA,
    condition,
    create,
    get_job,
    kafka_bootstrap,
    operator,
    patch_spec,
    replicas,
    rljob,
    unique_job,
    wait_for,
)

from scalerl.bus.kafka import KafkaBus
from scalerl.messages import MetricRecord
from scalerl_operator.api import conditions as c
from scalerl_operator.cluster.kube import Kube, path
from scalerl_operator.control.reconcile import apply_workload

pytestmark = [*QUIET_KAFKA, pytest.mark.infra]
GPU_MSG = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available."


@pytest.fixture
def bus(k8s_env: dict[str, str]) -> Any:
    b = KafkaBus(kafka_bootstrap(k8s_env))
    yield b
    b.close()


def fast() -> dict[str, Any]:
    return {"scaleUp": {"stabilizationWindowSeconds": 0,
                        "policies": [{"type": "Pods", "value": 4, "periodSeconds": 1}]},
            "scaleDown": {"stabilizationWindowSeconds": 0,
                          "policies": [{"type": "Percent", "value": 100, "periodSeconds": 1}]}}


def publish(bus: KafkaBus, topic: str, n: int, tag: str) -> None:
    for i in range(n):  # any decodable record counts as lag
        bus.publish(topic, MetricRecord("x", i, {}), key=f"{tag}{i}")
    bus.flush()


def pending_pod(kube: Kube, namespace: str, job: str, role: str, name: str, message: str) -> None:
    """A pod of the role's Deployment the scheduler could not place (what kube-scheduler would write)."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {
        "app.kubernetes.io/instance": job, "app.kubernetes.io/component": role,
        "app.kubernetes.io/managed-by": "scalerl-operator", "scalerl.dev/job": job}},
        "spec": {"containers": [{"name": role, "image": "scalerl:0.1.0"}]}}
    kube.request("POST", path("v1", "Pod", namespace), body=pod)
    kube.request("PATCH", path("v1", "Pod", namespace, name, "status"), content_type="application/merge-patch+json",
                 body={"status": {"phase": "Pending", "conditions": [{
                     "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
                     "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})


def test_generators_scale_from_zero_on_a_prompt_backlog(kube: Kube, namespace: str, bus: KafkaBus,
                                                        k8s_env: dict[str, str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    name = unique_job()
    generator = {"replicas": 0, "autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 4,
                                                "behavior": fast()}}
    with operator(namespace, k8s_env["KUBECONFIG"], monkeypatch):
        create(kube, namespace, rljob(name, bus.bootstrap[0], roles={"generator": generator}))
        wait_for("generators at 0", lambda: replicas(kube, namespace, name).get("generator") == 0, timeout_s=60)
        time.sleep(1.5)  # 3 passes: nothing waits, the pool stays at zero
        assert replicas(kube, namespace, name)["generator"] == 0
        publish(bus, f"{namespace}.{name}.prompts", 7, "p")
        wait_for("a generator from zero", lambda: replicas(kube, namespace, name)["generator"] == 1, timeout_s=30)
        # the pass writes /scale first, then its status: wait for the latter
        wait_for("reason ScaleFromZero", lambda: ((get_job(kube, namespace, name) or {}).get("status") or {}).get(
            "scaling", {}).get("generator", {}).get("reason") == "ScaleFromZero", timeout_s=30)


def test_verifiers_at_zero_come_back_and_unschedulable_pods_stop_a_scale_up(
        kube: Kube, namespace: str, bus: KafkaBus, k8s_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    name = unique_job()
    topic = f"{namespace}.{name}.rollouts"
    verifier = {"replicas": 1, "autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 4,
                                               "targetLagPerReplica": 10, "noOffsetPolicy": "minReplicas",
                                               "behavior": fast()}}
    with operator(namespace, k8s_env["KUBECONFIG"], monkeypatch):
        create(kube, namespace, rljob(name, bus.bootstrap[0], roles={"verifier": verifier}))
        # no commit, nothing waiting: noOffsetPolicy minReplicas takes the pool to 0
        wait_for("verifiers at 0", lambda: replicas(kube, namespace, name).get("verifier") == 0, timeout_s=60)
        publish(bus, topic, 5, "a")  # a pool at 0 never commits: without the floor it stayed at 0 forever
        wait_for("a verifier back", lambda: replicas(kube, namespace, name)["verifier"] == 1, timeout_s=30)
        wait_for("reason WorkWaiting", lambda: ((get_job(kube, namespace, name) or {}).get("status") or {}).get(
            "scaling", {}).get("verifier", {}).get("reason") == "WorkWaiting", timeout_s=30)

        # its pod cannot be placed; a verifier elsewhere committed one record, 100 more arrive: lag 104 wants
        # ceil(104/10) = 11 -> 3 partitions, but the pool holds at 1
        pending_pod(kube, namespace, name, "verifier", f"{name}-verifier-x", GPU_MSG)
        consumer = bus.consumer([topic], group=f"{namespace}.{name}.verifiers")
        try:
            wait_for("one record", lambda: consumer.poll(timeout_s=0.5, max_records=1), every_s=0)
            consumer.commit()
        finally:
            consumer.close()
        publish(bus, topic, 100, "b")
        j = wait_for("ScalingLimited Unschedulable", lambda: (j := get_job(kube, namespace, name)) and condition(
            j, c.SCALING_LIMITED) == ("True", c.REASON_UNSCHEDULABLE) and j, timeout_s=30)
        msg = next(x["message"] for x in j["status"]["conditions"] if x["type"] == c.SCALING_LIMITED)
        assert "Insufficient nvidia.com/gpu" in msg and "1 of 1 pod(s) unschedulable" in msg, msg
        time.sleep(1.5)
        assert replicas(kube, namespace, name)["verifier"] == 1
        # placed (the pod goes): the scale-up proceeds, to the partition cap
        kube.request("DELETE", path("v1", "Pod", namespace, f"{name}-verifier-x"), query={"gracePeriodSeconds": "0"})
        wait_for("verifiers at 3", lambda: replicas(kube, namespace, name)["verifier"] == 3, timeout_s=30)


def test_pools_the_operator_does_not_autoscale_keep_what_an_external_scaler_set(
        kube: Kube, namespace: str, bus: KafkaBus, k8s_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    name = unique_job()

    def external_scale(role: str, n: int) -> None:  # what an HPA / KEDA / kubectl scale writes
        kube.request("PATCH", path("apps/v1", "Deployment", namespace, f"{name}-{role}", "scale"),
                     body={"spec": {"replicas": n}}, query={"fieldManager": "horizontal-pod-autoscaler"},
                     content_type="application/merge-patch+json")

    roles = {"generator": {"replicas": 1}, "verifier": {"replicas": 2, "autoscaling": {"external": True}}}
    with operator(namespace, k8s_env["KUBECONFIG"], monkeypatch):
        create(kube, namespace, rljob(name, bus.bootstrap[0], roles=roles))
        wait_for("initial sizes", lambda: replicas(kube, namespace, name) == {
            "generator": 1, "verifier": 2, "curriculum": 1, "learner": 1}, timeout_s=60)
        # the operator's first passes are over once its status says which spec sizes it applied (an external
        # scale before that can meet a pass that still applies the spec: the scaler then corrects it again)
        wait_for("the applied spec sizes in the status", lambda: {
            r: ((((get_job(kube, namespace, name) or {}).get("status") or {}).get("scaling") or {}).get(r) or {}).get(
                "specReplicas") for r in ("generator", "verifier")} == {"generator": 1, "verifier": 2}, timeout_s=60)
        external_scale("generator", 3)
        external_scale("verifier", 5)
        time.sleep(2.5)  # 5 operator passes: nothing is forced back
        assert (replicas(kube, namespace, name)["generator"], replicas(kube, namespace, name)["verifier"]) == (3, 5)
        # a spec change is the user's: applied to the pool the operator owns, not to the external one
        patch_spec(kube, namespace, name, {"roles": {"generator": {"replicas": 2},
                                                     "verifier": {"replicas": 4, "autoscaling": {"external": True}}}})
        wait_for("generator at the new spec", lambda: replicas(kube, namespace, name)["generator"] == 2, timeout_s=30)
        time.sleep(1.5)
        assert replicas(kube, namespace, name)["verifier"] == 5
        # suspend -> 0; resume -> the spec sizes (an HPA does not scale a Deployment at 0 back up)
        patch_spec(kube, namespace, name, {"suspend": True})
        wait_for("suspended", lambda: set(replicas(kube, namespace, name).values()) == {0}, timeout_s=30)
        patch_spec(kube, namespace, name, {"suspend": False})
        wait_for("resumed at the spec sizes", lambda: replicas(kube, namespace, name) == {
            "generator": 2, "verifier": 4, "curriculum": 1, "learner": 1}, timeout_s=30)


def test_a_scale_written_between_the_operators_read_and_its_apply_is_not_reverted(kube: Kube, namespace: str) -> None:
    """The window the test above can only hit by chance, opened on purpose: `decide` reads the
    Deployment's replicas, then an external scaler writes 4 before the apply. The apply carries the
    resourceVersion it decided on, so the API server refuses it (409) and the pass decides again on 4."""
    name = f"{unique_job()}-generator"
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
           "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": {
               "metadata": {"labels": {"app": name}},
               "spec": {"containers": [{"name": "g", "image": "scalerl:0.1.0"}]}}}}
    kube.apply(copy.deepcopy(dep))
    seen: list[int | None] = []

    def keep_what_runs(now: int | None) -> int:  # what the operator decides for a pool it does not scale
        seen.append(now)
        if len(seen) == 1:  # the external scaler writes after this read
            kube.request("PATCH", path("apps/v1", "Deployment", namespace, name, "scale"),
                         body={"spec": {"replicas": 4}}, query={"fieldManager": "horizontal-pod-autoscaler"},
                         content_type="application/merge-patch+json")
        return 1 if now is None else now

    applied = apply_workload(kube, copy.deepcopy(dep), keep_what_runs)
    assert seen == [1, 4]
    assert applied["spec"]["replicas"] == 4
    assert kube.get("apps/v1", "Deployment", namespace, name)["spec"]["replicas"] == 4
