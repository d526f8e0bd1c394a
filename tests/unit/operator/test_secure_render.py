"""spec.bus.security and the S3 settings in the RLJob: validation and what the role pods get (env from
Secret refs, the CA mounted as a file, no S3 keys without credentialsSecret)."""

from __future__ import annotations

from typing import Any

import pytest
from test_render import make_spec

from scalerl.config import SpecError
from scalerl_operator.render.children import render


def _pods(spec: Any) -> list[dict[str, Any]]:
    objs = render("j", "ns", spec, {"curriculum": 1, "generator": 1, "verifier": 1, "learner": 2})
    return [o["spec"]["template"]["spec"] for o in objs if o["kind"] in ("Deployment", "StatefulSet")]


def test_sasl_ssl_gives_every_role_secret_refs_and_the_ca_file() -> None:
    spec = make_spec(bus={"bootstrap": "kafka:9093", "security": {
        "protocol": "SASL_SSL", "saslMechanism": "SCRAM-SHA-512",
        "secretRef": {"name": "kafka-auth", "caKey": "ca.pem"}}})
    pods = _pods(spec)
    assert len(pods) == 4
    for pod in pods:
        c = pod["containers"][0]
        env = {e["name"]: e for e in c["env"]}
        assert env["SCALERL_KAFKA_SECURITY_PROTOCOL"]["value"] == "SASL_SSL"
        assert env["SCALERL_KAFKA_SASL_MECHANISM"]["value"] == "SCRAM-SHA-512"
        assert env["SCALERL_KAFKA_SASL_USERNAME"]["valueFrom"]["secretKeyRef"] == {"name": "kafka-auth",
                                                                                  "key": "username"}
        assert env["SCALERL_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "kafka-auth",
                                                                                  "key": "password"}
        assert env["SCALERL_KAFKA_SSL_CAFILE"]["value"] == "/etc/scalerl/kafka-ca/ca.crt"
        assert {"name": "kafka-ca", "secret": {"secretName": "kafka-auth",
                                               "items": [{"key": "ca.pem", "path": "ca.crt"}]}} in pod["volumes"]
        assert {"name": "kafka-ca", "mountPath": "/etc/scalerl/kafka-ca", "readOnly": True} in c["volumeMounts"]


def test_plaintext_adds_nothing_and_no_secret_means_no_s3_keys() -> None:
    spec = make_spec(store={"uri": "s3://bucket/runs", "region": "eu-west-3", "addressingStyle": "virtual"})
    for pod in _pods(spec):
        names = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert not any(n.startswith("SCALERL_KAFKA_") for n in names)
        assert "S3_ACCESS_KEY" not in names and "S3_SECRET_KEY" not in names and "S3_ENDPOINT" not in names
        assert (names["S3_REGION"], names["S3_ADDRESSING_STYLE"]) == ("eu-west-3", "virtual")
        assert all(v["name"] != "kafka-ca" for v in pod["volumes"])


@pytest.mark.parametrize(("security", "expect"), [
    ({"protocol": "SASL_SSL", "secretRef": {"name": "s"}}, "saslMechanism: required with SASL_SSL"),
    ({"protocol": "SASL_PLAINTEXT", "saslMechanism": "PLAIN"}, "secretRef: required with SASL_PLAINTEXT"),
    ({"protocol": "SSL", "saslMechanism": "PLAIN"}, "saslMechanism: SSL uses no SASL"),
    ({"protocol": "SASL_PLAINTEXT", "saslMechanism": "PLAIN", "secretRef": {"name": "s", "caKey": "ca"}},
     "secretRef.caKey: SASL_PLAINTEXT uses no TLS"),
    ({"protocol": "SASL_PLAINTEXT", "saslMechanism": "PLAIN", "secretRef": {"name": "s"}, "checkHostname": False},
     "checkHostname: SASL_PLAINTEXT uses no TLS"),
    ({"protocol": "SASL_SSL", "saslMechanism": "GSSAPI", "secretRef": {"name": "s"}}, "saslMechanism"),
])
def test_inconsistent_security_is_refused_naming_the_field(security: dict[str, Any], expect: str) -> None:
    with pytest.raises(SpecError, match="^spec.bus.security." + expect.replace("(", r"\(")):
        make_spec(bus={"bootstrap": "kafka:9093", "security": security})


def test_store_region_is_validated() -> None:
    with pytest.raises(SpecError, match=r"^spec\.store\.region"):
        make_spec(store={"uri": "s3://bucket/runs", "region": "EU West"})
