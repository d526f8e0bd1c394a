"""The protection of a job's role endpoints on the REAL API server, made by the operator's reconcile pass:
the certificate Secrets (scalerl_operator.control.rpc_tls: the CA and one certificate per role and for
`client`, owned by the RLJob; a second pass writes nothing; a replaced CA makes every certificate issued
again under it; no Pod template mounts the CA's key) and the roles' NetworkPolicy (render.netpol: accepted
by the API server, owned by the RLJob, deleted when the operator is set not to render them)."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from operator_helpers import create, rljob, unique_job

from scalerl.rpc.certs import identity_of, new_ca, server_name
from scalerl.rpc.sidetls import TOKEN_HASH_FILE
from scalerl_operator.api import conditions as c
from scalerl_operator.cluster.kube import Kube
from scalerl_operator.control.rpc_tls import IDENTITIES
from scalerl_operator.control.runtime import OperatorConfig, Runtime
from scalerl_operator.render.names import ROLES, rpc_secret
from scalerl_operator.render.netpol import policy_name

pytestmark = pytest.mark.infra  # the real API server of scripts/infra


def _secrets(kube: Kube, ns: str, name: str) -> dict[str, dict[str, Any]]:
    out = {}
    for identity in ("ca", *IDENTITIES, "eval"):
        s = kube.get("v1", "Secret", ns, rpc_secret(name, identity))
        assert s is not None, identity
        out[identity] = s
    return out


def _pem(secret: dict[str, Any], key: str) -> bytes:
    return base64.b64decode(secret["data"][key])


def test_the_operator_issues_renews_and_owns_the_roles_certificates(kube: Kube, namespace: str, bootstrap: str,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    name = unique_job()
    job = create(kube, namespace, rljob(name, bootstrap, rpc={"clients": ["eval"]}))
    rt = Runtime(kube, OperatorConfig(kafka_timeout_s=10))
    try:
        assert rt.sync(namespace, name, scale=False) == c.PHASE_PENDING
        first = _secrets(kube, namespace, name)
        ca = x509.load_pem_x509_certificate(_pem(first["ca"], "ca.crt"))
        for identity in (*IDENTITIES, "eval"):  # ... and spec.rpc.clients
            s = first[identity]
            assert s["type"] == "kubernetes.io/tls" and set(s["data"]) == {"tls.crt", "tls.key", "ca.crt"}
            cert = x509.load_pem_x509_certificate(_pem(s, "tls.crt"))
            cert.verify_directly_issued_by(ca)
            assert identity_of(_pem(s, "tls.crt")) == identity
            assert cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
                x509.DNSName) == [server_name(name)]
        policy = kube.get("networking.k8s.io/v1", "NetworkPolicy", namespace, policy_name(name))
        assert policy is not None and policy["spec"]["policyTypes"] == ["Ingress"]
        for s in [*first.values(), policy]:  # garbage-collected with the RLJob
            assert s["metadata"]["ownerReferences"] == [{
                "apiVersion": "scalerl.dev/v1alpha1", "kind": "RLJob", "name": name, "uid": job["metadata"]["uid"],
                "controller": True, "blockOwnerDeletion": True}]
        assert rt.sync(namespace, name, scale=True) == c.PHASE_PENDING  # nothing due: nothing written
        again = _secrets(kube, namespace, name)
        assert {k: s["metadata"]["resourceVersion"] for k, s in again.items()} == \
            {k: s["metadata"]["resourceVersion"] for k, s in first.items()}

        # the chart's scrape token: its hash reaches every role's Secret (never `client` or `eval`, never the
        # token), the certificates staying; a rotated token rewrites the hash; none at all removes it
        token_file = tmp_path / "token"
        for token, content in (("first", "first\n"), ("rotated", "rotated\n"),
                               ("rotated", ""),  # an unreadable (empty) file: the hashes stay as they are
                               (None, None)):
            if content is None:
                monkeypatch.delenv("SCALERL_SCRAPE_TOKEN_FILE")
            else:
                token_file.write_text(content)
                monkeypatch.setenv("SCALERL_SCRAPE_TOKEN_FILE", str(token_file))
            rt.sync(namespace, name, scale=True)
            now = _secrets(kube, namespace, name)
            for identity in (*IDENTITIES, "eval"):
                assert _pem(now[identity], "tls.crt") == _pem(first[identity], "tls.crt"), identity
                want = (hashlib.sha256(token.encode()).hexdigest() + "\n").encode() \
                    if token is not None and identity in ROLES else None
                assert (_pem(now[identity], TOKEN_HASH_FILE) if TOKEN_HASH_FILE in now[identity]["data"]
                        else None) == want, (token, identity)

        replaced = new_ca(name)  # e.g. the CA Secret replaced by hand to revoke every certificate
        kube.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": rpc_secret(name, "ca"),
                    "namespace": namespace}, "data": {"ca.crt": base64.b64encode(replaced.cert_pem).decode(),
                                                      "ca.key": base64.b64encode(replaced.key_pem).decode()}})
        rt.sync(namespace, name, scale=True)
        renewed = _secrets(kube, namespace, name)
        for identity in (*IDENTITIES, "eval"):
            x509.load_pem_x509_certificate(_pem(renewed[identity], "tls.crt")).verify_directly_issued_by(
                x509.load_pem_x509_certificate(replaced.cert_pem))
            assert _pem(renewed[identity], "ca.crt") == replaced.cert_pem
        monkeypatch.setenv("SCALERL_NETWORK_POLICIES", "false")  # the chart's networkPolicy.enabled=false
        rt.sync(namespace, name, scale=True)
        assert kube.get("networking.k8s.io/v1", "NetworkPolicy", namespace, policy_name(name)) is None
    finally:
        rt.close()
    mounted = set()
    for kind, role in (("Deployment", "generator"), ("Deployment", "verifier"), ("Deployment", "curriculum"),
                       ("StatefulSet", "learner")):
        w = kube.get("apps/v1", kind, namespace, f"{name}-{role}")
        assert w is not None
        mounted |= {v["secret"]["secretName"] for v in w["spec"]["template"]["spec"]["volumes"] if "secret" in v}
    assert rpc_secret(name, "ca") not in mounted and rpc_secret(name, "learner") in mounted
