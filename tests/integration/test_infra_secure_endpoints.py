"""The roles' bus through the test broker's SASL_SSL listener (SCRAM-SHA-512/256 and PLAIN over TLS with the
test CA, settings from SCALERL_KAFKA_* as in a pod), and the S3 store against the real MinIO with a region
and with credentials from AWS_* environment variables only (no static S3_* keys)."""

from __future__ import annotations

import time

import pytest

from infra_session import sasl_listener
from scalerl.bus import TopicNames, open_bus
from scalerl.bus.kafka import KafkaBus
from scalerl.bus.security import KafkaConnectError
from scalerl.messages import MetricRecord
from scalerl.store.factory import open_store
from scalerl.store.s3 import S3Store

pytestmark = pytest.mark.infra


@pytest.fixture
def sasl(infra, monkeypatch) -> dict[str, str]:
    values = sasl_listener(infra.values.get)
    for k in ("SECURITY_PROTOCOL", "SASL_MECHANISM", "SASL_USERNAME", "SASL_PASSWORD", "SSL_CAFILE"):
        monkeypatch.delenv(f"SCALERL_KAFKA_{k}", raising=False)
    return values


def _env(monkeypatch, sasl: dict[str, str], mechanism: str, password: str | None = None) -> None:
    monkeypatch.setenv("SCALERL_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("SCALERL_KAFKA_SASL_MECHANISM", mechanism)
    monkeypatch.setenv("SCALERL_KAFKA_SASL_USERNAME", sasl["KAFKA_SASL_USERNAME"])
    monkeypatch.setenv("SCALERL_KAFKA_SASL_PASSWORD", password or sasl["KAFKA_SASL_PASSWORD"])
    monkeypatch.setenv("SCALERL_KAFKA_SSL_CAFILE", sasl["KAFKA_SSL_CAFILE"])


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"])
def test_bus_round_trip_commit_and_admin_through_sasl_ssl(sasl, monkeypatch, unique, poll_until, mechanism):
    _env(monkeypatch, sasl, mechanism)
    bus = open_bus(f"kafka://{sasl['KAFKA_SASL_BOOTSTRAP']}")  # as a role opens it: settings from the env
    assert isinstance(bus, KafkaBus) and bus.security.protocol == "SASL_SSL"
    topics = TopicNames(unique)
    try:
        bus.ensure_topics([topics.metrics], partitions=2)
        assert bus.list_topics(f"{unique}.") == [topics.metrics]
        assert bus.partitions(topics.metrics) == [0, 1]
        sent = [MetricRecord(kind="step", step=i, values={"loss": float(i)}) for i in range(10)]
        for i, m in enumerate(sent):
            bus.publish(topics.metrics, m, key=f"k{i}")
        bus.flush(10)
        group = f"{unique}-g"
        c = bus.consumer([topics.metrics], group)
        try:
            got = poll_until(c, len(sent))
            assert sorted(r.value.step for r in got) == list(range(10))
            c.commit()
        finally:
            c.close()
        assert bus.lag(group, topics.metrics) == 0
        bus.delete_topics([topics.metrics])
        deadline = time.monotonic() + 30
        while bus.list_topics(f"{unique}.") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert bus.list_topics(f"{unique}.") == []
    finally:
        bus.close()


def test_wrong_password_is_a_clear_error_within_the_timeout(sasl, monkeypatch):
    _env(monkeypatch, sasl, "SCRAM-SHA-512", password="wrong-password")
    bus = KafkaBus(sasl["KAFKA_SASL_BOOTSTRAP"], request_timeout_s=4)
    t0 = time.monotonic()
    with pytest.raises(KafkaConnectError) as err:
        bus.list_topics()
    took = time.monotonic() - t0
    bus.close()
    assert "SASL SCRAM-SHA-512 authentication as 'scalerl' failed" in str(err.value)
    assert "wrong-password" not in str(err.value)
    assert took < 15, took


def test_untrusted_ca_is_named_as_a_tls_failure(sasl, monkeypatch, tmp_path):
    other = tmp_path / "other-ca.crt"  # a CA that did not sign the broker's certificate
    import ssl
    from pathlib import Path

    other.write_text(Path(ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt").read_text())
    _env(monkeypatch, sasl, "SCRAM-SHA-512")
    monkeypatch.setenv("SCALERL_KAFKA_SSL_CAFILE", str(other))
    bus = KafkaBus(sasl["KAFKA_SASL_BOOTSTRAP"], request_timeout_s=4)
    with pytest.raises(KafkaConnectError, match="TLS handshake failed"):
        bus.list_topics()
    bus.close()


# ---- S3 ------------------------------------------------------------------------------------------

def test_s3_with_region_and_credentials_from_aws_env_only(infra, monkeypatch, unique):
    for k in ("S3_ACCESS_KEY", "S3_SECRET_KEY", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("S3_ENDPOINT", infra.s3_endpoint)
    monkeypatch.setenv("S3_REGION", infra.s3_region)
    monkeypatch.setenv("S3_ADDRESSING_STYLE", "path")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", infra.s3_access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", infra.s3_secret_key)
    store = open_store(f"s3://scalerl-it/{unique}")
    assert isinstance(store, S3Store) and store.region == infra.s3_region
    assert type(store.client._provider).__name__ == "EnvAWSProvider"
    store.put_bytes("a/b.bin", b"\x01\x02")
    assert store.get_bytes("a/b.bin") == b"\x01\x02" and store.list() == ["a/b.bin"]
    store.delete("a/b.bin")
    assert store.list() == []


def test_s3_signing_region_is_used(infra, monkeypatch, unique):
    """A region the server is not in is refused by the server (so the setting reaches the signature)."""
    monkeypatch.setenv("S3_ENDPOINT", infra.s3_endpoint)
    monkeypatch.setenv("S3_ACCESS_KEY", infra.s3_access_key)
    monkeypatch.setenv("S3_SECRET_KEY", infra.s3_secret_key)
    monkeypatch.setenv("S3_REGION", "eu-west-3" if infra.s3_region != "eu-west-3" else "us-west-2")
    from minio.error import S3Error

    with pytest.raises(S3Error, match=f"use region {infra.s3_region}"):
        open_store(f"s3://scalerl-it/{unique}").put_bytes("x", b"x")
