"""The operator against the REAL kube-apiserver (and the real Kafka for topics and cleanup), in-process
via kopf.testing.KopfRunner, one namespace per test. No kubelet or controllers run: readiness is
simulated by patching the children's /status, and garbage collection by checking ownerReferences."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
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

from scalerl.bus.kafka import KafkaBus
from scalerl.messages import MetricRecord
from scalerl_operator.api import conditions as c
from scalerl_operator.api.spec import parse_spec
from scalerl_operator.autoscale.autoscaler import ScalerState, Timed
from scalerl_operator.cluster.kube import Kube
from scalerl_operator.control.handlers import FINALIZER
from scalerl_operator.control.leader import LeaderElector
from scalerl_operator.control.runtime import OperatorConfig, Runtime
from scalerl_operator.render.children import desired_replicas, render

pytestmark = [*QUIET_KAFKA, pytest.mark.infra]
ALL = {"ConfigMap", "Deployment/generator", "Deployment/verifier", "Deployment/curriculum", "StatefulSet/learner",
       "Service/learner", "Service/generator", "Service/verifier"}


def _kinds(kids: dict[str, Any], name: str) -> set[str]:
    return {k.replace(f"{name}-", "").replace("ConfigMap/spec", "ConfigMap") for k in kids}


def test_creates_children_status_and_reacts_to_spec_changes(kube: Kube, namespace: str, bootstrap: str,
                                                             k8s_env: dict[str, str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    name = unique_job()
    with operator(namespace, k8s_env["KUBECONFIG"], monkeypatch):
        job = create(kube, namespace, rljob(name, bootstrap))
        kids = wait_for("all 8 children", lambda: (k := children(kube, namespace, name)) and len(k) == 8 and k)
        assert _kinds(kids, name) == ALL
        for key, o in kids.items():  # owned by the RLJob: garbage collection removes them with it
            assert o["metadata"]["ownerReferences"] == [{
                "apiVersion": "scalerl.dev/v1alpha1", "kind": "RLJob", "name": name, "uid": job["metadata"]["uid"],
                "controller": True, "blockOwnerDeletion": True}], key
        assert replicas(kube, namespace, name) == {"generator": 1, "verifier": 2, "curriculum": 1, "learner": 1}
        # topics on the real broker: data topics with spec.bus.partitions, the rest with one
        bus = KafkaBus(bootstrap)
        try:
            job = f"{namespace}.{name}"  # render.bus_prefix
            assert len(bus.partitions(f"{job}.rollouts")) == 3 and len(bus.partitions(f"{job}.metrics")) == 1
        finally:
            bus.close()
        pending = wait_for("status Pending", lambda: (j := get_job(kube, namespace, name)) and
                           (j.get("status") or {}).get("phase") == c.PHASE_PENDING and j)
        assert condition(pending, c.READY) == ("False", c.REASON_ROLES_NOT_READY)
        assert pending["status"]["observedGeneration"] == pending["metadata"]["generation"]
        assert FINALIZER in pending["metadata"]["finalizers"]

        simulate_ready(kube, namespace, name)
        running = wait_for("Ready=True", lambda: (j := get_job(kube, namespace, name)) and
                           condition(j, c.READY) == ("True", c.REASON_ALL_ROLES_READY) and j)
        assert running["status"]["phase"] == c.PHASE_RUNNING
        assert running["status"]["roles"]["verifier"] == {"ready": 2, "desired": 2, "summary": "2/2"}
        # the operator posts the phase Event just after the status patch the wait above saw
        wait_for("PhasePending and PhaseRunning Events",
                 lambda: {"PhasePending", "PhaseRunning"} <= set(event_reasons(kube, namespace, name)))

        patch_spec(kube, namespace, name, {"roles": {"generator": {"replicas": 1}, "verifier": {"replicas": 4}}})
        wait_for("verifier Deployment at 4", lambda: replicas(kube, namespace, name)["verifier"] == 4)
        j = wait_for("status of the new generation", lambda: (j := get_job(kube, namespace, name)) and
                     j["status"]["observedGeneration"] == j["metadata"]["generation"] and
                     j["status"]["roles"]["verifier"]["desired"] == 4 and j)
        assert condition(j, c.READY) == ("False", c.REASON_ROLES_NOT_READY)  # 2 of 4 verifiers ready
        assert "Scaled" in event_reasons(kube, namespace, name)


def test_double_reconcile_changes_nothing(kube: Kube, namespace: str, bootstrap: str, k8s_env: dict[str, str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    name = unique_job()
    create(kube, namespace, rljob(name, bootstrap))
    rt = Runtime(kube, OperatorConfig(kafka_timeout_s=10))
    try:
        assert rt.sync(namespace, name, scale=False) == c.PHASE_PENDING
        first = {k: o["metadata"]["resourceVersion"] for k, o in children(kube, namespace, name).items()}
        assert len(first) == 8
        assert rt.sync(namespace, name, scale=True) == c.PHASE_PENDING  # the periodic pass reconciles too
        again = {k: o["metadata"]["resourceVersion"] for k, o in children(kube, namespace, name).items()}
        assert again == first
    finally:
        rt.close()
    # ... and the operator's own passes (create, resume, the 0.5 s daemon) change nothing either
    with operator(namespace, k8s_env["KUBECONFIG"], monkeypatch):
        wait_for("the finalizer (the operator handled the RLJob)",
                 lambda: FINALIZER in get_job(kube, namespace, name)["metadata"].get("finalizers", []))
        time.sleep(2.0)  # 4 daemon passes
        assert {k: o["metadata"]["resourceVersion"] for k, o in children(kube, namespace, name).items()} == first


def test_suspend_scales_to_zero_and_resume_restores(kube: Kube, namespace: str, bootstrap: str,
                                                    k8s_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    name = unique_job()
    with operator(namespace, k8s_env["KUBECONFIG"], monkeypatch):
        create(kube, namespace, rljob(name, bootstrap))
        before = {"generator": 1, "verifier": 2, "curriculum": 1, "learner": 1}
        wait_for("children", lambda: len(children(kube, namespace, name)) == 8 and
                 replicas(kube, namespace, name) == before)
        patch_spec(kube, namespace, name, {"suspend": True})
        wait_for("every role at 0", lambda: set(replicas(kube, namespace, name).values()) == {0})
        j = wait_for("phase Suspended", lambda: (j := get_job(kube, namespace, name)) and
                     j["status"].get("phase") == c.PHASE_SUSPENDED and j)
        assert condition(j, c.SUSPENDED) == ("True", c.REASON_SUSPENDED)
        assert len(children(kube, namespace, name)) == 8  # objects (and checkpoints in the store) are kept
        patch_spec(kube, namespace, name, {"suspend": False})
        wait_for("replicas restored", lambda: replicas(kube, namespace, name) == before)
        j = wait_for("Suspended=False", lambda: (j := get_job(kube, namespace, name)) and
                     condition(j, c.SUSPENDED) == ("False", c.REASON_RESUMED) and j)
        assert j["status"]["phase"] == c.PHASE_PENDING


def test_invalid_spec_fails_then_recovers(kube: Kube, namespace: str, bootstrap: str, k8s_env: dict[str, str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    name = unique_job()
    with operator(namespace, k8s_env["KUBECONFIG"], monkeypatch):
        bad = rljob(name, bootstrap)
        bad["spec"]["job"]["off_policy"] = {"k": 4, "mode": "ppo"}  # schema-valid, not runnable distributed
        create(kube, namespace, bad)
        j = wait_for("phase Failed", lambda: (j := get_job(kube, namespace, name)) and
                     (j.get("status") or {}).get("phase") == c.PHASE_FAILED and j)
        failed = c.get_condition(j["status"]["conditions"], c.FAILED)
        assert failed is not None and failed["reason"] == c.REASON_INVALID_SPEC
        assert failed["message"].startswith("spec.job.off_policy.mode:")
        assert children(kube, namespace, name) == {}
        assert c.REASON_INVALID_SPEC in event_reasons(kube, namespace, name)
        patch_spec(kube, namespace, name, {"job": {"off_policy": {"k": 4, "mode": "pipeline"}}})
        j = wait_for("phase Pending after the fix", lambda: (j := get_job(kube, namespace, name)) and
                     j["status"].get("phase") == c.PHASE_PENDING and j)
        assert condition(j, c.FAILED) == ("False", c.REASON_RUNNING)
        assert len(children(kube, namespace, name)) == 8


def test_delete_runs_the_finalizer_on_kafka(kube: Kube, namespace: str, bootstrap: str, k8s_env: dict[str, str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    name = unique_job()
    job = f"{namespace}.{name}"  # the topics' and groups' prefix (render.bus_prefix)
    bus = KafkaBus(bootstrap)
    try:
        with operator(namespace, k8s_env["KUBECONFIG"], monkeypatch):
            create(kube, namespace, rljob(name, bootstrap))
            wait_for("topics", lambda: len(bus.list_topics(prefix=f"{job}.")) == 6)
            # a verifier group with committed offsets, as running verifiers leave it
            bus.publish(f"{job}.rollouts", MetricRecord("stand-in", 1, {}), key="p1")  # any decodable message
            bus.flush()
            consumer = bus.consumer([f"{job}.rollouts"], group=f"{job}.verifiers")
            wait_for("a polled record", lambda: consumer.poll(timeout_s=0.5, max_records=1), every_s=0)
            consumer.commit()
            consumer.close()
            assert bus.committed(f"{job}.verifiers", f"{job}.rollouts")
            kube.request("DELETE", f"/apis/scalerl.dev/v1alpha1/namespaces/{namespace}/rljobs/{name}")
            wait_for("the RLJob gone", lambda: get_job(kube, namespace, name) is None, timeout_s=30)
        assert bus.list_topics(prefix=f"{job}.") == []
        assert bus.committed(f"{job}.verifiers", f"{job}.rollouts") == {}
        assert replicas(kube, namespace, name) == dict.fromkeys(("generator", "verifier", "curriculum", "learner"), 0)
        assert "CleanedUp" in event_reasons(kube, namespace, name)
    finally:
        bus.close()


def test_delete_with_store_retention_delete_empties_the_jobs_prefix(
        kube: Kube, namespace: str, bootstrap: str, k8s_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """`store.retention: delete`: the finalizer deletes every object under the job's prefix in the real
    MinIO, with the key pair from the Secret the spec names; a neighbour prefix in the bucket stays."""
    from scalerl.store.s3 import S3Store

    missing = [k for k in ("S3_ENDPOINT", "S3_ACCESS_KEY", "S3_SECRET_KEY") if not k8s_env.get(k)]
    assert not missing, f"build/infra.env lacks {missing}: start MinIO with scripts/infra/up.sh minio"
    name, bucket = unique_job(), f"ret-{unique_job()}"
    endpoint, access, secret = k8s_env["S3_ENDPOINT"], k8s_env["S3_ACCESS_KEY"], k8s_env["S3_SECRET_KEY"]
    job_store = S3Store(endpoint, access, secret, bucket, f"runs/{name}")
    neighbour = S3Store(endpoint, access, secret, bucket, "runs/other-job")
    for key in ("checkpoints/LATEST", "checkpoints/step_000002/model.safetensors", "policy/v00000002.safetensors"):
        job_store.put_bytes(key, b"x")
    neighbour.put_bytes("checkpoints/LATEST", b"keep me")
    kube.request("POST", f"/api/v1/namespaces/{namespace}/secrets", body={
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "minio-keys"},
        "stringData": {"accessKey": access, "secretKey": secret}})
    store = {"uri": f"s3://{bucket}/runs/{name}", "endpoint": endpoint, "retention": "delete",
             "credentialsSecret": {"name": "minio-keys"}}
    with operator(namespace, k8s_env["KUBECONFIG"], monkeypatch):
        create(kube, namespace, rljob(name, bootstrap, store=store))
        wait_for("the learner StatefulSet", lambda: kube.get("apps/v1", "StatefulSet", namespace, f"{name}-learner"))
        kube.request("DELETE", f"/apis/scalerl.dev/v1alpha1/namespaces/{namespace}/rljobs/{name}")
        wait_for("the RLJob gone", lambda: get_job(kube, namespace, name) is None, timeout_s=30)
    assert job_store.list("") == []
    assert neighbour.list("") == ["checkpoints/LATEST"]
    assert "StoreDeleted" in event_reasons(kube, namespace, name)


def test_delete_with_its_secrets_gone_reports_what_is_left_and_releases_the_finalizer(
        kube: Kube, namespace: str, bootstrap: str, k8s_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """As `kubectl delete namespace` leaves it (the namespace controller deletes the Secrets while the RLJob waits
    on its finalizer): the Secrets of spec.bus.security and spec.store.credentialsSecret do not exist, so the
    finalizer leaves the topics and the store's objects, names them and how to remove them in a Warning Event,
    and the RLJob goes at once instead of waiting on the Secrets forever."""
    name = unique_job()
    security = {"protocol": "SASL_PLAINTEXT", "saslMechanism": "PLAIN", "secretRef": {"name": f"{name}-kafka"}}
    store = {"uri": f"s3://scalerl-tests/{name}", "endpoint": "http://minio.invalid:9000", "retention": "delete",
             "credentialsSecret": {"name": f"{name}-s3"}}
    with operator(namespace, k8s_env["KUBECONFIG"], monkeypatch):
        create(kube, namespace, rljob(name, bootstrap, bus={"bootstrap": bootstrap, "security": security},
                                      store=store))
        wait_for("the finalizer (the operator handled the RLJob)",
                 lambda: FINALIZER in get_job(kube, namespace, name)["metadata"].get("finalizers", []))
        kube.request("DELETE", f"/apis/scalerl.dev/v1alpha1/namespaces/{namespace}/rljobs/{name}")
        wait_for("the RLJob gone", lambda: get_job(kube, namespace, name) is None, timeout_s=30)
    left = [e["message"] for e in kube.events(namespace, name) if e["reason"] == "CleanupIncomplete"]
    assert len(left) == 2, left  # one Event per thing left behind, in no particular order
    (kafka,) = [m for m in left if "Kafka topics" in m]
    (store,) = [m for m in left if "objects under" in m]
    assert f"left behind Kafka topics and consumer groups {namespace}.{name}.* on {bootstrap}" in kafka
    assert f"Secret {namespace}/{name}-kafka not found" in kafka and "kafka-topics.sh" in kafka
    assert f"Secret {namespace}/{name}-s3 not found" in store
    assert f"aws s3 rm --recursive s3://scalerl-tests/{name}/" in store


def test_killed_mid_reconcile_then_restarted_reaches_the_same_state(
        kube: Kube, namespace: str, bootstrap: str, k8s_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A real process (python -m scalerl_operator) is SIGKILLed as soon as its first child exists;
    the in-process operator then converges to exactly what render() asks for."""
    name = unique_job()
    env = {**os.environ, "KUBECONFIG": k8s_env["KUBECONFIG"]}
    proc = subprocess.Popen([sys.executable, "-m", "scalerl_operator", "--namespace", namespace, "--metrics-port", "0",
                             "--interval-seconds", "0.5", "--log-level", "warning"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        create(kube, namespace, rljob(name, bootstrap))
        wait_for("the first child", lambda: kube.get("v1", "ConfigMap", namespace, f"{name}-spec"), timeout_s=60,
                 every_s=0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        at_kill = len(children(kube, namespace, name))
    finally:
        if proc.poll() is None:
            proc.kill()
    with operator(namespace, k8s_env["KUBECONFIG"], monkeypatch):
        wait_for("all children", lambda: len(children(kube, namespace, name)) == 8)
        j = wait_for("status of the generation", lambda: (j := get_job(kube, namespace, name)) and
                     (j.get("status") or {}).get("observedGeneration") == j["metadata"]["generation"] and j)
    spec = parse_spec(j["spec"])
    want = {f"{o['kind']}/{o['metadata']['name']}": o
            for o in render(name, namespace, spec, desired_replicas(spec, live={}, remembered={}))}
    pdb = want.pop(f"PodDisruptionBudget/{name}-learner")  # the 9th and 10th children, outside children()'s 8
    wait_for("the learner's PodDisruptionBudget",
             lambda: kube.get("policy/v1", "PodDisruptionBudget", namespace, pdb["metadata"]["name"]), timeout_s=60)
    env = want.pop(f"Service/{name}-environment")
    assert wait_for("the headless environment Service", lambda: kube.get(
        "v1", "Service", namespace, env["metadata"]["name"]), timeout_s=60)["spec"]["clusterIP"] == "None"
    got = children(kube, namespace, name)
    assert set(got) == set(want), f"{at_kill} of 8 children existed at the kill"
    for key, o in want.items():
        if "data" in o:
            assert got[key]["data"] == o["data"]
        else:
            for field in ("replicas", "serviceName", "clusterIP"):
                if field in o["spec"]:  # (a normal Service's clusterIP is the server's choice)
                    assert got[key]["spec"][field] == o["spec"][field], (key, field)
            if "template" in o["spec"]:
                mine, theirs = (x["spec"]["template"]["spec"]["containers"][0] for x in (got[key], o))
                assert (mine.get("command"), mine.get("args")) == (theirs.get("command"), theirs.get("args")), key
    assert j["status"]["phase"] == c.PHASE_PENDING
    print(f"\n[operator] {at_kill} of 8 children existed when the first operator was killed")


def test_autoscaler_state_survives_in_the_status(kube: Kube, namespace: str) -> None:
    """What a restarted operator reads back is what the last pass wrote (cool-downs included)."""
    name = unique_job()
    create(kube, namespace, rljob(name, "127.0.0.1:9"))
    t = 1_800_000_000.25
    state = ScalerState(recommendations=(Timed(t, 3), Timed(t + 15, 2)), scale_events=(Timed(t, 2), Timed(t + 15, -1)),
                        last_scale_time_s=t + 15, last_replicas=2, consecutive_failures=1)
    kube.patch_status(namespace, name, {"scaling": {"verifier": {**state.to_status(), "desiredReplicas": 2}}})
    back = get_job(kube, namespace, name)
    assert back is not None
    assert ScalerState.from_status(back["status"]["scaling"]["verifier"]) == state


def test_lease_election_against_the_api_server(kube: Kube, namespace: str) -> None:
    a = LeaderElector(kube, namespace, "scalerl-operator-leader", "op-a", lease_duration_s=3,
                      renew_deadline_s=2.0, retry_period_s=0.2)
    b = LeaderElector(kube, namespace, "scalerl-operator-leader", "op-b", lease_duration_s=3,
                      renew_deadline_s=2.0, retry_period_s=0.2)
    assert a.try_once() is True and b.try_once() is False  # a created it; b sees a valid holder
    assert a.try_once() is True  # renewal
    lease = kube.get("coordination.k8s.io/v1", "Lease", namespace, "scalerl-operator-leader")
    assert lease is not None and lease["spec"]["holderIdentity"] == "op-a"
    a.release()
    assert b.try_once() is True  # released: taken at once
    lease = kube.get("coordination.k8s.io/v1", "Lease", namespace, "scalerl-operator-leader")
    assert lease is not None and lease["spec"]["holderIdentity"] == "op-b" and lease["spec"]["leaseTransitions"] == 1
    # b stops renewing (crashed): a may take over only after the 3 s lease duration
    t0 = time.monotonic()
    assert a.try_once() is False
    wait_for("a's takeover", lambda: a.try_once(), timeout_s=10, every_s=0.2)
    assert time.monotonic() - t0 >= 2.5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _health(port: int) -> tuple[int, str] | None:
    """(code, body) of the operator's /healthz, None while nothing listens."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as reply:
            return int(reply.status), reply.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()
    except OSError:
        return None


def test_two_operator_processes_one_lease(kube: Kube, namespace: str, bootstrap: str, k8s_env: dict[str, str]) -> None:
    """`python -m scalerl_operator --leader-election` twice: only the Lease holder reconciles, the standby's
    /healthz answers 200 (its probes must not kill it); when the leader is killed, the standby takes the
    Lease after its duration and repairs what was changed meanwhile."""
    name = unique_job()
    env = {**os.environ, "KUBECONFIG": k8s_env["KUBECONFIG"]}
    ports = {"op-a": _free_port(), "op-b": _free_port()}

    def start(who: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "scalerl_operator", "--namespace", namespace, "--metrics-port",
                                 "0", "--interval-seconds", "0.5", "--log-level", "warning", "--leader-election",
                                 "--lease-namespace", namespace, "--lease-duration-seconds", "3", "--identity", who,
                                 "--liveness", f"http://127.0.0.1:{ports[who]}/healthz"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def holder() -> str | None:
        lease = kube.get("coordination.k8s.io/v1", "Lease", namespace, "scalerl-operator-leader")
        return None if lease is None else lease["spec"].get("holderIdentity")

    a = start("op-a")
    b = None
    try:
        wait_for("op-a leads", lambda: holder() == "op-a", timeout_s=30)
        wait_for("op-a's kopf ready", lambda: _health(ports["op-a"]) == (200, "leader"), timeout_s=30)
        b = start("op-b")
        create(kube, namespace, rljob(name, bootstrap))
        wait_for("op-a reconciled", lambda: len(children(kube, namespace, name)) == 8, timeout_s=90)
        # the standby is healthy for as long as the leader runs (a startup probe would pass)
        wait_for("op-b serves /healthz", lambda: _health(ports["op-b"]) is not None, timeout_s=30)
        for _ in range(6):
            assert _health(ports["op-b"]) == (200, "standby")
            time.sleep(0.5)
        assert holder() == "op-a" and b.poll() is None  # op-b is alive, waiting
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=10)
        killed = time.monotonic()
        kube.request("DELETE", f"/api/v1/namespaces/{namespace}/services/{name}-verifier")
        wait_for("op-b leads", lambda: holder() == "op-b", timeout_s=30)
        took_over = time.monotonic() - killed
        wait_for("the deleted Service back", lambda: kube.get("v1", "Service", namespace, f"{name}-verifier"),
                 timeout_s=30)
        assert 1.0 <= took_over <= 10.0, f"took over after {took_over:.1f}s (lease 3s)"
        wait_for("op-b reports leader", lambda: _health(ports["op-b"]) == (200, "leader"), timeout_s=30)
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.terminate()
                p.wait(timeout=30)
    assert b is not None and b.returncode == 0  # SIGTERM: clean stop, Lease released
    assert holder() is None
