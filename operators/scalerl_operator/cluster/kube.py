"""A thin, dict-in / dict-out layer over the Kubernetes REST API (the `kubernetes` client's transport:
its configuration, authentication and TLS, without its generated models).

Why raw paths: the operator handles a handful of kinds (ConfigMap, Service, Deployment, StatefulSet,
RLJob, Event, Lease) as the plain dicts `render` produces and applies them with server-side apply;
one `request` with a path table keeps that uniform, where the generated
per-kind methods would convert to and from model classes at every call.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

from kubernetes import client, config

from scalerl_operator.api.conditions import rfc3339
from scalerl_operator.api.spec import GROUP, PLURAL, VERSION

FIELD_MANAGER = "scalerl-operator"
APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
TIMEOUT_S = 30.0

_COLLECTIONS = {
    ("v1", "ConfigMap"): "/api/v1/namespaces/{ns}/configmaps",
    ("v1", "Service"): "/api/v1/namespaces/{ns}/services",
    ("v1", "Event"): "/api/v1/namespaces/{ns}/events",
    ("v1", "Pod"): "/api/v1/namespaces/{ns}/pods",
    ("v1", "Secret"): "/api/v1/namespaces/{ns}/secrets",  # by name: store.credentialsSecret, the rpc certificates
    ("apps/v1", "Deployment"): "/apis/apps/v1/namespaces/{ns}/deployments",
    ("apps/v1", "StatefulSet"): "/apis/apps/v1/namespaces/{ns}/statefulsets",
    ("policy/v1", "PodDisruptionBudget"): "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
    ("networking.k8s.io/v1", "NetworkPolicy"): "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
    ("coordination.k8s.io/v1", "Lease"): "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
    (f"{GROUP}/{VERSION}", "RLJob"): f"/apis/{GROUP}/{VERSION}/namespaces/{{ns}}/{PLURAL}",
    # Kueue (scalerl_operator.control.kueue); the last three are cluster-scoped (read by name, namespace "")
    ("kueue.x-k8s.io/v1beta2", "Workload"): "/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}/workloads",
    ("kueue.x-k8s.io/v1beta2", "ResourceFlavor"): "/apis/kueue.x-k8s.io/v1beta2/resourceflavors",
    ("kueue.x-k8s.io/v1beta2", "WorkloadPriorityClass"): "/apis/kueue.x-k8s.io/v1beta2/workloadpriorityclasses",
    ("scheduling.k8s.io/v1", "PriorityClass"): "/apis/scheduling.k8s.io/v1/priorityclasses",
    # cert-manager (scalerl_operator.control.rpc_certmanager)
    ("cert-manager.io/v1", "Certificate"): "/apis/cert-manager.io/v1/namespaces/{ns}/certificates",
    ("cert-manager.io/v1", "Issuer"): "/apis/cert-manager.io/v1/namespaces/{ns}/issuers",
}


class KubeError(RuntimeError):
    """An API call answered with an error status (`status`, `reason`, the server's `message`)."""

    def __init__(self, status: int, reason: str, message: str, where: str) -> None:
        super().__init__(f"{where}: HTTP {status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


def path(api_version: str, kind: str, namespace: str, name: str | None = None, sub: str | None = None) -> str:
    try:
        base = _COLLECTIONS[(api_version, kind)].format(ns=quote(namespace, safe=""))
    except KeyError:
        raise ValueError(f"kind {api_version}/{kind}: the operator does not manage it") from None
    return base + (f"/{quote(name, safe='')}" if name else "") + (f"/{sub}" if sub else "")


def load_client(kubeconfig: str | None = None) -> client.ApiClient:
    """An ApiClient from the pod's service account, else from KUBECONFIG / ~/.kube/config."""
    cfg = client.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=cfg)
    else:
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    return client.ApiClient(cfg)


@dataclass
class Kube:
    """The operator's handle on the API server."""

    api: client.ApiClient
    timeout_s: float = TIMEOUT_S

    def request(self, method: str, url_path: str, *, body: Any = None, query: dict[str, str] | None = None,
                content_type: str = "application/json") -> dict[str, Any]:
        """One call; returns the decoded JSON answer, raises KubeError on an error status."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        _, url, headers, _, _ = self.api.param_serialize(method=method, resource_path=url_path,
                                                         header_params=headers, auth_settings=["BearerToken"])
        if query:
            url += "?" + urlencode(query)
        # the transport serialises a dict body as JSON, for the apply (YAML) content type too
        resp = self.api.call_api(method, url, header_params=headers, body=body, _request_timeout=self.timeout_s)
        raw = resp.read()
        try:
            out = json.loads(raw) if raw else {}
        except ValueError:  # an API group the server does not serve answers 404 in plain text
            if resp.status < 400:
                raise
            out = {"message": raw[:300].decode("utf-8", "replace")}
        if resp.status >= 400:
            msg = out.get("message", raw[:300].decode("utf-8", "replace")) if isinstance(out, dict) else str(out)
            raise KubeError(resp.status, str(resp.reason), msg, f"{method} {url_path}")
        return out if isinstance(out, dict) else {"items": out}

    # ---- objects ----------------------------------------------------------------------------------

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return self.request("GET", path(api_version, kind, namespace, name))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def list_objects(self, api_version: str, kind: str, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        out = self.request("GET", path(api_version, kind, namespace), query={"labelSelector": label_selector})
        return list(out.get("items") or [])

    def apply(self, obj: dict[str, Any], *, force: bool = True) -> dict[str, Any]:
        """Server-side apply as FIELD_MANAGER: a no-op (same resourceVersion) when nothing changed."""
        m = obj["metadata"]
        return self.request("PATCH", path(obj["apiVersion"], obj["kind"], m["namespace"], m["name"]), body=obj,
                            query={"fieldManager": FIELD_MANAGER, "force": "true" if force else "false"},
                            content_type=APPLY)

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        """JSON merge patch of an RLJob's /status (None values delete keys)."""
        return self.request("PATCH", path(f"{GROUP}/{VERSION}", "RLJob", namespace, name, "status"),
                            body={"status": status}, content_type=MERGE)

    def get_scale(self, namespace: str, name: str, kind: str = "Deployment") -> dict[str, Any] | None:
        """The autoscaling/v1 Scale of a Deployment or StatefulSet, or None when it does not exist."""
        try:
            return self.request("GET", path("apps/v1", kind, namespace, name, "scale"))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def set_scale(self, namespace: str, name: str, replicas: int, kind: str = "Deployment") -> dict[str, Any]:
        """Write spec.replicas through the /scale subresource (what HPA and `kubectl scale` use)."""
        return self.request("PATCH", path("apps/v1", kind, namespace, name, "scale"),
                            body={"spec": {"replicas": replicas}}, query={"fieldManager": FIELD_MANAGER},
                            content_type=MERGE)

    # ---- events -----------------------------------------------------------------------------------

    def event(self, owner: dict[str, Any], type_: str, reason: str, message: str, action: str) -> None:
        """A core/v1 Event about `owner` (what `kubectl describe rlj` lists)."""
        m = owner["metadata"]
        now = rfc3339(datetime.now(UTC))
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{m['name']}.", "namespace": m["namespace"]},
            "involvedObject": {"apiVersion": owner.get("apiVersion", f"{GROUP}/{VERSION}"),
                               "kind": owner.get("kind", "RLJob"), "name": m["name"], "namespace": m["namespace"],
                               "uid": m.get("uid")},
            "type": type_, "reason": reason, "message": message[:1024], "action": action,
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": "scalerl.dev/operator", "reportingInstance": identity(),
            "firstTimestamp": now, "lastTimestamp": now,
            "count": 1,
        }
        self.request("POST", path("v1", "Event", m["namespace"]), body=body)

    def events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """Events about the object `name` in `namespace`, oldest first."""
        out = self.request("GET", path("v1", "Event", namespace),
                           query={"fieldSelector": f"involvedObject.name={name}"})
        return sorted(out.get("items", []), key=lambda e: (e.get("firstTimestamp") or "", e["metadata"]["name"]))


def identity() -> str:
    """Who this operator process is (Lease holder, Event reporter): the pod name, else host:pid."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
