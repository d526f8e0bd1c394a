"""The operator's autoscaler on the real node: Pods of our image, scaled on what the bus and the learner say.

One RLJob of the tiny model, both pools autoscaled (short windows in its spec, the operator's pass every 3 s):

- **verifiers on Kafka lag**: a backlog of records is waiting in `<job>.rollouts` before any verifier exists
  (stand-ins the verifiers dead-letter: they count as lag and are consumed and committed like rollouts, but
  never reach the learner); the pool goes 1 -> 3 (the topic's 3 partitions), the three Pods run on the node
  and join the verifiers' consumer group (its members read from the broker), the backlog is committed
  (the group's offsets), and the pool goes back to 1 once the scale-down window has passed;
- **generators on learner starvation**: each generator Pod asks for 2 of the node's 4 fake nvidia.com/gpu;
  the pool grows one Pod per pass while the learner waits for batches; the third Pod cannot be placed
  (Pending, Unschedulable, from the scheduler), is not counted as capacity, and the pool is held at 3 for
  the rest of the test (ScalingLimited/Unschedulable naming the GPU) instead of growing to its maximum 4.

Every expected value comes from the broker (offsets, group members), the API server (the Deployments' /scale,
Pods and their conditions, Events) or the RLJob's status as a user reads it; never from the Pods' logs.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from rljob_helpers import RLJOB_API, start_job, wait_logged

from infra_session import sasl_bus
from scalerl.messages import MetricRecord
from scalerl_operator.autoscale.hpa import direction_changes
from scalerl_operator.render.names import bus_prefix

pytestmark = [pytest.mark.infra]

T = TypeVar("T")
STEPS = 2000  # more than the test lasts: the job goes with its namespace
PARTITIONS = 3
BACKLOG = 6000  # records waiting for the verifiers: lag / 500 per replica = 12, capped at 3 partitions
LAG_PER_REPLICA = 500
VERIFIER_DOWN_WINDOW_S = 10
GPUS_PER_GENERATOR = 2  # of the node's 4: the third generator Pod cannot be placed
HOLD_S = 9.0  # how long the generator pool must stay held with a Pod Pending (3 operator passes)
TIMEOUT_S = 150.0


def _fast(up_pods: int, down_window_s: int) -> dict[str, Any]:
    """HPA behaviour: up by `up_pods` per second without a window, down after `down_window_s` (all at once)."""
    return {"scaleUp": {"stabilizationWindowSeconds": 0,
                        "policies": [{"type": "Pods", "value": up_pods, "periodSeconds": 1}]},
            "scaleDown": {"stabilizationWindowSeconds": down_window_s,
                          "policies": [{"type": "Percent", "value": 100, "periodSeconds": 1}]}}


ROLES = {
    "verifier": {"replicas": 1, "autoscaling": {
        "enabled": True, "minReplicas": 1, "maxReplicas": 3, "targetLagPerReplica": LAG_PER_REPLICA,
        "noOffsetPolicy": "lagFromEarliest", "behavior": _fast(4, VERIFIER_DOWN_WINDOW_S)}},
    "generator": {"replicas": 1, "resources": {"limits": {"nvidia.com/gpu": str(GPUS_PER_GENERATOR)}},
                  "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 4, "targetStarvation": 0.02,
                                  "stalenessHeadroom": 1, "behavior": _fast(1, 600)}},
}


def _wait(what: str, probe: Callable[[], T | None], timeout_s: float = TIMEOUT_S, every_s: float = 0.5) -> T:
    return wait_logged("autoscale", what, probe, timeout_s, every_s)


class _Cluster:
    """What the test reads from the node's API server."""

    def __init__(self, api: Any, ns: str, name: str) -> None:
        from kubernetes import client

        self.apps, self.core, self.custom = client.AppsV1Api(api), client.CoreV1Api(api), client.CustomObjectsApi(api)
        self.ns, self.name = ns, name

    def replicas(self, role: str) -> int:
        return int(self.apps.read_namespaced_deployment_scale(f"{self.name}-{role}", self.ns).spec.replicas or 0)

    def pods(self, role: str) -> list[Any]:
        pods = self.core.list_namespaced_pod(self.ns, label_selector=f"app.kubernetes.io/component={role}").items
        return [p for p in pods if p.metadata.deletion_timestamp is None]

    def job(self) -> dict[str, Any]:
        return dict(self.custom.get_namespaced_custom_object(*RLJOB_API[:2], self.ns, RLJOB_API[2], self.name))

    def scaled(self, role: str) -> list[str]:
        """The `Scaled` Events about the RLJob for `role`, oldest first: "role: a -> b replicas (...)"."""
        events = self.core.list_namespaced_event(self.ns, field_selector=f"involvedObject.name={self.name}").items
        events.sort(key=lambda e: (e.first_timestamp or e.event_time, e.metadata.name))
        return [m for e in events if e.reason == "Scaled" and (m := e.message or "").startswith(f"{role}:")]


def _end_offsets(bus: Any, topic: str) -> dict[int, int]:
    from kafka import TopicPartition
    from kafka.admin import OffsetSpec

    admin = bus._get_admin()
    ends = admin.list_partition_offsets({TopicPartition(topic, p): OffsetSpec.LATEST for p in bus.partitions(topic)})
    return {tp.partition: o.offset for tp, o in ends.items()}


def _group_members(bus: Any, group: str) -> list[str]:
    """The address each member of the consumer group that holds a partition connects from (its coordinator's
    view of the group)."""
    from kafka.admin import KafkaAdminClient

    admin = bus.connect(KafkaAdminClient, client_id="rn-autoscale-admin")
    try:
        members = admin.describe_groups([group])[group]["members"]
    finally:
        admin.close()
    return sorted(m["client_host"].lstrip("/") for m in members
                  if any(a["partitions"] for a in (m.get("member_assignment") or {}).get("assigned_partitions", [])))


def _unschedulable(pod: Any) -> str | None:
    """The scheduler's message of a Pod it could not place, else None."""
    for cond in pod.status.conditions or []:
        if cond.type == "PodScheduled" and cond.status == "False" and cond.reason == "Unschedulable":
            return str(cond.message)
    return None


def test_real_node_autoscales_verifiers_on_kafka_lag_and_generators_on_starvation(
        node_env, node_api, node_namespace, kubectl, chart, mixed_start) -> None:
    name = "scale"
    k8s = _Cluster(node_api, node_namespace, name)
    prefix = bus_prefix(name, node_namespace)
    rollouts, verifiers = f"{prefix}.rollouts", f"{prefix}.verifiers"
    bus = sasl_bus(node_env)
    try:
        # the backlog waits before the job (and so any verifier) exists; the operator keeps the topic
        bus.ensure_topics([rollouts], partitions=PARTITIONS)
        for i in range(BACKLOG):
            bus.publish(rollouts, MetricRecord("backlog", i, {}), key=f"b{i}")
        bus.flush()
        backlog_end = _end_offsets(bus, rollouts)
        assert sum(backlog_end.values()) == BACKLOG
        t0 = time.monotonic()
        start_job(kubectl, node_namespace, node_env, mixed_start, name, steps=STEPS, k=8, partitions=PARTITIONS,
                  roles=ROLES)

        # verifiers: 1 -> 3 on the lag (12 wanted, 3 partitions): the status of the pass that scaled (the next
        # is 3 s later), the Deployment's /scale and an Event say so
        verifier = _wait("the status at 3 verifiers", lambda: (s := (k8s.job().get("status") or {}).get(
            "scaling", {}).get("verifier")) and s["desiredReplicas"] == 3 and s, every_s=0.3)
        up_s = time.monotonic() - t0
        # "lag 6000 records / 500 per replica = 12, capped at 3 partitions (...)": the broker's lag, no verifier yet
        lag = re.match(r"lag (\d+) records / (\d+) per replica = (\d+), capped at 3 partitions", verifier["message"])
        assert verifier["reason"] == "ConsumerLag" and lag, verifier
        assert 2 * LAG_PER_REPLICA < int(lag[1]) <= BACKLOG + 100 and int(lag[3]) > PARTITIONS, verifier
        assert k8s.replicas("verifier") == 3
        scaled = k8s.scaled("verifier")
        assert scaled and scaled[0].startswith("verifier: 1 -> 3 replicas (ConsumerLag: lag "), scaled
        # the three Pods run on the node, hold a partition each in the group, and commit the backlog
        _wait("3 verifier Pods running", lambda: [p for p in k8s.pods("verifier") if p.status.phase == "Running"
                                                  and p.spec.node_name == node_env["NODE_NAME"]][2:])
        members = _wait("3 members in the verifiers' group", lambda: (m := _group_members(bus, verifiers))[2:] and m,
                        every_s=1.0)
        # (the Pods reach the broker through a Service without NAT: the coordinator sees their IPs)
        assert members == sorted(p.status.pod_ip for p in k8s.pods("verifier")), members
        _wait("the backlog committed", lambda: all(bus.committed(verifiers, rollouts).get(p, 0) >= end
                                                   for p, end in backlog_end.items()), every_s=1.0)
        drained_at = time.monotonic()
        # ... and back to 1 once the scale-down window has passed over the last recommendation of 3
        _wait("1 verifier", lambda: k8s.replicas("verifier") == 1, timeout_s=VERIFIER_DOWN_WINDOW_S + 30)
        down_s = time.monotonic() - drained_at
        # up once, then down (through 2 when a recommendation of 2 was made in the last window), never up again
        sizes = [1, *(int(m.split(" -> ")[1].split()[0]) for m in k8s.scaled("verifier"))]
        assert sizes[:2] == [1, 3] and sizes[-1] == 1 and direction_changes(sizes) == 1, sizes
        _wait("the status at 1", lambda: k8s.job()["status"]["scaling"]["verifier"]["desiredReplicas"] == 1)

        # generators: up one Pod per pass on starvation until the third cannot be placed (4 GPUs, 2 per Pod)
        _wait("3 generators", lambda: k8s.replicas("generator") == 3)
        pending = _wait("a generator Pod unschedulable",
                        lambda: [m for p in k8s.pods("generator") if (m := _unschedulable(p))])
        assert "nvidia.com/gpu" in pending[0], pending
        placed = [p for p in k8s.pods("generator") if p.spec.node_name == node_env["NODE_NAME"]]
        assert len(placed) == 2, [p.metadata.name for p in placed]
        job = _wait("ScalingLimited Unschedulable", lambda: (j := k8s.job()) and any(
            c["type"] == "ScalingLimited" and c["status"] == "True" and "nvidia.com/gpu" in c["message"]
            for c in j["status"].get("conditions") or []) and j)
        gen = job["status"]["scaling"]["generator"]
        # "generator: 1 of 3 pod(s) unschedulable (Insufficient nvidia.com/gpu): held at 3 instead of N": the two
        # placed Pods' starvation asked for more, the Pending one is why it is not granted
        held = re.search(r"1 of 3 pod\(s\) unschedulable \(Insufficient nvidia.com/gpu\): held at 3 instead of (\d+)",
                         gen["message"])
        assert gen["desiredReplicas"] == 3 and held and int(held[1]) > 3, gen
        assert gen["reason"] == "LearnerStarvation", gen
        # held: the Pending Pod is no capacity, yet the pool neither grows to its max nor shrinks
        held_until = time.monotonic() + HOLD_S
        while time.monotonic() < held_until:
            assert k8s.replicas("generator") == 3
            time.sleep(1.0)
        scaled = k8s.scaled("generator")
        assert [m.split(" (")[0] for m in scaled] == ["generator: 1 -> 2 replicas", "generator: 2 -> 3 replicas"], \
            scaled
        assert all("LearnerStarvation" in m for m in scaled), scaled
        total_s = time.monotonic() - t0
    finally:
        bus.close()
        # the job's Pods stopped gracefully (they leave their consumer groups) before the namespace goes with
        # grace 0: else the RLJob's finalizer waits out the groups' session timeouts (2 min measured)
        kubectl("delete", "rljob", "-n", node_namespace, name, "--timeout=90s", check=False, timeout_s=120.0)
    print(f"\n[autoscale] verifiers 1 -> 3 {up_s:.0f} s after apply; 3 -> 1 {down_s:.1f} s after the backlog was "
          f"committed (window {VERIFIER_DOWN_WINDOW_S} s); generators held at 3 with one Pod Pending; {total_s:.0f} s")
