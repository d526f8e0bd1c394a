"""cert-manager mode of the role endpoints' certificates, its pure parts (rpc_certmanager): the setting,
what is rendered for a job. The objects on a real API server with a real cert-manager:
tests/k8s/test_rpc_certmanager.py."""

from __future__ import annotations

import pytest

from scalerl.rpc.certs import server_name
from scalerl_operator.__main__ import EXIT_BAD_INPUT, main
from scalerl_operator.control.rpc_certmanager import configured_mode, objects
from scalerl_operator.control.rpc_tls import IDENTITIES

JOB = {"apiVersion": "scalerl.dev/v1alpha1", "kind": "RLJob",
       "metadata": {"name": "j", "namespace": "ns", "uid": "u-1"}}


@pytest.mark.parametrize(("raw", "mode"),
                         [(None, "auto"), ("cert-manager", "cert-manager"), (" Operator ", "operator")])
def test_the_setting(raw: str | None, mode: str) -> None:
    assert configured_mode({} if raw is None else {"SCALERL_RPC_CERTIFICATES": raw}) == mode


def test_a_malformed_setting_is_refused_at_start(capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCALERL_RPC_CERTIFICATES", "vault")
    assert main([]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["scalerl-operator: error: SCALERL_RPC_CERTIFICATES: must be one of auto, cert-manager, operator "
                   "(got 'vault')"]


def test_a_self_signed_ca_per_job_signs_one_certificate_per_identity() -> None:
    out = objects(JOB, extra=("eval",))
    by = {(o["kind"], o["metadata"]["name"]): o for o in out}
    assert by[("Issuer", "j-rpc-selfsigned")]["spec"] == {"selfSigned": {}}
    ca = by[("Certificate", "j-rpc-ca")]["spec"]
    assert ca["isCA"] and ca["issuerRef"]["name"] == "j-rpc-selfsigned" and ca["secretName"] == "j-rpc-ca"
    assert ca["privateKey"]["rotationPolicy"] == "Never"  # leaves issued before a renewal still verify
    assert by[("Issuer", "j-rpc-ca")]["spec"] == {"ca": {"secretName": "j-rpc-ca"}}
    leaves = [o["spec"] for o in out if o["kind"] == "Certificate" and not o["spec"].get("isCA")]
    assert [s["commonName"] for s in leaves] == [*IDENTITIES, "eval"]
    for s in leaves:
        assert s["secretName"] == f"j-rpc-{s['commonName']}" and s["issuerRef"]["name"] == "j-rpc-ca"
        assert s["dnsNames"] == [server_name("j")] and {"server auth", "client auth"} <= set(s["usages"])
        assert s["duration"] == "2160h" and s["renewBefore"] == "720h"  # 90 days, renewed with a third left
    for o in out:
        assert o["metadata"]["ownerReferences"] == [{"apiVersion": "scalerl.dev/v1alpha1", "kind": "RLJob", "name": "j",
                                                     "uid": "u-1", "controller": True, "blockOwnerDeletion": True}]
