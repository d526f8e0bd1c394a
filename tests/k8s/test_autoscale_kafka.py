"""The autoscaler end to end: the operator (in-process, KopfRunner) reads a REAL Kafka backlog and
REAL learner records and writes the pools' sizes through /scale on the REAL kube-apiserver. The
behaviour windows are shortened in the RLJob spec (seconds instead of minutes); the operator ticks
every 0.5 s."""

from __future__ import annotations

import time
from typing import Any

import pytest
from operator_helpers import (
    QUIET_KAFKA,
    condition,
    create,
    event_reasons,
    get_job,
    kafka_bootstrap,
    operator,
    replicas,
    rljob,
    unique_job,
    wait_for,
)

from scalerl.bus.kafka import KafkaBus
from scalerl.messages import MetricRecord
from scalerl_operator.api import conditions as c
from scalerl_operator.autoscale.autoscaler import PAUSE_ANNOTATION
from scalerl_operator.cluster.kube import Kube, path

pytestmark = [*QUIET_KAFKA, pytest.mark.infra]
DOWN_WINDOW_S = 4


@pytest.fixture
def bus(k8s_env: dict[str, str]) -> Any:
    b = KafkaBus(kafka_bootstrap(k8s_env))
    yield b
    b.close()


def fast(up_pods: int, down_window_s: int, down: dict[str, Any]) -> dict[str, Any]:
    """Behaviour with 1 s policy periods: scale up by `up_pods` at once, down by `down` after the window."""
    return {"scaleUp": {"stabilizationWindowSeconds": 0,
                        "policies": [{"type": "Pods", "value": up_pods, "periodSeconds": 1}]},
            "scaleDown": {"stabilizationWindowSeconds": down_window_s, "policies": [{**down, "periodSeconds": 1}]}}


def annotate(kube: Kube, namespace: str, name: str, value: str | None) -> None:
    kube.request("PATCH", path("scalerl.dev/v1alpha1", "RLJob", namespace, name),
                 body={"metadata": {"annotations": {PAUSE_ANNOTATION: value}}},
                 content_type="application/merge-patch+json")


def drain(bus: KafkaBus, consumer: Any, topic: str, group: str) -> float:
    """Consume and commit until the group's lag on `topic` is 0 (what the verifiers would do); the monotonic
    time of the last commit, from when the operator can see the lag at 0 (the lag checks after it take time)."""
    deadline = time.monotonic() + 30
    committed_at = time.monotonic()
    while bus.lag(group, topic) > 0 and time.monotonic() < deadline:
        consumer.poll(timeout_s=0.5, max_records=500)
        consumer.commit()
        committed_at = time.monotonic()
    assert bus.lag(group, topic) == 0
    return committed_at


def test_verifiers_scale_up_on_a_backlog_and_down_after_the_window(
        kube: Kube, namespace: str, bus: KafkaBus, k8s_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    name = unique_job()
    topic, group = f"{namespace}.{name}.rollouts", f"{namespace}.{name}.verifiers"  # render.bus_prefix
    verifier = {"replicas": 1, "autoscaling": {
        "enabled": True, "minReplicas": 1, "maxReplicas": 4, "targetLagPerReplica": 10, "noOffsetPolicy": "minReplicas",
        "behavior": fast(4, DOWN_WINDOW_S, {"type": "Percent", "value": 100})}}
    manifest = rljob(name, bus.bootstrap[0], roles={"verifier": verifier})  # bus.partitions 3
    with operator(namespace, k8s_env["KUBECONFIG"], monkeypatch):
        create(kube, namespace, manifest)
        wait_for("the verifier Deployment", lambda: replicas(kube, namespace, name).get("verifier") == 1)
        for i in range(200):  # stand-ins for rollout groups: any decodable message counts as lag
            bus.publish(topic, MetricRecord("rollout", i, {}), key=f"p{i}")
        bus.flush()
        consumer = bus.consumer([topic], group=group)  # a verifier that took one record and committed it
        try:
            wait_for("one record", lambda: consumer.poll(timeout_s=0.5, max_records=1), every_s=0)
            consumer.commit()
            assert bus.lag(group, topic) == 199
            # ceil(199 / 10) = 20 > 3 partitions -> 3 (maxReplicas 4 is not reached)
            wait_for("verifiers at 3", lambda: replicas(kube, namespace, name)["verifier"] == 3)
            j = wait_for("ScalingLimited=True", lambda: (j := get_job(kube, namespace, name)) and
                         condition(j, c.SCALING_LIMITED) == ("True", c.REASON_PARTITION_CAP) and j)
            assert j["status"]["lag"][topic] == 199 and j["status"]["lagTotal"] >= 199
            scaling = j["status"]["scaling"]["verifier"]
            assert scaling["lastReplicas"] == 3 and scaling["desiredReplicas"] == 3 and scaling["recommendations"]
            assert "Scaled" in event_reasons(kube, namespace, name)
            time.sleep(1.0)
            assert replicas(kube, namespace, name)["verifier"] == 3  # held: still 199 behind

            drained_at = drain(bus, consumer, topic, group)  # (the last commit: lag 0 from then on)
            wait_for("verifiers back at 1", lambda: replicas(kube, namespace, name)["verifier"] == 1, timeout_s=20)
            waited = time.monotonic() - drained_at
            # the recommendations of 3 made before the drain keep the pool for the window, no longer
            assert DOWN_WINDOW_S - 1.0 <= waited <= DOWN_WINDOW_S + 3.0, f"scaled down after {waited:.1f}s"

            # paused: a new backlog changes nothing until the annotation goes
            annotate(kube, namespace, name, "true")
            wait_for("the pause seen", lambda: condition(get_job(kube, namespace, name), c.SCALING_LIMITED) ==
                     ("False", c.REASON_PAUSED))
            for i in range(100):
                bus.publish(topic, MetricRecord("rollout", i, {}), key=f"q{i}")
            bus.flush()
            time.sleep(2.0)  # 4 operator passes
            assert replicas(kube, namespace, name)["verifier"] == 1
            annotate(kube, namespace, name, None)
            wait_for("scale-up after the pause", lambda: replicas(kube, namespace, name)["verifier"] == 3)
        finally:
            consumer.close()
    # (after the KopfRunner: click swaps sys.stdout while it runs)
    print(f"\n[autoscale] verifiers 3 -> 1 {waited:.1f}s after the drain (window {DOWN_WINDOW_S}s)")


def test_generators_follow_learner_starvation_and_staleness(
        kube: Kube, namespace: str, bus: KafkaBus, k8s_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    name = unique_job()
    generator = {"replicas": 1, "autoscaling": {
        "enabled": True, "minReplicas": 1, "maxReplicas": 4, "targetStarvation": 0.1, "stalenessHeadroom": 1,
        "behavior": fast(4, 0, {"type": "Pods", "value": 1})}}
    with operator(namespace, k8s_env["KUBECONFIG"], monkeypatch):
        create(kube, namespace, rljob(name, bus.bootstrap[0], roles={"generator": generator}))  # k = 4
        wait_for("the generator Deployment", lambda: replicas(kube, namespace, name).get("generator") == 1)
        time.sleep(1.5)  # nothing reported yet: held (a warm-up is not a metric failure)
        assert replicas(kube, namespace, name)["generator"] == 1

        def learner_says(step: int, wait: float, stale: float) -> None:
            bus.publish(f"{namespace}.{name}.metrics", MetricRecord("train", step, {"batch_wait_frac": wait,
                                                                        "staleness_max": stale}), key="learner")
            bus.flush()

        learner_says(5, 0.35, 1.0)  # ceil(1 x 0.35 / 0.1) = 4
        wait_for("generators at 4", lambda: replicas(kube, namespace, name)["generator"] == 4)
        j = wait_for("RL status", lambda: (j := get_job(kube, namespace, name)) and
                     (j.get("status") or {}).get("learnerStep") == 5 and j)
        assert j["status"]["policyVersion"] == 5 and j["status"]["staleness"]["current"] == 1
        assert condition(j, c.LEARNER_STARVED) == ("True", c.REASON_STARVED)

        learner_says(6, 0.35, 3.0)  # 3 >= k - headroom: hold at 4 (14 wanted)
        wait_for("StalenessHold", lambda: condition(get_job(kube, namespace, name), c.SCALING_LIMITED) ==
                 ("True", c.REASON_STALENESS_HOLD))
        assert replicas(kube, namespace, name)["generator"] == 4

        learner_says(7, 0.35, 4.0)  # at k: one fewer per pass (Pods 1 / 1 s) down to minReplicas
        wait_for("generators at 1", lambda: replicas(kube, namespace, name)["generator"] == 1, timeout_s=15)
        j = get_job(kube, namespace, name)
        assert condition(j, c.POLICY_LAG_EXCEEDED) == ("True", c.REASON_STALENESS_AT_BOUND)
        scaled = [e["message"] for e in kube.events(namespace, name) if e["reason"] == "Scaled"]
        assert [m.split(" (")[0] for m in scaled] == ["generator: 1 -> 4 replicas", "generator: 4 -> 3 replicas",
                                                      "generator: 3 -> 2 replicas", "generator: 2 -> 1 replicas"]


def test_verifiers_scale_on_the_busy_tool_call_slots_they_report(
        kube: Kube, namespace: str, bus: KafkaBus, k8s_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """No backlog on the bus (the lag asks for minReplicas), but the verifiers' execution slots are busy with
    tool calls: the `environment` records they publish scale the pool up, and down once they idle."""
    name = unique_job()
    verifier = {"replicas": 1, "autoscaling": {
        "enabled": True, "minReplicas": 1, "maxReplicas": 6, "targetLagPerReplica": 10, "targetBusyFraction": 0.5,
        "behavior": fast(4, DOWN_WINDOW_S, {"type": "Percent", "value": 100})}}
    metrics = f"{namespace}.{name}.metrics"

    def busy(**by_replica: float) -> None:
        for source, fraction in by_replica.items():
            values = {"busy_fraction": fraction, "slots": 4.0, "running": 4.0 * fraction, "queued": 0.0,
                      "time_s": time.time()}
            bus.publish(metrics, MetricRecord("environment", 0, values, source=source), key=source)
        bus.flush()

    with operator(namespace, k8s_env["KUBECONFIG"], monkeypatch):
        create(kube, namespace, rljob(name, bus.bootstrap[0], roles={"verifier": verifier}))
        wait_for("the verifier Deployment", lambda: replicas(kube, namespace, name).get("verifier") == 1)
        busy(**{"verifier-a": 0.9})  # ceil(1 x 0.9 / 0.5) = 2
        wait_for("verifiers at 2", lambda: replicas(kube, namespace, name)["verifier"] == 2)
        busy(**{"verifier-a": 1.0, "verifier-b": 0.9})  # ceil(2 x 0.95 / 0.5) = 4
        wait_for("verifiers at 4", lambda: replicas(kube, namespace, name)["verifier"] == 4)
        scaled = [e["message"] for e in kube.events(namespace, name) if e["reason"] == "Scaled"]
        assert scaled[:2] == [m for m in scaled[:2] if "EnvironmentBusy" in m and "execution slots busy" in m]
        busy(**{f"verifier-{x}": 0.05 for x in "abcd"})  # ceil(4 x 0.05 / 0.5) = 1: down after the window
        wait_for("verifiers back at 1", lambda: replicas(kube, namespace, name)["verifier"] == 1, timeout_s=30)
