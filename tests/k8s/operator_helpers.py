"""Shared pieces of the operator tests (test_operator.py, test_autoscale_kafka.py): a real Kafka
fixture (fails when CI is set and the broker is absent, as tests/integration does), the operator
in-process via kopf.testing.KopfRunner, RLJob manifests, polling, and simulated pod readiness (no
kubelet runs: the tests patch the children's /status)."""

from __future__ import annotations

import contextlib
import os
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from kopf.testing import KopfRunner

from infra_session import QUIET_KAFKA  # noqa: F401  (re-exported for the tests here)
from scalerl_operator.api.spec import GROUP, VERSION
from scalerl_operator.cluster.kube import Kube, path
from waiting import wait_for  # noqa: F401  (re-exported for the tests here)

# kafka-python loads its protocol schemas with importlib.resources APIs deprecated in Python 3.11; the
# test modules import it at collection, before any per-test filter applies
warnings.filterwarnings("ignore", "read_text is deprecated", DeprecationWarning)
warnings.filterwarnings("ignore", "open_text is deprecated", DeprecationWarning)

RLJOB = f"{GROUP}/{VERSION}"
INTERVAL_S = 0.5  # the operator's status + autoscaler period in these tests
OPERATOR_IMAGE = "registry.example/scalerl:0.1.0"  # the operator's default image for RLJobs naming none
def kafka_bootstrap(k8s_env: dict[str, str]) -> str:
    """The real broker of build/infra.env; fail (CI) or skip when it does not answer."""
    boot = k8s_env.get("KAFKA_BOOTSTRAP") or os.environ.get("KAFKA_BOOTSTRAP", "")
    problem = None if boot else "build/infra.env lacks KAFKA_BOOTSTRAP"
    if boot:
        from kafka import KafkaAdminClient

        try:
            admin = KafkaAdminClient(bootstrap_servers=boot, request_timeout_ms=5000, client_id="scalerl-k8s-probe")
            admin.list_topics()
            admin.close()
        except Exception as exc:
            problem = f"Kafka at {boot} unreachable: {exc!r}"
    if problem:
        msg = f"real Kafka unavailable: {problem} (start it with scripts/infra/up.sh)"
        if os.environ.get("CI"):
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    return boot


def unique_job() -> str:
    """Topic names are per job name, not per namespace: every test uses a fresh name."""
    return f"op-{uuid.uuid4().hex[:8]}"


def rljob(name: str, bootstrap: str, **spec_over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "job": {"train": {"steps": 20, "prompts_per_step": 4}, "off_policy": {"k": 4}},
        "bus": {"bootstrap": bootstrap, "partitions": 3},
        "store": {"uri": f"s3://scalerl-tests/{name}", "endpoint": "http://minio.invalid:9000",
                  "credentialsSecret": {"name": "s3-creds"}},
        "roles": {"generator": {"replicas": 1}, "verifier": {"replicas": 2}},
    }
    spec.update(spec_over)
    return {"apiVersion": RLJOB, "kind": "RLJob", "metadata": {"name": name}, "spec": spec}


@contextlib.contextmanager
def operator(namespace: str, kubeconfig: str, monkeypatch: pytest.MonkeyPatch, *, interval_s: float = INTERVAL_S,
             workers: int = 4) -> Iterator[KopfRunner]:
    """The operator in-process (kopf run), watching one namespace, with a fast tick (`interval_s`) and
    `workers` threads for the periodic passes."""
    monkeypatch.setenv("KUBECONFIG", kubeconfig)
    # kopf logs in through the kubernetes package, whose default kubeconfig path was fixed from the
    # environment when it was first imported (before this test set KUBECONFIG, unless the shell did)
    from kubernetes.config import kube_config

    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", kubeconfig)
    monkeypatch.setenv("SCALERL_OPERATOR_INTERVAL_S", str(interval_s))
    monkeypatch.setenv("SCALERL_OPERATOR_WORKERS", str(workers))
    with KopfRunner(["run", "--standalone", "--namespace", namespace, "-m", "scalerl_operator.control.handlers"],
                    timeout=60) as runner:
        yield runner


def create(kube: Kube, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
    return kube.request("POST", path(RLJOB, "RLJob", namespace), body=obj)


def get_job(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    return kube.get(RLJOB, "RLJob", namespace, name)


def patch_spec(kube: Kube, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
    return kube.request("PATCH", path(RLJOB, "RLJob", namespace, name), body={"spec": patch},
                        content_type="application/merge-patch+json")


def children(kube: Kube, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    """`Kind/name` -> object of every child the contract names that exists now."""
    out = {}
    for api, kind, suffix in [("v1", "ConfigMap", "spec"), ("apps/v1", "Deployment", "generator"),
                              ("apps/v1", "Deployment", "verifier"), ("apps/v1", "Deployment", "curriculum"),
                              ("apps/v1", "StatefulSet", "learner"), ("v1", "Service", "learner"),
                              ("v1", "Service", "generator"), ("v1", "Service", "verifier")]:
        o = kube.get(api, kind, namespace, f"{name}-{suffix}")
        if o is not None:
            out[f"{kind}/{name}-{suffix}"] = o
    return out


def replicas(kube: Kube, namespace: str, name: str) -> dict[str, int]:
    kids = children(kube, namespace, name)
    return {k.split("-")[-1]: int(o["spec"]["replicas"]) for k, o in kids.items()
            if k.startswith(("Deployment/", "StatefulSet/"))}


def simulate_ready(kube: Kube, namespace: str, name: str) -> None:
    """What the kubelet and the controllers would report: every desired pod ready."""
    for key, o in children(kube, namespace, name).items():
        kind, obj_name = key.split("/")
        if kind not in ("Deployment", "StatefulSet"):
            continue
        n = int(o["spec"]["replicas"])
        status = {"observedGeneration": o["metadata"]["generation"], "replicas": n, "readyReplicas": n,
                  "availableReplicas": n, "updatedReplicas": n}
        if kind == "StatefulSet":
            status.update(currentReplicas=n)
            del status["updatedReplicas"]
        kube.request("PATCH", path("apps/v1", kind, namespace, obj_name, "status"), body={"status": status},
                     content_type="application/merge-patch+json")


def condition(obj: dict[str, Any] | None, type_: str) -> tuple[str, str] | None:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond["type"] == type_:
            return cond["status"], cond["reason"]
    return None


def event_reasons(kube: Kube, namespace: str, name: str) -> list[str]:
    return [e["reason"] for e in kube.events(namespace, name)]
