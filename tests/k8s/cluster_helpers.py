"""Shared pieces of the tests on the Pod-running test cluster (test_cluster_pods.py,
test_cluster_operator.py): roles placed on the fake GPU or CPU nodes, the chart's operator RBAC and a
kubeconfig of its ServiceAccount, and reading pods as the scheduler and kwok left them. Nothing here
patches a status: the controllers and kwok report what the tests wait for."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from operator_helpers import condition, get_job

from scalerl_operator.api import conditions as c
from scalerl_operator.cluster.kube import Kube

Call = Callable[..., tuple[int, Any]]
CHART = Path(__file__).resolve().parents[2] / "helm" / "scalerl"
GPU = "nvidia.com/gpu"
ON_GPU_NODES = {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]}
CPU_ROLE = {"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}
WAIT_S = 60.0  # scheduling and kwok's stages take a second or two; the machine may be loaded
MERGE = "application/merge-patch+json"


def gpu_role(gpus: int, **extra: Any) -> dict[str, Any]:
    return {"resources": {"limits": {GPU: gpus}, "requests": {GPU: gpus, "cpu": "1"}}, **ON_GPU_NODES, **extra}


# ---- the operator as the chart's ServiceAccount --------------------------------------------------------

def _chart_rbac(helm: str, release: str, namespace: str) -> list[dict[str, Any]]:
    proc = subprocess.run([helm, "template", release, str(CHART), "--namespace", namespace, "--kube-version",
                           "v1.34.0", "--set", "operator.scope=namespace"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    # the operator's own: not `helm test`'s identity (component `test`, plain chart objects since the test
    # Pods alone are hooks)
    return [o for o in yaml.safe_load_all(proc.stdout) if o and o["kind"] in ("ServiceAccount", "Role", "RoleBinding")
            and "helm.sh/hook" not in (o["metadata"].get("annotations") or {})
            and (o["metadata"].get("labels") or {}).get("app.kubernetes.io/component") != "test"]


def chart_operator_kubeconfig(call: Call, env: dict[str, str], ns: str, out_dir: Path) -> Path:
    """A kubeconfig holding a TokenRequest token of the chart's operator ServiceAccount, bound by the
    chart's own Role/RoleBinding in namespace `ns` (created here)."""
    release = "scalerl"
    objs = _chart_rbac(env["HELM_BIN"], release, ns)
    assert {o["kind"] for o in objs} == {"ServiceAccount", "Role", "RoleBinding"}
    plural = {"ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
              "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
              "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings"}
    for o in objs:
        status, body = call("POST", plural[o["kind"]].format(ns=o["metadata"].get("namespace", ns)), o)
        assert status == 201, body
    (sa,) = [o["metadata"]["name"] for o in objs if o["kind"] == "ServiceAccount"]
    status, body = call("POST", f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token",
                        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                         "spec": {"expirationSeconds": 3600}})
    assert status == 201, body
    config = yaml.safe_load(Path(env["CLUSTER_KUBECONFIG"]).read_text())
    config["users"] = [{"name": "operator", "user": {"token": body["status"]["token"]}}]
    config["contexts"][0]["context"].update(user="operator", namespace=ns)
    out = out_dir / "operator.kubeconfig"
    out.write_text(yaml.safe_dump(config))
    out.chmod(0o600)
    # the token is the ServiceAccount's, not an admin's
    status, review = call("POST", "/apis/authentication.k8s.io/v1/tokenreviews",
                          {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                           "spec": {"token": body["status"]["token"]}})
    assert status == 201 and review["status"]["user"]["username"] == f"system:serviceaccount:{ns}:{sa}", review
    return out


# ---- reading the cluster -------------------------------------------------------------------------------

def pods(call: Call, ns: str, job: str, role: str | None = None) -> list[dict[str, Any]]:
    """The job's pods (of one role), terminating ones included."""
    sel = f"app.kubernetes.io/instance={job}" + (f",app.kubernetes.io/component={role}" if role else "")
    status, body = call("GET", f"/api/v1/namespaces/{ns}/pods", query={"labelSelector": sel})
    assert status == 200, body
    return list(body["items"])


def by_role(items: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for p in sorted(items, key=lambda p: p["metadata"]["name"]):
        out.setdefault(p["metadata"]["labels"]["app.kubernetes.io/component"], []).append(p)
    return out


def is_ready(pod: dict[str, Any]) -> bool:
    return pod["status"].get("phase") == "Running" and any(
        cond["type"] == "Ready" and cond["status"] == "True" for cond in pod["status"].get("conditions") or [])


def nodes(call: Call, kind: str) -> list[str]:
    status, body = call("GET", "/api/v1/nodes", query={"labelSelector": f"scalerl.dev/fake-node={kind}"})
    assert status == 200 and body["items"], f"no fake {kind} nodes: {body}"
    return sorted(n["metadata"]["name"] for n in body["items"])


def job_ready(kube: Kube, ns: str, name: str) -> dict[str, Any] | None:
    j = get_job(kube, ns, name)
    return j if condition(j, c.READY) == ("True", c.REASON_ALL_ROLES_READY) else None


def all_ready(call: Call, ns: str, name: str, want: dict[str, int]) -> dict[str, list[dict[str, Any]]] | None:
    """The job's pods by role once exactly `want` pods per role exist and all are Running and Ready."""
    roles = by_role([p for p in pods(call, ns, name) if not p["metadata"].get("deletionTimestamp")])
    counts = {r: len(v) for r, v in roles.items()}
    return roles if counts == want and all(is_ready(p) for v in roles.values() for p in v) else None
