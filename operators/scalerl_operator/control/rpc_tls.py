"""The certificates of a job's role endpoints (`scalerl.rpc.security`): a CA per RLJob and one certificate
per identity, in Secrets the RLJob owns (garbage-collected with it).

    <job>-rpc-ca          Opaque: ca.crt, ca.key (the CA's key is read by the operator only; no Pod mounts it)
    <job>-rpc-<identity>  kubernetes.io/tls: tls.crt, tls.key, ca.crt (and in a role's, metrics-token.sha256: the
                          hash of the scrape token its side port's /metrics asks for, `scalerl.rpc.sidetls`,
                          when the operator has one: SCALERL_SCRAPE_TOKEN_FILE, the chart's scrape-token
                          Secret); one per role, mounted at RPC_TLS_MOUNT in
                          that role's Pods, and `client`: the user's own calls (`scalerl eval --engine grpc`,
                          grpcurl), an extra identity every role lets call Generate, Score and Status;
                          and one per name in spec.rpc.clients, allowed the same

`ensure` runs every pass: a missing Secret is made; a certificate is issued again when less than a third
of its validity is left (`RENEW_FRACTION`), or when another CA signed it (the CA Secret was replaced, e.g.
deleted by hand to revoke everything). The kubelet refreshes mounted Secrets within about a minute and
a role's server takes the new files on its next connection (`scalerl.rpc.security`, dynamic credentials).
The CA itself lives `CA_DAYS`; it is replaced (and every certificate with it) when a third of that is left.
A changed scrape token (the chart's Secret rotated) rewrites the roles' Secrets with the new hash, keeping
their certificates; the roles read it on the next scrape, without a restart.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from cryptography import x509

from scalerl.rpc.certs import CertificateAuthority, new_ca
from scalerl.rpc.sidetls import TOKEN_HASH_FILE, read_token_file, token_hash
from scalerl_operator.cluster.kube import Kube
from scalerl_operator.render.names import ROLES, RPC_CLIENT, SCRAPE_TOKEN_FILE_ENV, labels, rpc_secret

log = logging.getLogger(__name__)

IDENTITIES = (*ROLES, RPC_CLIENT)
CERT_DAYS = 90
CA_DAYS = 365
RENEW_FRACTION = 1 / 3


def scrape_token_hash(environ: Mapping[str, str]) -> bytes | None:
    """The hex SHA-256 of the scrape token in the file SCALERL_SCRAPE_TOKEN_FILE names, as the roles' Secrets
    hold it: b"" when no file is named (/metrics stays open); None, logged, when the file cannot be read now
    (the operator checked it at start: the Secrets keep the hash they have). Read on every pass, so a
    rotated Secret reaches the roles."""
    path = environ.get(SCRAPE_TOKEN_FILE_ENV, "")
    if not path:
        return b""
    try:
        return (token_hash(read_token_file(path, SCRAPE_TOKEN_FILE_ENV)) + "\n").encode()
    except ValueError as exc:
        log.warning("%s; the roles keep the scrape token's hash they have", exc)
        return None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _data(secret: dict[str, Any] | None, key: str) -> bytes:
    value = ((secret or {}).get("data") or {}).get(key)
    return base64.b64decode(value) if value else b""


def due(cert_pem: bytes, now: datetime, issuer: bytes | None = None) -> bool:
    """Whether a certificate must be issued again: absent or unreadable, within `RENEW_FRACTION` of its end,
    or (with `issuer`, a CA's PEM) not signed by that CA."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        if issuer is not None:
            cert.verify_directly_issued_by(x509.load_pem_x509_certificate(issuer))
    except Exception:  # absent, malformed or signed by another key: all mean "issue again"
        return True
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return (end - now) < (end - start) * RENEW_FRACTION


def _secret(obj: dict[str, Any], name: str, type_: str, data: dict[str, bytes]) -> dict[str, Any]:
    m = obj["metadata"]
    return {"apiVersion": "v1", "kind": "Secret", "type": type_,
            "metadata": {"name": name, "namespace": m["namespace"],
                         "labels": labels(m["name"], "rpc-tls"),
                         "ownerReferences": [{"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": m["name"],
                                              "uid": m["uid"], "controller": True, "blockOwnerDeletion": True}]},
            "data": {k: _b64(v) for k, v in data.items()}}


def ensure(kube: Kube, obj: dict[str, Any], now: datetime | None = None, extra: tuple[str, ...] = (),
           metrics_hash: bytes | None = b"") -> list[str]:
    """Make or renew the job's CA and certificate Secrets (see the module docstring), and those of the
    `extra` identities (spec.rpc.clients), the roles' with `metrics_hash` (`scrape_token_hash`; b"": none;
    None: as each Secret has it, the token file being unreadable this pass); the names of the Secrets
    written this pass (empty when all were current)."""
    now = now or datetime.now(UTC)
    job, ns = obj["metadata"]["name"], obj["metadata"]["namespace"]
    written: list[str] = []
    found = kube.get("v1", "Secret", ns, rpc_secret(job, "ca"))
    ca = CertificateAuthority(job, _data(found, "ca.crt"), _data(found, "ca.key"))
    if due(ca.cert_pem, now) or not ca.key_pem:
        ca = new_ca(job, days=CA_DAYS)
        kube.apply(_secret(obj, rpc_secret(job, "ca"), "Opaque", {"ca.crt": ca.cert_pem, "ca.key": ca.key_pem}))
        written.append(rpc_secret(job, "ca"))
    for identity in (*IDENTITIES, *extra):
        name = rpc_secret(job, identity)
        current = kube.get("v1", "Secret", ns, name)
        hashed = _data(current, TOKEN_HASH_FILE) if metrics_hash is None else metrics_hash
        wanted = hashed if identity in ROLES else b""  # b"": the Secret has no such key
        token = {TOKEN_HASH_FILE: wanted} if wanted else {}
        fresh = not due(_data(current, "tls.crt"), now, issuer=ca.cert_pem) and _data(current, "ca.crt") == ca.cert_pem
        if fresh and _data(current, TOKEN_HASH_FILE) == wanted:
            continue
        if fresh:  # only the scrape token's hash changed: the certificate stays
            cert = {k: _data(current, k) for k in ("tls.crt", "tls.key", "ca.crt")}
        else:
            issued = ca.issue(identity, days=CERT_DAYS)
            cert = {"tls.crt": issued.cert_pem, "tls.key": issued.key_pem, "ca.crt": ca.cert_pem}
        kube.apply(_secret(obj, name, "kubernetes.io/tls", {**cert, **token}))
        written.append(name)
    if written:
        log.info("%s/%s: wrote the role endpoints' certificate Secrets %s", ns, job, ", ".join(written))
    return written
