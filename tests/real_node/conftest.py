"""Fixtures for the tests on the real node of scripts/infra/up.sh (service `node`, scripts/infra/node.sh):
a kubelet with containerd, runc and a CNI bridge running Pods of the project's image for real, beside
its own kube-apiserver (on the host's address, so Pods reach it), scheduler, controller-manager,
kube-proxy and CoreDNS behind the kube-dns Service; the node advertises fake GPUs.

`node_env` (session): build/infra.env's NODE_* values once the node is Ready (started with
`scripts/infra/up.sh node` when absent: it builds the image and the Kubernetes binaries on first use;
the tests FAIL in CI and skip elsewhere when it cannot be started, tests/infra_session.py).
`node_core` (session): a CoreV1Api logged in as the admin. `node_namespace`: a fresh namespace that
enforces the `restricted` Pod Security Standard, deleted afterwards (the namespace controller runs).
`kubectl`: the kubectl a user runs (built from the same Kubernetes release), on the node's kubeconfig.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from infra_session import ENV_FILE, read_env_file, running_servers, time_first_setup

# a cold run builds the image (~20 min) and the kubelet beside the other servers
UP_TIMEOUT_S = float(os.environ.get("SCALERL_INFRA_UP_TIMEOUT", "3000"))
NAMESPACE_GONE_TIMEOUT_S = 120.0
SCRAPE_TOKEN_SECRET = "test-prometheus-scrape-token"  # holds build/infra/prometheus/scrape-token


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    time_first_setup(items, Path(__file__).resolve().parent, "node_env", UP_TIMEOUT_S + 300)


def _node_problem(values: dict[str, str]) -> str | None:
    kubeconfig = values.get("NODE_KUBECONFIG")
    if not kubeconfig or not Path(kubeconfig).exists():
        return f"{ENV_FILE} names no real node (NODE_KUBECONFIG)"
    try:
        from kubernetes import client
        from kubernetes.config import new_client_from_config

        api = new_client_from_config(config_file=kubeconfig)
        try:
            node = client.CoreV1Api(api).read_node(values["NODE_NAME"], _request_timeout=5)
        finally:
            api.close()
    except Exception as exc:
        return f"the real node's API server at {values.get('NODE_API')} did not answer: {exc!r}"
    ready = [c for c in node.status.conditions or [] if c.type == "Ready" and c.status == "True"]
    return None if ready else f"node {values['NODE_NAME']} is not Ready"


@pytest.fixture(scope="session")
def node_env() -> Iterator[dict[str, str]]:
    """build/infra.env of a running real node (NODE_KUBECONFIG, NODE_API, NODE_IMAGE, NODE_HOST_IP, ...)."""
    values = read_env_file()
    services = ("node",) if values.get("KUBECONFIG") and Path(values["KUBECONFIG"]).exists() else ("k8s", "node")
    with running_servers("real test node", services, _node_problem, UP_TIMEOUT_S) as env:
        yield env


@pytest.fixture(scope="session")
def node_api(node_env: dict[str, str]) -> Iterator[Any]:
    from kubernetes.config import new_client_from_config

    api = new_client_from_config(config_file=node_env["NODE_KUBECONFIG"])
    try:
        yield api
    finally:
        api.close()


@pytest.fixture(scope="session")
def node_core(node_api: Any) -> Any:
    from kubernetes import client

    return client.CoreV1Api(node_api)


@pytest.fixture
def node_namespace(node_core: Any) -> Iterator[str]:
    """A fresh namespace enforcing Pod Security `restricted`; deleted (with its Pods) afterwards."""
    name = f"rn-{uuid.uuid4().hex[:10]}"
    node_core.create_namespace({"metadata": {"name": name, "labels": {
        "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}})
    try:
        yield name
    finally:
        node_core.delete_namespace(name, grace_period_seconds=0)
        deadline = time.monotonic() + NAMESPACE_GONE_TIMEOUT_S
        while time.monotonic() < deadline:
            if not node_core.list_namespace(field_selector=f"metadata.name={name}").items:
                break
            time.sleep(0.5)


@pytest.fixture(scope="session")
def kubectl(node_env: dict[str, str]) -> Callable[..., subprocess.CompletedProcess[str]]:
    """`kubectl(*args, input=None, check=True)`: the node's kubectl on its kubeconfig."""

    def run(*args: str, input: str | None = None, check: bool = True,
            timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([node_env["KUBECTL_BIN"], "--kubeconfig", node_env["NODE_KUBECONFIG"], *args],
                              input=input, capture_output=True, text=True, timeout=timeout_s)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    return run


@pytest.fixture(scope="session")
def chart(node_env: dict[str, str], kubectl: Callable[..., Any]) -> Iterator[dict[str, Any]]:
    """The chart installed as a user does (`helm upgrade --install ... --wait`: CRD, RBAC, the operator a
    Deployment of our image), after the test servers are exposed as Services (rljob_helpers.expose_infra);
    uninstalled at the end of the session."""
    from rljob_helpers import RELEASE, REPO, SYSTEM_NS, expose_infra

    expose_infra(kubectl, node_env)
    deadline = time.monotonic() + NAMESPACE_GONE_TIMEOUT_S  # an earlier session's, still being deleted
    while kubectl("get", "namespace", SYSTEM_NS, check=False).returncode == 0 and time.monotonic() < deadline:
        if "Terminating" not in kubectl("get", "namespace", SYSTEM_NS, check=False).stdout:
            break
        time.sleep(1.0)
    repo, _, tag = node_env["NODE_IMAGE"].rpartition(":")
    helm = [node_env["HELM_BIN"], "--kubeconfig", node_env["NODE_KUBECONFIG"], "-n", SYSTEM_NS]
    token = []  # the roles' /metrics ask for the test Prometheus's scrape token, given as a Secret of ours
    if node_env.get("PROMETHEUS_SCRAPE_TOKEN_FILE"):
        kubectl("create", "namespace", SYSTEM_NS, check=False)
        secret = kubectl("create", "secret", "generic", SCRAPE_TOKEN_SECRET, "-n", SYSTEM_NS,
                         f"--from-file=token={node_env['PROMETHEUS_SCRAPE_TOKEN_FILE']}", "--dry-run=client",
                         "-o", "yaml").stdout
        kubectl("apply", "-f", "-", input=secret)
        token = ["--set", f"metrics.scrapeToken.existingSecret={SCRAPE_TOKEN_SECRET}"]
    t0 = time.monotonic()
    proc = subprocess.run([*helm, "upgrade", "--install", RELEASE, str(REPO / "helm" / "scalerl"), "--create-namespace",
                           "--set", f"image.repository={repo}", "--set", f"image.tag={tag}",
                           "--set", "image.pullPolicy=Never", "--set", "operator.intervalSeconds=3", *token,
                           "--wait", "--timeout", "180s"], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"helm install failed: {proc.stderr}"
    yield {"helm": helm, "install_s": time.monotonic() - t0}
    subprocess.run([*helm, "uninstall", RELEASE, "--wait", "--timeout", "120s"], capture_output=True, timeout=180)
    kubectl("delete", "namespace", SYSTEM_NS, "--wait=false", check=False)  # and the `helm test` Pods it keeps
