"""The operator through the test broker's SASL_SSL listener (SCRAM-SHA-512 + TLS with the test CA): an
RLJob whose spec.bus.security names a Secret gets its topics created, its lag read into status and its
topics deleted by the finalizer, all with the credentials read from that Secret; a wrong password is a
clear error naming SASL, not a hang. The operator runs in-process (KopfRunner) on the real API server."""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path
from typing import Any

import pytest
from operator_helpers import QUIET_KAFKA, create, get_job, operator, rljob, unique_job

from infra_session import sasl_bus, sasl_listener
from scalerl.bus.kafka import KafkaBus
from scalerl.bus.security import KafkaConnectError
from scalerl_operator.api.spec import RLJobSpec
from scalerl_operator.cluster.kafka_access import kafka_security
from scalerl_operator.cluster.kube import Kube, path
from scalerl_operator.render.names import bus_prefix

pytestmark = [*QUIET_KAFKA, pytest.mark.infra]


@pytest.fixture
def sasl(k8s_env: dict[str, str]) -> dict[str, str]:
    return sasl_listener(lambda k: k8s_env.get(k) or os.environ.get(k))


def _secret(kube: Kube, namespace: str, sasl: dict[str, str], password: str) -> None:
    ca = Path(sasl["KAFKA_SSL_CAFILE"]).read_text()

    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    kube.request("POST", path("v1", "Secret", namespace), body={
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "kafka-auth"},
        "data": {"user": b64(sasl["KAFKA_SASL_USERNAME"]), "pass": b64(password), "ca.crt": b64(ca)}})


def _security(sasl: dict[str, str]) -> dict[str, Any]:
    return {"protocol": "SASL_SSL", "saslMechanism": sasl["KAFKA_SASL_MECHANISM"],
            "secretRef": {"name": "kafka-auth", "usernameKey": "user", "passwordKey": "pass", "caKey": "ca.crt"}}


def _wait(what: str, fn: Any, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if out := fn():
            return out
        time.sleep(0.3)
    raise AssertionError(f"{what}: not within {timeout_s:.0f}s")


def test_operator_creates_reads_lag_and_cleans_up_through_sasl_ssl(kube, namespace, k8s_env, sasl, monkeypatch):
    _secret(kube, namespace, sasl, sasl["KAFKA_SASL_PASSWORD"])
    name = unique_job()
    prefix = bus_prefix(name, namespace)
    bus = sasl_bus(sasl)
    try:
        with operator(namespace, k8s_env["KUBECONFIG"], monkeypatch) as runner:
            create(kube, namespace, rljob(name, sasl["KAFKA_SASL_BOOTSTRAP"],
                                          bus={"bootstrap": sasl["KAFKA_SASL_BOOTSTRAP"], "partitions": 2,
                                               "security": _security(sasl)}))
            topics = _wait("the job's topics on the SASL_SSL listener",
                           lambda: [t for t in bus.list_topics(f"{prefix}.") if t.endswith(".rollouts")])
            assert topics == [f"{prefix}.rollouts"]
            assert bus.partitions(f"{prefix}.rollouts") == [0, 1]
            n = 7  # records nobody consumed: the verifiers' lag on rollouts
            for i in range(n):
                bus.publish_raw(f"{prefix}.rollouts", f"r{i}".encode(), key=f"p{i}".encode())
            bus.flush(10)
            status = _wait("status.lag of rollouts = 7", lambda: (
                (get_job(kube, namespace, name) or {}).get("status", {}).get("lag", {}).get(f"{prefix}.rollouts")
                == n and get_job(kube, namespace, name)))
            assert status["status"]["lagTotal"] >= n
            # pods get the credentials as secretKeyRefs and the CA as a mounted file, never the values
            dep = kube.get("apps/v1", "Deployment", namespace, f"{name}-verifier")
            pod = dep["spec"]["template"]["spec"]
            env = {e["name"]: e for e in pod["containers"][0]["env"]}
            assert env["SCALERL_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "kafka-auth",
                                                                                      "key": "pass"}
            assert sasl["KAFKA_SASL_PASSWORD"] not in str(dep)
            assert env["SCALERL_KAFKA_SSL_CAFILE"]["value"] == "/etc/scalerl/kafka-ca/ca.crt"
            kube.request("DELETE", path("scalerl.dev/v1alpha1", "RLJob", namespace, name))
            _wait("the RLJob gone (finalizer done)", lambda: get_job(kube, namespace, name) is None, 90)
            assert bus.list_topics(f"{prefix}.") == []
        assert runner.exception is None  # read once kopf stopped (it waits for the run to end)
    finally:
        bus.close()


def test_wrong_password_in_the_secret_is_a_clear_error(kube, namespace, sasl):
    _secret(kube, namespace, sasl, "not-the-password")
    spec = RLJobSpec.model_validate(rljob("x", sasl["KAFKA_SASL_BOOTSTRAP"], bus={
        "bootstrap": sasl["KAFKA_SASL_BOOTSTRAP"], "security": _security(sasl)})["spec"])
    security = kafka_security(kube, namespace, spec.bus)
    assert security.password == "not-the-password" and security.ca_data.startswith("-----BEGIN CERTIFICATE")
    t0 = time.monotonic()
    bad = KafkaBus(spec.bus.bootstrap, request_timeout_s=5, security=security)
    with pytest.raises(KafkaConnectError, match=r"SASL SCRAM-SHA-512 authentication as 'scalerl' failed"):
        bad.list_topics()
    assert time.monotonic() - t0 < 20
    bad.close()
