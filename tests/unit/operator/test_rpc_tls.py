"""The job's endpoint certificates on the operator's side: when one is issued again (`rpc_tls.due`: pure,
on times), and how every role's Pod gets its own (`render`: the Secret mounted read-only, group-readable
by the Pod's fsGroup, and SCALERL_RPC_TLS_DIR pointing at it); the Secrets themselves on a real API
server: tests/k8s/test_rpc_tls_secrets.py."""

from __future__ import annotations

from datetime import timedelta

from cryptography import x509
from test_render import JOB, NS, OPERATOR_IMAGES, make_spec

from scalerl.rpc.certs import new_ca
from scalerl_operator.control.rpc_tls import due
from scalerl_operator.render.children import desired_replicas, render
from scalerl_operator.render.names import RPC_TLS_MOUNT, rpc_secret


def test_a_certificate_is_issued_again_in_the_last_third_of_its_life_or_under_another_ca() -> None:
    ca = new_ca("j")
    pem = ca.issue("learner", days=90).cert_pem
    start = x509.load_pem_x509_certificate(pem).not_valid_before_utc
    assert not due(pem, start + timedelta(days=59), issuer=ca.cert_pem)
    assert due(pem, start + timedelta(days=61), issuer=ca.cert_pem)  # less than 30 of 90 days left
    assert due(pem, start + timedelta(days=1), issuer=new_ca("j").cert_pem)  # signed by a replaced CA
    assert due(b"", start) and due(b"-----BEGIN CERTIFICATE-----\ngarbage\n", start)


def test_every_role_mounts_its_own_certificate_secret_and_no_api_token() -> None:
    spec = make_spec()
    objs = render(JOB, NS, spec, desired_replicas(spec, live={}, remembered={}), OPERATOR_IMAGES)
    workloads = [o for o in objs if o["kind"] in ("Deployment", "StatefulSet")]
    assert len(workloads) == 4
    for w in workloads:
        role = w["metadata"]["labels"]["app.kubernetes.io/component"]
        pod = w["spec"]["template"]["spec"]
        (vol,) = [v for v in pod["volumes"] if v["name"] == "rpc-tls"]
        assert vol == {"name": "rpc-tls", "secret": {"secretName": rpc_secret(JOB, role), "defaultMode": 0o440}}
        (c,) = pod["containers"]
        assert {"name": "rpc-tls", "mountPath": RPC_TLS_MOUNT, "readOnly": True} in c["volumeMounts"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["SCALERL_RPC_TLS_DIR"] == RPC_TLS_MOUNT and env["SCALERL_RPC_CLIENTS"] == "client"
        assert "SCALERL_RPC_PLAINTEXT" not in env
        assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"]  # 0440 readable by it
        assert pod["automountServiceAccountToken"] is False  # no role talks to the API server


def test_extra_identities_are_listed_to_every_role_and_reserved_names_refused() -> None:
    import pytest
    from pydantic import ValidationError

    spec = make_spec(rpc={"clients": ["eval", "grader.team-a"]})
    objs = render(JOB, NS, spec, desired_replicas(spec, live={}, remembered={}), OPERATOR_IMAGES)
    for w in (o for o in objs if o["kind"] in ("Deployment", "StatefulSet")):
        (c,) = w["spec"]["template"]["spec"]["containers"]
        assert {e["name"]: e.get("value") for e in c["env"]}["SCALERL_RPC_CLIENTS"] == "client,eval,grader.team-a"
    for clients, why in ((["learner"], "learner: already an identity of every job"),
                         (["client"], "client: already an identity"), (["ca"], "ca: already an identity"),
                         (["eval", "eval"], "an identity is listed twice"), (["Eval"], "pattern"),
                         ([f"c{i}" for i in range(17)], "at most 16")):
        with pytest.raises((ValidationError, ValueError)) as err:
            make_spec(rpc={"clients": clients})
        assert why in str(err.value), (clients, str(err.value))
