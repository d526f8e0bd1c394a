"""The role endpoints' protection, as settings and pure rules: who may call what (`allowed`), what the
environment must say (`RpcSecurity.from_env`: one line per problem), `scalerl serve` refusing to start a
gRPC port nobody chose a protection for, and the job CA's certificates (`scalerl.rpc.certs`)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from scalerl.rpc.certs import identity_of, new_ca, server_name, write_tls_dir
from scalerl.rpc.security import (
    ENV_CLIENTS,
    ENV_PLAINTEXT,
    ENV_TLS_DIR,
    ROLES,
    RpcSecurity,
    RpcSecurityError,
    allowed,
)

GEN = "/scalerl.v1.Generator/"


def test_only_the_learner_updates_weights_and_only_the_job_generates() -> None:
    for who in (*ROLES, "operator", "eval", ""):
        assert allowed(GEN + "UpdateWeights", who, frozenset({"eval"})) is (who == "learner"), who
        assert allowed(GEN + "Generate", who, frozenset({"eval"})) is (who in ROLES or who == "eval"), who
        assert allowed("/scalerl.v1.Verifier/Score", who) is (who in ROLES), who
        assert allowed(GEN + "Status", who) is (who in ROLES or who == "operator"), who
        assert allowed("/grpc.health.v1.Health/Check", who) is (who in ROLES or who == "operator"), who
    assert not allowed(GEN + "Generate", "eval")  # an extra identity only when listed
    assert not allowed("/scalerl.v1.Generator/Shutdown", "learner")  # not in the table: nobody
    assert not allowed("/scalerl.v1.Generator/updateweights", "learner")


def _dir(tmp_path: Path, identity: str = "learner") -> Path:
    ca = new_ca("tiny")
    return write_tls_dir(tmp_path / identity, ca.issue(identity), ca)


@pytest.mark.parametrize("env, lines", [
    ({}, [f"{ENV_TLS_DIR}: not set; set it to a folder with tls.crt, tls.key and ca.crt"]),
    ({ENV_PLAINTEXT: "false"}, [f"{ENV_TLS_DIR}: not set"]),
    ({ENV_PLAINTEXT: "maybe"}, [f"{ENV_PLAINTEXT}: 'maybe' is not allowed (true or false)", f"{ENV_TLS_DIR}: not set"]),
    ({ENV_PLAINTEXT: "true", ENV_TLS_DIR: "{dir}"}, [f"{ENV_TLS_DIR} and {ENV_PLAINTEXT}=true: set one of them"]),
    ({ENV_PLAINTEXT: "true", ENV_CLIENTS: "eval"}, [f"{ENV_CLIENTS}: extra identities need TLS"]),
    ({ENV_TLS_DIR: "{tmp}/nowhere"}, [f"{ENV_TLS_DIR}: {{tmp}}/nowhere/tls.crt is missing or unreadable",
                                      f"{ENV_TLS_DIR}: {{tmp}}/nowhere/tls.key is missing",
                                      f"{ENV_TLS_DIR}: {{tmp}}/nowhere/ca.crt is missing"]),
    ({ENV_TLS_DIR: "{dir}", ENV_CLIENTS: "Eval Client,learner"},
     [f"{ENV_CLIENTS}: 'Eval Client' is not an identity", f"{ENV_CLIENTS}: 'learner' is a role of the job"]),
])
def test_malformed_settings_say_which_and_what_is_allowed(tmp_path: Path, env: dict[str, str],
                                                          lines: list[str]) -> None:
    folder = _dir(tmp_path)
    env = {k: v.format(dir=folder, tmp=tmp_path) for k, v in env.items()}
    with pytest.raises(RpcSecurityError) as err:
        RpcSecurity.from_env(env)
    got = str(err.value).splitlines()
    assert len(got) == len(lines), got
    for line, want in zip(got, lines, strict=True):
        assert line.startswith(want.format(tmp=tmp_path)), (line, want)


def test_usable_settings(tmp_path: Path) -> None:
    folder = _dir(tmp_path)
    tls = RpcSecurity.from_env({ENV_TLS_DIR: str(folder), ENV_CLIENTS: " eval, grader "})
    assert (tls.plaintext, tls.clients, tls.identity) == (False, frozenset({"eval", "grader"}), "learner")
    assert len(tls.interceptors()) == 1
    plain = RpcSecurity.from_env({ENV_PLAINTEXT: "true"})
    assert plain.plaintext and plain.interceptors() == [] and plain.identity == ""


def test_serve_refuses_a_grpc_port_with_no_protection_chosen(tmp_path: Path, monkeypatch, capsys) -> None:
    from scalerl.cli import main

    monkeypatch.delenv(ENV_PLAINTEXT)
    spec = tmp_path / "job.yaml"
    spec.write_text("name: tiny\n")
    argv = ["serve", "verifier", "--job", str(spec), "--bus", "kafka://127.0.0.1:1", "--store", "file:///tmp/s"]
    assert main(argv) == 2
    assert capsys.readouterr().err == (f"scalerl serve: error: {ENV_TLS_DIR}: not set; set it to a folder with "
                                       "tls.crt, tls.key and ca.crt (the role's certificate, its key and the job's "
                                       f"CA), or {ENV_PLAINTEXT}=true for local development (no encryption, no "
                                       "authentication)\n")


def test_the_ca_issues_verifiable_certificates_for_one_job(tmp_path: Path) -> None:
    ca = new_ca("tiny")
    issued = ca.issue("generator", days=3)
    cert = x509.load_pem_x509_certificate(issued.cert_pem)
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    cert.verify_directly_issued_by(ca_cert)  # raises if not signed by the job's CA
    from cryptography.exceptions import InvalidSignature

    with pytest.raises((InvalidSignature, ValueError)):
        cert.verify_directly_issued_by(x509.load_pem_x509_certificate(new_ca("tiny").cert_pem))
    assert identity_of(issued.cert_pem) == "generator"
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [server_name("tiny")] == ["tiny.rpc.scalerl"]
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert ca_cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert 2.9 < (cert.not_valid_after_utc - cert.not_valid_before_utc).total_seconds() / 86400 < 3.01
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    folder = write_tls_dir(tmp_path / "gen", issued, ca)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / "tls.key").stat().st_mode) == 0o600
    assert (folder / "ca.crt").read_bytes() == ca.cert_pem and b"PRIVATE" not in (folder / "ca.crt").read_bytes()
    with pytest.raises(ValueError, match="identity: 'Learner'"):
        ca.issue("Learner")
