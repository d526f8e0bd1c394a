"""The operator's own decisions on the Pod-running test cluster (scripts/infra/cluster.sh), as the chart's
ServiceAccount: an autoscaler decision on real Kafka lag becomes Pods the scheduler places and kwok runs,
and goes away again; a learner rank's container restart, reported by kwok, restarts the whole torchrun
group once. The same logic against the bare API server with hand-made pods: test_autoscale_*.py and
test_learner_gang.py; here nothing is patched by hand: the replicas, pods, nodes, phases and container
restarts are what the controllers, the scheduler and kwok wrote.

The container restart comes from scripts/infra/kwok/pod-container-restart.yaml, a kwok stage loaded
beside kwok's own: a pod annotated `scalerl.test/container-restarts=<n>` reports its first container
restarted n times (restartCount, lastState terminated with exit code 137, running again), as a kubelet
reports a rank killed by SIGKILL or the OOM killer.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import CPU_ROLE, MERGE, WAIT_S, Call, all_ready, gpu_role, is_ready, job_ready, nodes, pods
from operator_helpers import QUIET_KAFKA, create, event_reasons, get_job, kafka_bootstrap, rljob, unique_job

from scalerl.bus.kafka import KafkaBus
from scalerl.messages import MetricRecord
from scalerl_operator.api import conditions as c
from scalerl_operator.cluster.kube import Kube
from waiting import wait_for

pytestmark = [*QUIET_KAFKA, pytest.mark.infra]

RESTARTS_ANNOTATION = "scalerl.test/container-restarts"  # scripts/infra/kwok/pod-container-restart.yaml
PASSES_S = 2.5  # five operator passes (operator_helpers.INTERVAL_S)


@pytest.fixture
def bus(cluster_env: dict[str, str]) -> Any:
    b = KafkaBus(kafka_bootstrap(cluster_env))
    yield b
    b.close()


def test_an_autoscaler_decision_becomes_scheduled_running_pods_and_goes_with_the_backlog(
        cluster_call: Call, cluster_kube: Kube, cluster_namespace: str, bus: KafkaBus,
        cluster_operator: None) -> None:
    call, kube, ns, name = cluster_call, cluster_kube, cluster_namespace, unique_job()
    topic, group = f"{ns}.{name}.rollouts", f"{ns}.{name}.verifiers"  # render.bus_prefix
    fast = {"scaleUp": {"stabilizationWindowSeconds": 0,
                        "policies": [{"type": "Pods", "value": 4, "periodSeconds": 1}]},
            "scaleDown": {"stabilizationWindowSeconds": 0,
                          "policies": [{"type": "Percent", "value": 100, "periodSeconds": 1}]}}
    # lagFromEarliest: the backlog counts before any verifier committed (ours read from the earliest offset)
    verifier = {**CPU_ROLE, "replicas": 1, "autoscaling": {
        "enabled": True, "minReplicas": 1, "maxReplicas": 4, "targetLagPerReplica": 10,
        "noOffsetPolicy": "lagFromEarliest", "behavior": fast}}
    roles = {"learner": gpu_role(8, devicesPerNode=8), "generator": {**CPU_ROLE, "replicas": 1},
             "verifier": verifier, "curriculum": CPU_ROLE}
    create(kube, ns, rljob(name, bus.bootstrap[0], roles=roles))  # bus.partitions 3
    want = {"learner": 1, "generator": 1, "verifier": 1, "curriculum": 1}
    wait_for("every pod Running and Ready", lambda: all_ready(call, ns, name, want), timeout_s=WAIT_S)
    cpu_nodes = nodes(call, "cpu")

    for i in range(60):  # stand-ins for rollout groups: any decodable record counts as lag
        bus.publish(topic, MetricRecord("rollout", i, {}), key=f"r{i}")
    bus.flush()
    assert bus.lag(group, topic) == 60
    # ceil(60 / 10) = 6 > 3 partitions -> 3 verifiers: Deployment -> ReplicaSet -> 3 pods placed and running
    placed = wait_for("3 verifier pods Running and Ready", lambda: all_ready(
        call, ns, name, {**want, "verifier": 3}), timeout_s=WAIT_S)
    assert {p["spec"]["nodeName"] for p in placed["verifier"]} == set(cpu_nodes)  # no GPU toleration: CPU node

    def replica_sets() -> list[tuple[str, int, int]]:  # (owner, replicas, ready) of the verifiers' ReplicaSets
        status, rs = call("GET", f"/apis/apps/v1/namespaces/{ns}/replicasets", query={
            "labelSelector": f"app.kubernetes.io/instance={name},app.kubernetes.io/component=verifier"})
        assert status == 200, rs
        return [(r["metadata"]["ownerReferences"][0]["name"], r["spec"]["replicas"],
                 r["status"].get("readyReplicas", 0)) for r in rs["items"]]

    wait_for("one ReplicaSet of 3 ready", lambda: replica_sets() == [(f"{name}-verifier", 3, 3)], timeout_s=WAIT_S)
    wait_for("status 3/3, lag 60", lambda: (j := get_job(kube, ns, name)) and j["status"]["roles"]["verifier"][
        "summary"] == "3/3" and j["status"]["lag"][topic] == 60, timeout_s=WAIT_S)
    assert "Scaled" in event_reasons(kube, ns, name)
    time.sleep(PASSES_S)  # still 60 behind: the pool holds, nothing more is created
    assert len(pods(call, ns, name, "verifier")) == 3

    # the verifiers consume the backlog and commit: the pool goes back to minReplicas, its pods go
    consumer = bus.consumer([topic], group=group)
    try:
        deadline = time.monotonic() + WAIT_S
        while bus.lag(group, topic) > 0:
            assert time.monotonic() < deadline, f"lag still {bus.lag(group, topic)} after {WAIT_S:.0f}s"
            consumer.poll(timeout_s=0.5, max_records=500)
            consumer.commit()
    finally:
        consumer.close()
    wait_for("1 verifier pod, the other two gone", lambda: len(pods(call, ns, name, "verifier")) == 1 and all_ready(
        call, ns, name, want), timeout_s=WAIT_S)
    wait_for("the ReplicaSet at 1", lambda: replica_sets() == [(f"{name}-verifier", 1, 1)], timeout_s=WAIT_S)
    kept = pods(call, ns, name, "verifier")[0]
    assert kept["metadata"]["uid"] in {p["metadata"]["uid"] for p in placed["verifier"]}  # scaled down, not replaced
    j = wait_for("status 1/1, lag 0", lambda: (j := get_job(kube, ns, name)) and j["status"]["roles"]["verifier"][
        "summary"] == "1/1" and j["status"]["lag"][topic] == 0 and j, timeout_s=WAIT_S)
    assert j["status"]["scaling"]["verifier"]["lastReplicas"] == 1


def test_a_learner_rank_restarting_restarts_every_rank_once_and_counts_one_restart(
        cluster_call: Call, cluster_kube: Kube, cluster_namespace: str, cluster_bootstrap: str,
        cluster_env: dict[str, str], cluster_operator: None) -> None:
    call, kube, ns, name = cluster_call, cluster_kube, cluster_namespace, unique_job()
    # kwok reads its stages when it starts (scripts/infra/cluster.sh writes them to kwok.yaml)
    loaded = (Path(cluster_env["CLUSTER_LOG_DIR"]) / "kwok.yaml").read_text()
    assert "name: pod-container-restart" in loaded, "kwok runs without the pod-container-restart stage of " \
        "scripts/infra/kwok/: run scripts/infra/up.sh cluster (it restarts kwok with the new stages)"
    gpu_nodes = nodes(call, "gpu")
    # one 8-GPU rank per GPU node
    roles = {"learner": gpu_role(8, devicesPerNode=8, nodes=2), "generator": {**CPU_ROLE, "replicas": 1},
             "verifier": {**CPU_ROLE, "replicas": 1}, "curriculum": CPU_ROLE}
    create(kube, ns, rljob(name, cluster_bootstrap, failurePolicy={"maxRestarts": 3}, roles=roles))
    want = {"learner": 2, "generator": 1, "verifier": 1, "curriculum": 1}
    before = wait_for("every pod Running and Ready", lambda: all_ready(call, ns, name, want), timeout_s=WAIT_S)
    assert sorted(p["spec"]["nodeName"] for p in before["learner"]) == gpu_nodes
    wait_for("RLJob Ready", lambda: job_ready(kube, ns, name), timeout_s=WAIT_S)
    old = {p["metadata"]["uid"] for p in before["learner"]}

    # rank 1's container is killed: kwok reports restartCount 1 on that pod, as a kubelet would
    crashed = before["learner"][1]
    status, body = call("PATCH", f"/api/v1/namespaces/{ns}/pods/{crashed['metadata']['name']}",
                        {"metadata": {"annotations": {RESTARTS_ANNOTATION: "1"}}}, content_type=MERGE)
    assert status == 200, body

    def recreated() -> list[dict[str, Any]] | None:  # both ranks new, Running and Ready, on the GPU nodes
        now = pods(call, ns, name, "learner")
        fresh = [p for p in now if p["metadata"]["uid"] not in old]
        return fresh if len(now) == len(fresh) == 2 and all(is_ready(p) for p in now) else None

    after = wait_for("every rank recreated, Running and Ready", recreated, timeout_s=WAIT_S)
    assert sorted(p["spec"]["nodeName"] for p in after) == gpu_nodes
    assert all(int(cs.get("restartCount") or 0) == 0 for p in after for cs in p["status"]["containerStatuses"])
    # the restart was kwok's report on the killed pod (an Event about that pod, by its uid)
    status, ev = call("GET", f"/api/v1/namespaces/{ns}/events",
                      query={"fieldSelector": f"involvedObject.uid={crashed['metadata']['uid']}"})
    assert status == 200 and "ContainerRestarted" in [e["reason"] for e in ev["items"]], ev
    wait_for("status.restarts 1", lambda: ((get_job(kube, ns, name) or {}).get("status") or {}).get(
        "restarts") == 1, timeout_s=WAIT_S)
    # counted once: several passes later, still 1, one GroupRestart Event naming the rank, no further restart
    time.sleep(PASSES_S)
    j = wait_for("RLJob Ready again", lambda: job_ready(kube, ns, name), timeout_s=WAIT_S)
    assert j["status"]["restarts"] == 1 and j["status"]["phase"] == c.PHASE_RUNNING
    restarts = [e for e in kube.events(ns, name) if e["reason"] == "GroupRestart"]
    assert len(restarts) == 1, restarts
    assert (f"restarting the whole learner group (1 so far): pod {crashed['metadata']['name']}: container learner "
            "restarted 1 time(s)") in restarts[0]["message"], restarts[0]
    assert {p["metadata"]["uid"] for p in pods(call, ns, name, "learner")} == {p["metadata"]["uid"] for p in after}
