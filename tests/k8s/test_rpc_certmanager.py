"""The role endpoints' certificates issued by a REAL cert-manager (its controllers built from the
cert-manager module, scripts/infra/certmanager.sh) on the real API server, through the operator's
reconcile pass (scalerl_operator.control.rpc_certmanager):

- `auto` finds cert-manager served; each job gets its own self-signed CA and one Certificate per identity,
  all owned by the RLJob; the Secrets have the layout the roles read, the scrape token's hash, the RLJob as
  an owner;
- the roles talk mutual TLS over them (a real gRPC server and client), and a certificate of another job is
  refused by the handshake;
- a renewed CA keeps its key, so certificates issued before the renewal still verify against it; a
  replaced one (its Secret deleted: revocation) has the operator get every identity issued again under it;
- a job whose CA the operator made keeps the operator's CA when cert-manager is chosen later."""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from operator_helpers import create, get_job, rljob, unique_job
from prometheus_client import CollectorRegistry

from scalerl.environment.remote import EnvironmentUnavailable, RemoteToolbox
from scalerl.environment.service import EnvironmentServicer
from scalerl.environment.tools import Toolbox, ToolCall
from scalerl.rpc.certs import identity_of, server_name
from scalerl.rpc.security import RpcSecurity
from scalerl.rpc.server import serve_grpc
from scalerl.rpc.sidetls import TOKEN_HASH_FILE, token_hash
from scalerl.sandbox import Limits
from scalerl_operator.api import conditions as c
from scalerl_operator.cluster.kube import Kube
from scalerl_operator.control.rpc_certmanager import API, MODE_ENV
from scalerl_operator.control.rpc_tls import IDENTITIES
from scalerl_operator.control.runtime import OperatorConfig, Runtime
from scalerl_operator.render.names import ROLES, SCRAPE_TOKEN_FILE_ENV, rpc_secret

pytestmark = pytest.mark.infra  # the real API server and cert-manager of scripts/infra
TOKEN = "a-scrape-token-for-the-test"
ISSUE_TIMEOUT_S = 90.0


def _pem(secret: dict[str, Any], key: str) -> bytes:
    return base64.b64decode(secret["data"][key])


def _issued(kube: Kube, rt: Runtime, ns: str, name: str, identities: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Operator passes until cert-manager has written every identity's Secret and the operator has made the
    RLJob an owner of each and given the roles' Secrets the token's hash (as the operator's own passes would,
    until then: a Secret cert-manager writes after a pass has looked at it gets these on the next pass)."""
    deadline = time.monotonic() + ISSUE_TIMEOUT_S
    job = get_job(kube, ns, name)
    assert job is not None
    uid = job["metadata"]["uid"]
    while True:
        rt.sync(ns, name, scale=False)
        got = {i: kube.get("v1", "Secret", ns, rpc_secret(name, i)) for i in ("ca", *identities)}
        if all(s and (s.get("data") or {}).get("tls.crt") for s in got.values()) and all(
                TOKEN_HASH_FILE in (got[r] or {}).get("data", {}) for r in ROLES) and all(
                uid in {o.get("uid") for o in (got[i] or {})["metadata"].get("ownerReferences") or []}
                for i in identities):
            return {i: s for i, s in got.items() if s is not None}
        keys = {i: sorted((s or {}).get("data") or {}) for i, s in got.items()}
        assert time.monotonic() < deadline, f"no certificates for {name} in {ISSUE_TIMEOUT_S:.0f} s: {keys}"
        time.sleep(0.5)


def _tls_dir(secret: dict[str, Any], where: Path) -> RpcSecurity:
    where.mkdir(parents=True)
    for key in ("tls.crt", "tls.key", "ca.crt"):
        (where / key).write_bytes(_pem(secret, key))
        os.chmod(where / key, 0o600)
    return RpcSecurity(str(where))


@pytest.fixture
def token_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "scrape-token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    monkeypatch.setenv(SCRAPE_TOKEN_FILE_ENV, str(path))  # the chart's scrape-token Secret


def test_cert_manager_issues_a_ca_per_job_and_the_roles_talk_mutual_tls_over_it(
        certmanager_env: dict[str, str], kube: Kube, namespace: str, bootstrap: str, token_file: None,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(MODE_ENV, "auto")  # the chart's default: cert-manager is served on this API server
    names = [unique_job(), unique_job()]
    jobs = {n: create(kube, namespace, rljob(n, bootstrap, rpc={"clients": ["eval"]})) for n in names}
    identities = (*IDENTITIES, "eval")
    rt = Runtime(kube, OperatorConfig(kafka_timeout_s=10))
    try:
        assert rt.sync(namespace, names[0], scale=False) == c.PHASE_PENDING
        secrets = {n: _issued(kube, rt, namespace, n, identities) for n in names}
    finally:
        rt.close()
    for name, job in jobs.items():
        uid = job["metadata"]["uid"]
        ca_cert = kube.get(API, "Certificate", namespace, rpc_secret(name, "ca"))
        assert ca_cert is not None and ca_cert["spec"]["isCA"] is True
        assert [r["uid"] for r in ca_cert["metadata"]["ownerReferences"]] == [uid]
        ca = x509.load_pem_x509_certificate(_pem(secrets[name]["ca"], "tls.crt"))
        assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        for identity in identities:
            s = secrets[name][identity]
            assert s["type"] == "kubernetes.io/tls"
            cert = x509.load_pem_x509_certificate(_pem(s, "tls.crt"))
            cert.verify_directly_issued_by(ca)
            assert identity_of(_pem(s, "tls.crt")) == identity
            assert _pem(s, "ca.crt") == _pem(secrets[name]["ca"], "tls.crt")
            assert cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
                x509.DNSName) == [server_name(name)]
            assert uid in {r["uid"] for r in s["metadata"]["ownerReferences"]}
            if identity in ROLES:
                assert _pem(s, TOKEN_HASH_FILE).decode().strip() == token_hash(TOKEN)
            else:
                assert TOKEN_HASH_FILE not in s["data"]
    # the roles of one job talk; a certificate of the other job is refused by the handshake
    a, b = names
    limits = Limits(wall_s=5.0, cpu_s=5, memory_bytes=256 << 20, output_bytes=4096)
    servicer = EnvironmentServicer(Toolbox(("calculator",), limits), replica_id="env-0", registry=CollectorRegistry())
    server, port = serve_grpc(0, servicer, security=_tls_dir(secrets[a]["verifier"], tmp_path / "a-verifier"),
                              host="127.0.0.1")
    try:
        with RemoteToolbox(("calculator",), f"127.0.0.1:{port}", limits=limits, attempts=1, timeout_s=10,
                           security=_tls_dir(secrets[a]["generator"], tmp_path / "a-generator")) as remote:
            assert remote.execute(ToolCall("calculator", "6*7")).text == "42"
        with RemoteToolbox(("calculator",), f"127.0.0.1:{port}", limits=limits, attempts=1, timeout_s=10,
                           security=_tls_dir(secrets[b]["generator"], tmp_path / "b-generator")) as other, \
                pytest.raises(EnvironmentUnavailable, match="UNAVAILABLE"):
            other.execute(ToolCall("calculator", "6*7"))
    finally:
        server.stop(grace_s=0)
    assert servicer.executions == 1


@pytest.fixture
def issued_job(certmanager_env: dict[str, str], kube: Kube, namespace: str, bootstrap: str, token_file: None,
               monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Runtime, dict[str, dict[str, Any]]]]:
    """A job on cert-manager (set, not `auto`), an operator Runtime, and its Secrets once all are issued."""
    monkeypatch.setenv(MODE_ENV, "cert-manager")
    name = unique_job()
    create(kube, namespace, rljob(name, bootstrap))
    rt = Runtime(kube, OperatorConfig(kafka_timeout_s=10))
    try:
        yield name, rt, _issued(kube, rt, namespace, name, IDENTITIES)
    finally:
        rt.close()


def test_a_renewed_ca_keeps_its_key_so_certificates_issued_before_still_verify(
        issued_job: tuple[str, Runtime, dict[str, dict[str, Any]]], kube: Kube, namespace: str) -> None:
    name, _, before = issued_job
    # what `cmctl renew` does: the Issuing condition, set by hand
    kube.request("PATCH", f"/apis/{API}/namespaces/{namespace}/certificates/{rpc_secret(name, 'ca')}/status",
                 body={"status": {"conditions": [{"type": "Issuing", "status": "True", "reason": "ManuallyTriggered",
                                                  "message": "renewed by the test"}]}},
                 content_type="application/merge-patch+json")
    deadline = time.monotonic() + ISSUE_TIMEOUT_S
    while (renewed := kube.get("v1", "Secret", namespace, rpc_secret(name, "ca"))) is None or \
            _pem(renewed, "tls.crt") == _pem(before["ca"], "tls.crt"):
        assert time.monotonic() < deadline, "cert-manager did not renew the job's CA"
        time.sleep(0.5)
    new_ca = x509.load_pem_x509_certificate(_pem(renewed, "tls.crt"))
    assert new_ca.serial_number != x509.load_pem_x509_certificate(_pem(before["ca"], "tls.crt")).serial_number
    for identity in IDENTITIES:  # issued under the CA before its renewal
        x509.load_pem_x509_certificate(_pem(before[identity], "tls.crt")).verify_directly_issued_by(new_ca)


def test_deleting_the_ca_secret_revokes_every_certificate_of_the_job(
        issued_job: tuple[str, Runtime, dict[str, dict[str, Any]]], kube: Kube, namespace: str) -> None:
    name, rt, before = issued_job
    kube.request("DELETE", f"/api/v1/namespaces/{namespace}/secrets/{rpc_secret(name, 'ca')}")
    deadline = time.monotonic() + ISSUE_TIMEOUT_S
    while True:
        after = _issued(kube, rt, namespace, name, IDENTITIES)
        ca = x509.load_pem_x509_certificate(_pem(after["ca"], "tls.crt"))
        if _pem(after["ca"], "tls.crt") != _pem(before["ca"], "tls.crt") and all(
                _pem(after[i], "ca.crt") == _pem(after["ca"], "tls.crt") for i in IDENTITIES):
            break
        assert time.monotonic() < deadline, "the identities were not issued again under the new CA"
        time.sleep(0.5)
    for identity in IDENTITIES:
        x509.load_pem_x509_certificate(_pem(after[identity], "tls.crt")).verify_directly_issued_by(ca)
        with pytest.raises(Exception):  # noqa: B017 - cryptography raises InvalidSignature or ValueError
            x509.load_pem_x509_certificate(_pem(before[identity], "tls.crt")).verify_directly_issued_by(ca)


def test_a_job_whose_ca_the_operator_made_keeps_it_when_cert_manager_is_chosen_later(
        certmanager_env: dict[str, str], kube: Kube, namespace: str, bootstrap: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    name = unique_job()
    create(kube, namespace, rljob(name, bootstrap))
    rt = Runtime(kube, OperatorConfig(kafka_timeout_s=10))
    try:
        rt.sync(namespace, name, scale=False)  # SCALERL_RPC_CERTIFICATES=operator (the conftest's)
        made = kube.get("v1", "Secret", namespace, rpc_secret(name, "ca"))
        assert made is not None and made["type"] == "Opaque"
        monkeypatch.setenv(MODE_ENV, "cert-manager")  # an operator restarted with another setting
        rt.sync(namespace, name, scale=False)
    finally:
        rt.close()
    assert kube.get(API, "Certificate", namespace, rpc_secret(name, "ca")) is None
    assert kube.get(API, "Certificate", namespace, rpc_secret(name, "learner")) is None
    assert kube.get("v1", "Secret", namespace, rpc_secret(name, "ca"))["data"] == made["data"]
