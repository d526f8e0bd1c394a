"""The NetworkPolicy of an RLJob's role Pods (`J-roles`): who may open a connection to them.

    ingress to every role Pod of job J:
      - from J's own role Pods, any port (gRPC, the learner ranks' rendezvous and collectives, the side port)
      - from the scrapers (`scrape_from`, default: Pods labelled app.kubernetes.io/name=prometheus in any
        namespace), the side port only (/metrics, /healthz, /readyz)
      - nothing else: another tenant's Pods reach neither the gRPC port nor the side port

Egress is not restricted (policyTypes is Ingress only). A NetworkPolicy selects peers by label or IP
block, and the job's Kafka, S3 and collector are usually names outside the cluster, or Services whose
port is translated to another before a policy sees it (a rule on the Service's port would drop the real
connection on most enforcing CNIs); a rule that would break the job on one network and not another is
not rendered. Kubelet probes come from the node and are not subject to it.

The operator's settings (environment; the chart sets them from `networkPolicy.*`):
    SCALERL_NETWORK_POLICIES   true (default) | false: render them (false: clusters whose network does not
                               enforce NetworkPolicy, or that manage policies themselves; an existing
                               `J-roles` is then deleted)
    SCALERL_SCRAPE_FROM        JSON list of NetworkPolicyPeer objects allowed to the side port
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scalerl_operator.api.spec import RLJobSpec
from scalerl_operator.render.names import labels

ENABLED_ENV, SCRAPE_FROM_ENV = "SCALERL_NETWORK_POLICIES", "SCALERL_SCRAPE_FROM"
DEFAULT_SCRAPE_FROM: tuple[dict[str, Any], ...] = (
    {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}},)
_PEER_KEYS = {"podSelector", "namespaceSelector", "ipBlock"}


@dataclass(frozen=True)
class NetworkDefaults:
    enabled: bool = True
    scrape_from: tuple[dict[str, Any], ...] = field(default=DEFAULT_SCRAPE_FROM)


def network_defaults(environ: Mapping[str, str]) -> NetworkDefaults:
    """The operator's NetworkPolicy settings; ValueError naming the variable when one is malformed."""
    raw = environ.get(ENABLED_ENV, "true").strip().lower()
    if raw not in ("true", "false"):
        raise ValueError(f"{ENABLED_ENV}: must be true or false (got {raw!r})")
    text = environ.get(SCRAPE_FROM_ENV, "").strip()
    if not text:
        return NetworkDefaults(raw == "true")
    try:
        peers = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{SCRAPE_FROM_ENV}: not JSON ({exc.msg}); expected a list of NetworkPolicyPeer "
                         "objects such as [{\"namespaceSelector\": {...}, \"podSelector\": {...}}]") from None
    if not isinstance(peers, list) or not all(isinstance(p, dict) and p and set(p) <= _PEER_KEYS for p in peers):
        raise ValueError(f"{SCRAPE_FROM_ENV}: expected a list of NetworkPolicyPeer objects (keys "
                         f"{', '.join(sorted(_PEER_KEYS))}), got {text[:200]}")
    return NetworkDefaults(raw == "true", tuple(peers))


def policy_name(job: str) -> str:
    return f"{job}-roles"


def network_policy(job: str, ns: str, spec: RLJobSpec, defaults: NetworkDefaults) -> dict[str, Any]:
    """NetworkPolicy `J-roles` (see the module docstring)."""
    mine = {"matchLabels": {"app.kubernetes.io/instance": job, "app.kubernetes.io/managed-by": "scalerl-operator"}}
    ingress: list[dict[str, Any]] = [{"from": [{"podSelector": mine}]}]
    if defaults.scrape_from:
        ingress.append({"from": [dict(p) for p in defaults.scrape_from],
                        "ports": [{"port": spec.telemetry.metrics_port, "protocol": "TCP"}]})
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": policy_name(job), "namespace": ns, "labels": labels(job, "network-policy")},
            "spec": {"podSelector": mine, "policyTypes": ["Ingress"], "ingress": ingress}}
