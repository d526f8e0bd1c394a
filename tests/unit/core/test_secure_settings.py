"""Kafka SASL/TLS settings (SCALERL_KAFKA_*) and the S3 settings and credential choice (S3_*, AWS_*):
what they resolve to, and malformed or inapplicable ones refused with one line naming the variable
(exit 2 from `scalerl serve` and `scalerl dlq`, before any connection)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from minio.credentials.providers import EnvAWSProvider, IamAwsProvider, StaticProvider

from scalerl.bus.security import KafkaSecurity, KafkaSecurityError, kafka_security_problem
from scalerl.cli import main
from scalerl.store.s3 import S3Store
from scalerl.store.s3_settings import S3SettingsError, credential_source, credentials_provider, s3_settings

K = "SCALERL_KAFKA_"
CA_PEM = Path(ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt")


def test_unset_means_plaintext_and_no_tls_or_sasl_arguments() -> None:
    sec = KafkaSecurity.from_env({})
    assert (sec.protocol, sec.sasl, sec.tls) == ("PLAINTEXT", False, False)
    assert sec.client_kwargs() == {"security_protocol": "PLAINTEXT"}


def test_sasl_ssl_scram_resolves_to_client_arguments(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text(CA_PEM.read_text())
    sec = KafkaSecurity.from_env({f"{K}SECURITY_PROTOCOL": "sasl_ssl", f"{K}SASL_MECHANISM": "scram-sha-512",
                                  f"{K}SASL_USERNAME": "alice", f"{K}SASL_PASSWORD": "s3cret",
                                  f"{K}SSL_CAFILE": str(ca)})
    kw = sec.client_kwargs()
    assert {k: kw[k] for k in ("security_protocol", "sasl_mechanism", "sasl_plain_username",
                               "sasl_plain_password", "ssl_check_hostname")} == {
        "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "alice",
        "sasl_plain_password": "s3cret", "ssl_check_hostname": True}
    assert isinstance(kw["ssl_context"], ssl.SSLContext) and kw["ssl_context"].verify_mode == ssl.CERT_REQUIRED
    assert "s3cret" not in repr(sec) and "s3cret" not in sec.describe()


@pytest.mark.parametrize(("env", "expect"), [
    ({"SECURITY_PROTOCOL": "TLS"}, f"{K}SECURITY_PROTOCOL: 'TLS' is not one of PLAINTEXT, SSL"),
    ({"SECURITY_PROTOCOL": "SASL_SSL", "SASL_USERNAME": "a", "SASL_PASSWORD": "b"},
     f"{K}SASL_MECHANISM: '' is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"),
    ({"SECURITY_PROTOCOL": "SASL_PLAINTEXT", "SASL_MECHANISM": "SCRAM-SHA-1", "SASL_USERNAME": "a",
      "SASL_PASSWORD": "b"}, f"{K}SASL_MECHANISM: 'SCRAM-SHA-1'"),
    ({"SECURITY_PROTOCOL": "SASL_PLAINTEXT", "SASL_MECHANISM": "PLAIN", "SASL_USERNAME": "a"},
     f"{K}SASL_PASSWORD: missing; required with SASL_PLAINTEXT"),
    ({"SASL_USERNAME": "a"}, f"{K}SASL_USERNAME: set, but PLAINTEXT uses no SASL"),
    ({"SSL_CAFILE": "/etc/hostname"}, f"{K}SSL_CAFILE: set, but PLAINTEXT uses no TLS"),
    ({"SECURITY_PROTOCOL": "SSL", "SSL_CAFILE": "/nonexistent/ca.crt"},
     f"{K}SSL_CAFILE: '/nonexistent/ca.crt' is not a readable file"),
    ({"SECURITY_PROTOCOL": "SSL", "SSL_CERTFILE": "/etc/hostname"},
     f"{K}SSL_KEYFILE: mutual TLS needs both"),
    ({"SECURITY_PROTOCOL": "SSL", "SSL_CHECK_HOSTNAME": "maybe"}, f"{K}SSL_CHECK_HOSTNAME: 'maybe' is not true"),
])
def test_malformed_kafka_settings_name_the_variable(env: dict[str, str], expect: str) -> None:
    full = {K + k: v for k, v in env.items()}
    with pytest.raises(KafkaSecurityError) as err:
        KafkaSecurity.from_env(full)
    assert str(err.value).startswith(expect) and "\n" not in str(err.value)
    assert kafka_security_problem(full) == str(err.value)


def test_serve_and_dlq_refuse_bad_kafka_settings_with_exit_2(tmp_path, monkeypatch, capsys) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: t\ntask:\n  kind: addition\n  digits: 2\noff_policy:\n  mode: pipeline\n")
    monkeypatch.setenv(f"{K}SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv(f"{K}SASL_MECHANISM", "GSSAPI")
    for argv in (["serve", "verifier", "--job", str(spec), "--bus", "kafka://127.0.0.1:1", "--store",
                  "file:///tmp/x"], ["dlq", "list", "--bus", "kafka://127.0.0.1:1", "--job", "j"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{K}SASL_MECHANISM: 'GSSAPI'" in err, err


# ---- S3 ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("env", "source", "provider"), [
    ({"S3_ACCESS_KEY": "a", "S3_SECRET_KEY": "b", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"},
     "static", StaticProvider),
    ({"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}, "env", EnvAWSProvider),
    ({"AWS_WEB_IDENTITY_TOKEN_FILE": "{token}", "AWS_ROLE_ARN": "arn:aws:iam::1:role/r"}, "web-identity",
     IamAwsProvider),
    ({"AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://169.254.170.23/v1/credentials"}, "container", IamAwsProvider),
    ({}, "instance", IamAwsProvider),
])
def test_credential_source_is_the_first_configured(tmp_path, env, source, provider) -> None:
    token = tmp_path / "token"
    token.write_text("jwt")
    env = {k: v.replace("{token}", str(token)) for k, v in env.items()}
    settings = s3_settings(env)
    assert credential_source(env) == settings.credentials == source
    assert type(credentials_provider(settings)) is provider
    if source == "static":
        creds = credentials_provider(settings).retrieve()
        assert (creds.access_key, creds.secret_key) == ("a", "b")
    assert "secret_key" not in repr(settings)


@pytest.mark.parametrize(("env", "expect"), [
    ({"S3_ACCESS_KEY": "a"}, "S3_SECRET_KEY: not set, but S3_ACCESS_KEY is"),
    ({"AWS_SECRET_ACCESS_KEY": "a"}, "AWS_ACCESS_KEY_ID: not set, but AWS_SECRET_ACCESS_KEY is"),
    ({"AWS_ROLE_ARN": "arn"}, "AWS_WEB_IDENTITY_TOKEN_FILE: not set, but AWS_ROLE_ARN is"),
    ({"AWS_ROLE_ARN": "arn", "AWS_WEB_IDENTITY_TOKEN_FILE": "/nonexistent/t"}, "AWS_WEB_IDENTITY_TOKEN_FILE: "
     "'/nonexistent/t' is not a readable file"),
    ({"S3_REGION": "EU West"}, "S3_REGION: 'EU West' is not a region name"),
    ({"S3_ENDPOINT": "minio:9000"}, "S3_ENDPOINT: 'minio:9000' is not http(s)://host[:port]"),
    ({"S3_ADDRESSING_STYLE": "dns"}, "S3_ADDRESSING_STYLE: 'dns' is not one of auto, path, virtual"),
])
def test_malformed_s3_settings_name_the_variable(env, expect) -> None:
    with pytest.raises(S3SettingsError, match="^" + expect.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        s3_settings(env)


def test_endpoint_and_region_defaults() -> None:
    assert s3_settings({"S3_REGION": "eu-west-3"}).endpoint == "https://s3.eu-west-3.amazonaws.com"
    assert s3_settings({"AWS_REGION": "ap-south-1"}).region == "ap-south-1"
    no_region = s3_settings({})
    assert (no_region.endpoint, no_region.region, no_region.addressing) == ("https://s3.amazonaws.com", None, "auto")


@pytest.mark.parametrize(("style", "endpoint", "url"), [
    ("path", "http://minio.local:9000", "http://minio.local:9000/bkt/k"),
    ("virtual", "http://minio.local:9000", "http://bkt.minio.local:9000/k"),
    ("auto", "http://minio.local:9000", "http://minio.local:9000/bkt/k"),
    ("path", "https://s3.eu-west-3.amazonaws.com", "https://s3.eu-west-3.amazonaws.com/bkt/k"),
    ("auto", "https://s3.eu-west-3.amazonaws.com", "https://bkt.s3.eu-west-3.amazonaws.com/k"),
])
def test_addressing_style_decides_the_request_url(style, endpoint, url) -> None:
    settings = s3_settings({"S3_ENDPOINT": endpoint, "S3_REGION": "eu-west-3", "S3_ACCESS_KEY": "a",
                            "S3_SECRET_KEY": "b", "S3_ADDRESSING_STYLE": style})
    store = S3Store.from_settings(settings, "bkt", create_bucket=False)
    built = store.client._base_url.build(method="GET", region="eu-west-3", bucket_name="bkt", object_name="k")
    assert built.geturl() == url


def test_serve_refuses_bad_s3_settings_with_exit_2(tmp_path, monkeypatch, capsys) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: t\ntask:\n  kind: addition\n  digits: 2\noff_policy:\n  mode: pipeline\n")
    monkeypatch.setenv("S3_ACCESS_KEY", "only-half")
    monkeypatch.delenv("S3_SECRET_KEY", raising=False)
    code = main(["serve", "learner", "--job", str(spec), "--bus", "kafka://127.0.0.1:1", "--store", "s3://bkt/p"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "S3_SECRET_KEY: not set, but S3_ACCESS_KEY is" in err, err
