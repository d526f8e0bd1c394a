"""The role endpoints' certificates issued by cert-manager, when the cluster runs it (`rpc.certificates` in
the chart: SCALERL_RPC_CERTIFICATES = auto | cert-manager | operator).

Per RLJob, all owned by it (garbage-collected with it):

    <job>-rpc-selfsigned  Issuer (selfSigned): signs the job's CA and nothing else
    <job>-rpc-ca          Certificate: the job's CA (isCA, ECDSA P-256, CA_DAYS, renewed with a third left,
                          its private key kept on renewal) into the Secret of the same name;
                          Issuer (ca: that Secret): signs the job's identities
    <job>-rpc-<identity>  Certificate per role, `client` and each of spec.rpc.clients: CN the identity,
                          O "scalerl job <job>", DNS `server_name(job)`, serverAuth + clientAuth, ECDSA P-256,
                          CERT_DAYS, renewed with a third left, a new key each time; into the Secret of the
                          same name (kubernetes.io/tls: tls.crt, tls.key, ca.crt)

The names, the Secret layout and what a certificate says are those of the operator's own CA (`rpc_tls`):
Pods mount the same Secrets and `scalerl.rpc.security` reads them the same way, in either mode.

Choices:
1. A CA per job, not a cluster-wide issuer: a certificate of one job must not be accepted by another
   job's endpoints, and the roles trust the `ca.crt` of their Secret as the only root. An
   organisation's issuer would sign for every job alike.
2. The CA keeps its key when cert-manager renews it (rotationPolicy Never): the identities' certificates
   issued before the renewal still verify against the renewed CA, so the roles never see half a rotation
   (cert-manager does not issue the leaves again when their CA changes).
3. The scrape token's hash (`metrics-token.sha256`, see `rpc_tls`) goes into each role's Secret by a
   server-side apply of that one key; cert-manager keeps the keys it does not manage when it issues
   again. The same apply adds the RLJob as a (non-controller) owner of the Secret: cert-manager makes
   its Secrets owned by their Certificate only when started with --enable-certificate-owner-ref.
4. Which mode a job uses is decided once, by what exists: a job whose CA is a Certificate stays on
   cert-manager, one whose CA Secret the operator made stays on the operator's CA (a restart of the
   operator with another setting never mixes the two); a new job takes the setting, `auto` meaning
   cert-manager when the API server serves cert-manager.io/v1 Certificates and Issuers.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from cryptography import x509

from scalerl.rpc.certs import server_name
from scalerl.rpc.sidetls import TOKEN_HASH_FILE
from scalerl_operator.cluster.kube import MERGE, Kube, KubeError
from scalerl_operator.control import rpc_tls
from scalerl_operator.control.rpc_tls import CA_DAYS, CERT_DAYS, IDENTITIES, RENEW_FRACTION
from scalerl_operator.render.names import ROLES, labels, rpc_secret

log = logging.getLogger(__name__)

MODE_ENV = "SCALERL_RPC_CERTIFICATES"
MODES = ("auto", "cert-manager", "operator")
API = "cert-manager.io/v1"
SERVED_TTL_S = 60.0
_served: dict[int, tuple[float, bool]] = {}  # id(kube) -> (when checked, whether cert-manager is served)


def configured_mode(environ: Mapping[str, str]) -> str:
    """The operator's setting (SCALERL_RPC_CERTIFICATES, default auto); ValueError naming it when malformed."""
    raw = environ.get(MODE_ENV, "auto").strip().lower()
    if raw not in MODES:
        raise ValueError(f"{MODE_ENV}: must be one of {', '.join(MODES)} (got {raw!r})")
    return raw


def served(kube: Kube) -> bool:
    """Whether the API server serves cert-manager's Certificates and Issuers (checked at most once a minute)."""
    now = time.monotonic()
    hit = _served.get(id(kube))
    if hit is not None and now - hit[0] < SERVED_TTL_S:
        return hit[1]
    try:
        kinds = {r.get("kind") for r in kube.request("GET", f"/apis/{API}").get("resources") or []}
        answer = {"Certificate", "Issuer"} <= kinds
    except KubeError as exc:
        if exc.status != 404:
            raise
        answer = False
    _served[id(kube)] = (now, answer)
    return answer


def job_mode(kube: Kube, obj: dict[str, Any], configured: str) -> str:
    """"cert-manager" or "operator" for this job (choice 4 of the module docstring); RuntimeError when
    cert-manager is asked for and the API server does not serve it (the pass is retried)."""
    job, ns = obj["metadata"]["name"], obj["metadata"]["namespace"]
    if kube.get(API, "Certificate", ns, rpc_secret(job, "ca")) is not None:
        return "cert-manager"
    if kube.get("v1", "Secret", ns, rpc_secret(job, "ca")) is not None:
        return "operator"  # a CA Secret without its Certificate: the operator made it
    if configured == "auto":
        return "cert-manager" if served(kube) else "operator"
    if configured == "cert-manager" and not served(kube):
        raise RuntimeError(f"{MODE_ENV}=cert-manager, but the API server does not serve {API} Certificates and "
                           "Issuers: install cert-manager, or set the chart's rpc.certificates to auto or operator")
    return configured


def _owned(obj: dict[str, Any], kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    m = obj["metadata"]
    return {"apiVersion": API, "kind": kind, "spec": spec,
            "metadata": {"name": name, "namespace": m["namespace"], "labels": labels(m["name"], "rpc-tls"),
                         "ownerReferences": [{"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": m["name"],
                                              "uid": m["uid"], "controller": True, "blockOwnerDeletion": True}]}}


def _hours(days: int, fraction: float = 1.0) -> str:
    return f"{round(days * 24 * fraction)}h"


def objects(obj: dict[str, Any], extra: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The job's Issuers and Certificates (module docstring), CA first."""
    job = obj["metadata"]["name"]
    ca, selfsigned = rpc_secret(job, "ca"), rpc_secret(job, "selfsigned")
    out = [
        _owned(obj, "Issuer", selfsigned, {"selfSigned": {}}),
        _owned(obj, "Certificate", ca, {
            "isCA": True, "commonName": f"scalerl job {job} CA", "secretName": ca,
            "subject": {"organizations": [f"scalerl job {job}"]},
            "duration": _hours(CA_DAYS), "renewBefore": _hours(CA_DAYS, RENEW_FRACTION),
            "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Never"},
            "usages": ["cert sign", "crl sign"],
            "issuerRef": {"group": "cert-manager.io", "kind": "Issuer", "name": selfsigned}}),
        _owned(obj, "Issuer", ca, {"ca": {"secretName": ca}}),
    ]
    for identity in (*IDENTITIES, *extra):
        name = rpc_secret(job, identity)
        out.append(_owned(obj, "Certificate", name, {
            "commonName": identity, "secretName": name,
            "subject": {"organizations": [f"scalerl job {job}"]},
            "dnsNames": [server_name(job)],
            "duration": _hours(CERT_DAYS), "renewBefore": _hours(CERT_DAYS, RENEW_FRACTION),
            "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
            "usages": ["digital signature", "key agreement", "server auth", "client auth"],
            "secretTemplate": {"labels": labels(job, "rpc-tls")},
            "issuerRef": {"group": "cert-manager.io", "kind": "Issuer", "name": ca}}))
    return out


def ensure(kube: Kube, obj: dict[str, Any], extra: tuple[str, ...] = (),
           metrics_hash: bytes | None = b"") -> list[str]:
    """Apply the job's Issuers and Certificates (a no-op when unchanged), then give each issued role Secret
    the scrape token's hash (`metrics_hash` as `rpc_tls.ensure` takes it) and the RLJob as an owner; the
    identities whose Secret cert-manager has not written yet (empty: all are issued)."""
    job, ns, uid = obj["metadata"]["name"], obj["metadata"]["namespace"], obj["metadata"]["uid"]
    for o in objects(obj, extra):
        kube.apply(o)
    pending = []
    ca = base64.b64decode(((kube.get("v1", "Secret", ns, rpc_secret(job, "ca")) or {}).get("data") or {}).get(
        "tls.crt") or "")
    for identity in (*IDENTITIES, *extra):
        name = rpc_secret(job, identity)
        secret = kube.get("v1", "Secret", ns, name)
        data = (secret or {}).get("data") or {}
        if not data.get("tls.crt"):
            pending.append(identity)
            continue
        if ca and not _signed_by(base64.b64decode(data["tls.crt"]), ca):
            _renew(kube, ns, name, "its CA was replaced")  # cert-manager does not issue leaves again on its own
            pending.append(identity)
        have = base64.b64decode(data.get(TOKEN_HASH_FILE) or "")
        wanted = (have if metrics_hash is None else metrics_hash) if identity in ROLES else b""
        owners = {ref.get("uid") for ref in (secret or {}).get("metadata", {}).get("ownerReferences") or []}
        if uid in owners and wanted == have:
            continue  # (an apply without the key removes the one this field manager wrote before)
        patch: dict[str, Any] = {"apiVersion": "v1", "kind": "Secret", "metadata": {
            "name": name, "namespace": ns, "ownerReferences": [
                {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": job, "uid": uid}]}}
        if wanted:
            patch["data"] = {TOKEN_HASH_FILE: base64.b64encode(wanted).decode()}
        kube.apply(patch)
    if pending:
        log.info("%s/%s: waiting for cert-manager to issue %s", ns, job, ", ".join(pending))
    return pending


def _signed_by(cert_pem: bytes, ca_pem: bytes) -> bool:
    try:
        x509.load_pem_x509_certificate(cert_pem).verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem))
    except Exception:  # malformed, or signed by another key
        return False
    return True


def _renew(kube: Kube, ns: str, name: str, why: str) -> None:
    """Have cert-manager issue Certificate `name` again now, as `cmctl renew` does (its Issuing condition),
    unless an issuance is under way."""
    conditions = ((kube.get(API, "Certificate", ns, name) or {}).get("status") or {}).get("conditions") or []
    if any(c.get("type") == "Issuing" and c.get("status") == "True" for c in conditions):
        return
    log.info("%s/%s: asking cert-manager to issue the certificate again: %s", ns, name, why)
    issuing = {"type": "Issuing", "status": "True", "reason": "ManuallyTriggered",
               "message": f"scalerl operator: {why}"}
    kube.request("PATCH", f"/apis/{API}/namespaces/{ns}/certificates/{name}/status", content_type=MERGE,
                 body={"status": {"conditions": [*(c for c in conditions if c.get("type") != "Issuing"), issuing]}})


def ensure_certificates(kube: Kube, obj: dict[str, Any], now: datetime, clients: tuple[str, ...],
                        environ: Mapping[str, str]) -> None:
    """The job's endpoint certificates, by the mode it uses (`job_mode`): cert-manager's or the operator's CA."""
    metrics_hash = rpc_tls.scrape_token_hash(environ)
    if job_mode(kube, obj, configured_mode(environ)) == "cert-manager":
        ensure(kube, obj, extra=clients, metrics_hash=metrics_hash)
    else:
        rpc_tls.ensure(kube, obj, now, extra=clients, metrics_hash=metrics_hash)
