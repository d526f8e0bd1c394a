"""Fixtures for tests against the real kube-apiserver + etcd of scripts/infra/up.sh (service `k8s`) and
the Pod-running cluster beside it (service `cluster`).

`k8s` (session): a kubernetes `ApiClient` for the test API server, from the kubeconfig that
build/infra.env names (KUBECONFIG). If the file is missing or the server does not answer /readyz, the
fixture runs `scripts/infra/up.sh k8s` (which builds etcd, kube-apiserver and helm into the cache on
first use) and stops the servers again at the end of the session (SCALERL_INFRA_KEEP=1 keeps them;
SCALERL_INFRA_AUTOSTART=0 never starts anything). When the server still cannot be reached, the tests
FAIL if CI is set (never a silent skip in CI) and are skipped otherwise — tests/infra_session.py,
shared with tests/integration/conftest.py.

`namespace`: a fresh namespace per test, removed afterwards (no namespace controller runs here, so
the fixture deletes the namespace's RLJobs and then finalizes the namespace itself).
`operator_default_image` (autouse): SCALERL_DEFAULT_IMAGE set, as the chart sets it for the operator.
`rljob_crd` (session): the RLJob CRD of scalerl_operator.api.crd applied server-side and Established.
`k8s_call(method, path, body=None, ...)` (session): a raw request through that client (Table views,
/status, merge and apply patches) returning (HTTP status, decoded JSON).

On that API server no kubelet, scheduler or controllers run: Deployments get no pods and nothing is
garbage-collected (tests patch status to fake readiness).

The Pod-running cluster (scripts/infra/cluster.sh; build/infra.env's CLUSTER_KUBECONFIG): a second
kube-apiserver on the same etcd with kube-scheduler, kube-controller-manager (deployment, replicaset,
statefulset, job, garbage-collector, namespace, node-lifecycle, taint-eviction, ... controllers) and
kwok faking the kubelets of three Nodes: gpu-node-0 and gpu-node-1 (8 `nvidia.com/gpu` each, the GPU
feature-discovery labels, taint `nvidia.com/gpu=present:NoSchedule`) and cpu-node-0. Pods get scheduled,
become Running and Ready (kwok's stages), owners' deletions cascade; no container ever runs.
`cluster_env` / `cluster` (session): its build/infra.env values and an admin ApiClient (started with
`scripts/infra/up.sh k8s cluster` when absent, like `k8s`). `cluster_call` / `cluster_crd` (session):
as `k8s_call` / `rljob_crd`, there. `cluster_namespace`: a fresh namespace there with its `default`
ServiceAccount (the ServiceAccount admission plugin is on), removed afterwards once its pods are gone.
`cluster_kube` / `cluster_bootstrap`: as `kube` / `bootstrap`, for the tests there. `cluster_operator`:
the operator in-process, watching `cluster_namespace`, logged in as the chart's operator ServiceAccount
(a TokenRequest token; the chart's namespaced Role and RoleBinding applied there).

`operator_kubeconfig`: a kubeconfig of the chart's operator ServiceAccount (TokenRequest token), bound by
the chart's namespaced Role in `cluster_namespace`, for an operator that runs with the chart's RBAC.
`kueue_env` (session): Kueue's controller manager running against that cluster (scripts/infra/kueue.sh;
started with `scripts/infra/up.sh kueue` when absent and SCALERL_INFRA_AUTOSTART allows, like `k8s`):
its KUEUE_* values (`kueue.sh env`, which reads this checkout's state, so a manager started by
`scripts/infra/kueue.sh up` is found even where build/infra.env was written elsewhere).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from infra_session import ENV_FILE, REPO, read_env_file, running_servers, time_first_setup

UP_TIMEOUT_S = float(os.environ.get("SCALERL_INFRA_UP_TIMEOUT", "3000"))  # a cold kube-apiserver build
FIELD_MANAGER = "scalerl-tests"
CRD_ESTABLISHED_TIMEOUT_S = 30.0
NAMESPACE_DRAIN_TIMEOUT_S = 60.0


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    time_first_setup(items, here, "k8s", UP_TIMEOUT_S + 300)
    time_first_setup(items, here, "cluster_env", UP_TIMEOUT_S + 300)  # scheduler, controller-manager, kwok
    time_first_setup(items, here, "kueue_env", UP_TIMEOUT_S + 300)  # a cold build of Kueue's manager
    time_first_setup(items, here, "certmanager_env", UP_TIMEOUT_S + 300)  # a cold build of cert-manager's


def k8s_request(api: Any, method: str, path: str, body: Any = None, *, query: dict[str, str] | None = None,
                content_type: str = "application/json", accept: str = "application/json",
                timeout_s: float = 30.0) -> tuple[int, Any]:
    """One request to the API server through `api`'s connection and credentials: (status, JSON body)."""
    headers = {"Accept": accept}
    if body is not None:
        headers["Content-Type"] = content_type
    method, url, headers, data, _ = api.param_serialize(
        method=method, resource_path=path, query_params=list((query or {}).items()), header_params=headers,
        body=body, auth_settings=["BearerToken"])
    resp = api.call_api(method, url, header_params=headers, body=data, _request_timeout=timeout_s)
    raw = resp.read()
    try:
        decoded = json.loads(raw) if raw else None
    except ValueError:
        decoded = raw.decode(errors="replace")
    return resp.status, decoded


def _problem(values: dict[str, str]) -> str | None:
    kubeconfig = values.get("KUBECONFIG")
    if not kubeconfig:
        return f"{ENV_FILE} lacks KUBECONFIG"
    if not Path(kubeconfig).exists():
        return f"kubeconfig {kubeconfig} does not exist"
    try:
        from kubernetes.config import new_client_from_config
    except ImportError:
        return "the kubernetes client is not installed (pip install -e '.[operator]')"
    try:
        api = new_client_from_config(config_file=kubeconfig)
        try:
            status, body = k8s_request(api, "GET", "/readyz", accept="text/plain", timeout_s=5)
        finally:
            api.close()
    except Exception as exc:
        return f"kube-apiserver at {values.get('K8S_API')} unreachable: {exc!r}"
    return None if status == 200 else f"kube-apiserver /readyz answered HTTP {status}: {body!r}"


@pytest.fixture(scope="session")
def k8s_env() -> Iterator[dict[str, str]]:
    """build/infra.env of a running API server (KUBECONFIG, K8S_API, HELM_BIN, ...)."""
    with running_servers("test kube-apiserver", ("k8s",), _problem, UP_TIMEOUT_S) as values:
        yield values


@pytest.fixture(scope="session")
def k8s(k8s_env: dict[str, str]) -> Iterator[Any]:
    """A kubernetes ApiClient for the test API server."""
    from kubernetes.config import new_client_from_config

    api = new_client_from_config(config_file=k8s_env["KUBECONFIG"])
    try:
        yield api
    finally:
        api.close()


@pytest.fixture(scope="session")
def k8s_call(k8s: Any) -> Callable[..., tuple[int, Any]]:
    """`k8s_call(method, path, body=None, query=..., content_type=..., accept=...)` -> (status, JSON)."""

    def call(method: str, path: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
        return k8s_request(k8s, method, path, body, **kwargs)

    return call


def apply_rljob_crd(api: Any) -> dict[str, Any]:
    """The RLJob CRD applied (server-side apply, so a changed schema replaces the old), Established and
    served by discovery."""
    from scalerl_operator.api.crd import CRD_NAME, crd
    from scalerl_operator.api.spec import GROUP, PLURAL, VERSION

    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}"
    status, body = k8s_request(api, "PATCH", path, crd(), content_type="application/apply-patch+yaml",
                               query={"fieldManager": FIELD_MANAGER, "force": "true"})
    assert status in (200, 201), f"applying the RLJob CRD failed (HTTP {status}): {body}"
    deadline = time.monotonic() + CRD_ESTABLISHED_TIMEOUT_S
    while time.monotonic() < deadline:
        status, body = k8s_request(api, "GET", path)
        conds = {c["type"]: c["status"] for c in (body.get("status") or {}).get("conditions") or []}
        if conds.get("Established") == "True" and conds.get("NamesAccepted") == "True":
            # discovery lags Established by a moment on a fresh server; clients (kopf) need it
            served, discovery = k8s_request(api, "GET", f"/apis/{GROUP}/{VERSION}")
            if served == 200 and any(r["name"] == PLURAL for r in discovery.get("resources", [])):
                return dict(body)
        time.sleep(0.2)
    raise AssertionError(f"CRD {CRD_NAME} not Established and served after {CRD_ESTABLISHED_TIMEOUT_S:.0f}s: "
                         f"{body}")


@pytest.fixture(scope="session")
def rljob_crd(k8s: Any) -> dict[str, Any]:
    """The RLJob CRD on the test API server."""
    return apply_rljob_crd(k8s)


@pytest.fixture(autouse=True)
def operator_default_image(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's default image for RLJobs naming none, as the chart always sets it (the operator
    in-process and the operator subprocesses the tests start inherit it); tests of the unset case
    delete it."""
    from operator_helpers import OPERATOR_IMAGE

    monkeypatch.setenv("SCALERL_DEFAULT_IMAGE", OPERATOR_IMAGE)
    # cert-manager's CRDs, once installed on this shared API server (the `certmanager` fixture), stay there:
    # "auto" would then send every later test's jobs to cert-manager; its tests set the mode they test
    monkeypatch.setenv("SCALERL_RPC_CERTIFICATES", "operator")


@pytest.fixture
def namespace(k8s: Any) -> Iterator[str]:
    """A fresh namespace for one test; its RLJobs and the namespace are removed afterwards."""
    name = _create_namespace(k8s)
    try:
        yield name
    finally:
        _remove_namespace(k8s, name)


def _create_namespace(api: Any) -> str:
    name = f"t-{uuid.uuid4().hex[:12]}"
    status, body = k8s_request(api, "POST", "/api/v1/namespaces",
                               {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    assert status == 201, f"creating namespace {name} failed (HTTP {status}): {body}"
    return name


# ---- the Pod-running cluster ----------------------------------------------------------------------------

def _cluster_problem(values: dict[str, str]) -> str | None:
    kubeconfig = values.get("CLUSTER_KUBECONFIG")
    if not kubeconfig:
        return f"{ENV_FILE} lacks CLUSTER_KUBECONFIG"
    return _problem({"KUBECONFIG": kubeconfig, "K8S_API": values.get("CLUSTER_API", "")})


@pytest.fixture(scope="session")
def cluster_env() -> Iterator[dict[str, str]]:
    """build/infra.env of a running Pod-running cluster (CLUSTER_KUBECONFIG, CLUSTER_API, ...)."""
    # up.sh starts k8s with the cluster (its etcd); what this session starts, it stops: the bare API
    # server only when it was not running before
    services = ("cluster",) if _problem(read_env_file()) is None else ("k8s", "cluster")
    with running_servers("Pod-running test cluster", services, _cluster_problem, UP_TIMEOUT_S) as values:
        yield values


@pytest.fixture(scope="session")
def cluster(cluster_env: dict[str, str]) -> Iterator[Any]:
    """An admin ApiClient for the Pod-running cluster."""
    from kubernetes.config import new_client_from_config

    api = new_client_from_config(config_file=cluster_env["CLUSTER_KUBECONFIG"])
    try:
        yield api
    finally:
        api.close()


@pytest.fixture(scope="session")
def cluster_call(cluster: Any) -> Callable[..., tuple[int, Any]]:
    """As `k8s_call`, on the Pod-running cluster."""

    def call(method: str, path: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
        return k8s_request(cluster, method, path, body, **kwargs)

    return call


@pytest.fixture(scope="session")
def cluster_crd(cluster: Any) -> dict[str, Any]:
    """The RLJob CRD on the Pod-running cluster."""
    return apply_rljob_crd(cluster)


def kueue_values(cluster_kubeconfig: str) -> dict[str, str]:
    """KUEUE_* of the manager this checkout runs (`scripts/infra/kueue.sh env`; empty when none runs)."""
    proc = subprocess.run(["bash", str(REPO / "scripts" / "infra" / "kueue.sh"), "env"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "CLUSTER_KUBECONFIG": cluster_kubeconfig})
    return dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)


def _kueue_problem(values: dict[str, str]) -> str | None:
    if (problem := _cluster_problem(values)) is not None:
        return problem
    kueue = kueue_values(values["CLUSTER_KUBECONFIG"])
    if not kueue.get("KUEUE_PID"):
        return "Kueue's controller manager is not running (scripts/infra/kueue.sh up)"
    if Path(kueue["KUEUE_KUBECONFIG"]).resolve() != Path(values["CLUSTER_KUBECONFIG"]).resolve():
        return f"Kueue watches {kueue['KUEUE_KUBECONFIG']}, not the test cluster {values['CLUSTER_KUBECONFIG']}"
    return None


@pytest.fixture(scope="session")
def kueue_env(cluster_env: dict[str, str]) -> Iterator[dict[str, str]]:
    """Kueue's manager on the Pod-running cluster: cluster_env plus KUEUE_VERSION, KUEUE_LOG, ..."""
    with running_servers("Kueue's controller manager", ("kueue",), _kueue_problem, UP_TIMEOUT_S) as values:
        yield {**values, **kueue_values(values["CLUSTER_KUBECONFIG"])}


def _certmanager_problem(values: dict[str, str]) -> str | None:
    if (problem := _problem(values)) is not None:
        return problem
    if not values.get("CERTMANAGER_PID"):
        return "cert-manager's controllers are not running (scripts/infra/up.sh certmanager)"
    if Path(values.get("CERTMANAGER_KUBECONFIG", "")).resolve() != Path(values["KUBECONFIG"]).resolve():
        return (f"cert-manager watches {values.get('CERTMANAGER_KUBECONFIG')}, "
                f"not the test API server {values['KUBECONFIG']}")
    return None


@pytest.fixture(scope="session")
def certmanager_env(k8s_env: dict[str, str]) -> Iterator[dict[str, str]]:
    """cert-manager's certificate controllers on the test API server, its CRDs installed there:
    k8s_env plus CERTMANAGER_VERSION, CERTMANAGER_LOG, ..."""
    with running_servers("cert-manager's controllers", ("certmanager",), _certmanager_problem, UP_TIMEOUT_S) as values:
        yield values


@pytest.fixture
def cluster_namespace(cluster: Any) -> Iterator[str]:
    """A fresh namespace on the Pod-running cluster, once its `default` ServiceAccount exists (pods are
    refused before); its RLJobs and the namespace are removed afterwards."""
    name = _create_namespace(cluster)
    try:
        deadline = time.monotonic() + CRD_ESTABLISHED_TIMEOUT_S
        while k8s_request(cluster, "GET", f"/api/v1/namespaces/{name}/serviceaccounts/default")[0] != 200:
            assert time.monotonic() < deadline, f"no default ServiceAccount in {name} after " \
                                                f"{CRD_ESTABLISHED_TIMEOUT_S:.0f}s: is the controller-manager up?"
            time.sleep(0.2)
        yield name
    finally:
        _remove_namespace(cluster, name)
        # the namespace controller deletes its pods (kwok removes them at once): wait, so the next test
        # finds every GPU free
        deadline = time.monotonic() + NAMESPACE_DRAIN_TIMEOUT_S
        while time.monotonic() < deadline:
            status, body = k8s_request(cluster, "GET", f"/api/v1/namespaces/{name}/pods")
            if status == 404 or (status == 200 and not body["items"]):
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"pods of namespace {name} still there after {NAMESPACE_DRAIN_TIMEOUT_S:.0f}s")


# ---- the operator as the chart's ServiceAccount -----------------------------------------------------

@pytest.fixture
def operator_kubeconfig(cluster_call: Callable[..., tuple[int, Any]], cluster_env: dict[str, str],
                        cluster_crd: dict[str, Any], cluster_namespace: str, tmp_path: Path) -> Path:
    """A kubeconfig holding a TokenRequest token of the chart's operator ServiceAccount, bound by the
    chart's own Role/RoleBinding in the test namespace."""
    from cluster_helpers import chart_operator_kubeconfig

    return chart_operator_kubeconfig(cluster_call, cluster_env, cluster_namespace, tmp_path)


NAMESPACED_COLLECTIONS = (
    "/api/v1/namespaces/{ns}/services", "/api/v1/namespaces/{ns}/configmaps", "/api/v1/namespaces/{ns}/secrets",
    "/api/v1/namespaces/{ns}/events", "/apis/apps/v1/namespaces/{ns}/deployments",
    "/apis/apps/v1/namespaces/{ns}/statefulsets", "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
    "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "/api/v1/namespaces/{ns}/serviceaccounts",
)


def _remove_namespace(api: Any, name: str) -> None:
    from scalerl_operator.api.spec import GROUP, PLURAL, VERSION

    # RLJobs may carry the operator's finalizer; with no operator left running, drop it first.
    status, body = k8s_request(api, "GET", f"/apis/{GROUP}/{VERSION}/namespaces/{name}/{PLURAL}")
    for item in (body or {}).get("items", []) if status == 200 else []:
        obj = f"/apis/{GROUP}/{VERSION}/namespaces/{name}/{PLURAL}/{item['metadata']['name']}"
        if item["metadata"].get("finalizers"):
            k8s_request(api, "PATCH", obj, {"metadata": {"finalizers": None}},
                        content_type="application/merge-patch+json")
        k8s_request(api, "DELETE", obj)
    # No namespace controller (and no garbage collector) either: delete what the tests and the operator
    # created, else it stays in etcd, and Services keep their ClusterIPs until the range runs out.
    for collection in NAMESPACED_COLLECTIONS:
        k8s_request(api, "DELETE", collection.format(ns=name))
    k8s_request(api, "DELETE", f"/api/v1/namespaces/{name}")
    # No namespace controller: remove the `kubernetes` finalizer so the namespace goes away.
    status, ns = k8s_request(api, "GET", f"/api/v1/namespaces/{name}")
    if status == 200:
        ns["spec"] = {"finalizers": []}
        k8s_request(api, "PUT", f"/api/v1/namespaces/{name}/finalize", ns)


@pytest.fixture
def kube(k8s: Any, rljob_crd: dict[str, Any]) -> Any:
    """The operator's API client over the test API server (the RLJob CRD applied)."""
    from scalerl_operator.cluster.kube import Kube

    return Kube(k8s)


@pytest.fixture
def bootstrap(k8s_env: dict[str, str]) -> str:
    """The test broker's PLAINTEXT bootstrap address."""
    from operator_helpers import kafka_bootstrap

    return kafka_bootstrap(k8s_env)


@pytest.fixture
def cluster_kube(cluster: Any, cluster_crd: dict[str, Any]) -> Any:
    """The operator's API client over the Pod-running cluster (the RLJob CRD applied)."""
    from scalerl_operator.cluster.kube import Kube

    return Kube(cluster)


@pytest.fixture
def cluster_bootstrap(cluster_env: dict[str, str]) -> str:
    """The test broker's PLAINTEXT bootstrap address, for the RLJobs on the Pod-running cluster."""
    from operator_helpers import kafka_bootstrap

    return kafka_bootstrap(cluster_env)


@pytest.fixture
def cluster_operator(cluster_namespace: str, operator_kubeconfig: Path,
                     monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The operator in-process on the Pod-running cluster, as the chart's ServiceAccount."""
    from operator_helpers import operator

    with operator(cluster_namespace, str(operator_kubeconfig), monkeypatch):
        yield
