"""The side port as `scalerl serve` runs it with a TLS folder (`scalerl.rpc.sidetls`), served by uvicorn
on loopback: HTTPS with the role's certificate (verified against the job's CA and name), plain HTTP
refused, /metrics behind the scrape token while the probes answer anyone, and renewed certificate and
token files taken without a restart."""

from __future__ import annotations

import http.client
import os
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scalerl.rpc.certs import new_ca, server_name, write_tls_dir
from scalerl.rpc.security import RpcSecurity
from scalerl.rpc.sidetls import (
    ENV_TOKEN_FILE,
    MetricsGate,
    https_context,
    token_file_problems,
    token_hash,
    write_token_hash,
)
from scalerl.telemetry.metrics import RoleMetrics
from scalerl.telemetry.sideport import SidePort
from sideport_client import https_get

JOB = "sidetls"
LOOPBACK = "127.0.0.1"


def _get(port: int, path: str, ca_pem: bytes, token: str | None = None) -> tuple[int, bytes, bytes]:
    return https_get(port, path, ca_pem, server_name(JOB), token, LOOPBACK)


@pytest.fixture()
def side(tmp_path: Path) -> Iterator[tuple[SidePort, Path, object]]:
    ca = new_ca(JOB)
    folder = write_tls_dir(tmp_path / "generator", ca.issue("generator"), ca)
    write_token_hash(folder, "s3cr3t-scrape-token")
    security = RpcSecurity(tls_dir=str(folder))
    port = SidePort(lambda: True, RoleMetrics("generator"), host=LOOPBACK, port=0, tls=https_context(security.tls_dir),
                    metrics_gate=MetricsGate(str(folder)).allows)
    port.start()
    try:
        yield port, folder, ca
    finally:
        port.stop()


def test_https_with_the_roles_certificate_and_plain_http_refused(side: tuple[SidePort, Path, object]) -> None:
    port, folder, _ = side
    assert port.port and port.url == f"https://{LOOPBACK}:{port.port}"
    ca_pem = (folder / "ca.crt").read_bytes()
    status, _, der = _get(port.port, "/healthz", ca_pem)
    assert status == 200
    assert der == ssl.PEM_cert_to_DER_cert((folder / "tls.crt").read_text())
    # plain HTTP to the TLS port: no HTTP answer comes back
    conn = http.client.HTTPConnection(LOOPBACK, port.port, timeout=10)
    with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):
        conn.request("GET", "/healthz")
        r = conn.getresponse()
        assert r.status != 200  # pragma: no cover - uvicorn never answers plain text on a TLS socket
    conn.close()
    # a client trusting another job's CA refuses the server
    other = new_ca("another-job")
    with pytest.raises(ssl.SSLCertVerificationError):
        _get(port.port, "/healthz", other.cert_pem)


def test_metrics_need_the_scrape_token_and_the_probes_do_not(side: tuple[SidePort, Path, object]) -> None:
    port, folder, _ = side
    assert port.port
    ca_pem = (folder / "ca.crt").read_bytes()
    assert _get(port.port, "/healthz", ca_pem)[0] == 200
    assert _get(port.port, "/readyz", ca_pem)[0] == 200
    for token in (None, "", "wrong", "s3cr3t-scrape-token-but-longer"):
        status, body, _ = _get(port.port, "/metrics", ca_pem, token)
        assert status == 401 and b"scalerl_generator" not in body, token
    status, body, _ = _get(port.port, "/metrics", ca_pem, "s3cr3t-scrape-token")
    assert status == 200 and b"scalerl_generator_ready 1.0" in body
    # a rotated token (the operator patched the Secret; the kubelet refreshed the file): the old one is refused
    time.sleep(0.01)
    write_token_hash(folder, "rotated-token")
    assert _get(port.port, "/metrics", ca_pem, "s3cr3t-scrape-token")[0] == 401
    assert _get(port.port, "/metrics", ca_pem, "rotated-token")[0] == 200


def test_renewed_certificate_files_are_served_without_a_restart(side: tuple[SidePort, Path, object]) -> None:
    port, folder, ca = side
    assert port.port
    ca_pem = (folder / "ca.crt").read_bytes()
    first = _get(port.port, "/healthz", ca_pem)[2]
    renewed = ca.issue("generator")  # type: ignore[attr-defined]
    new = folder.parent / "renewed"
    write_tls_dir(new, renewed, ca)  # type: ignore[arg-type]
    for name in ("tls.crt", "tls.key"):  # replaced the way the kubelet swaps a Secret's files
        os.replace(new / name, folder / name)
    deadline = time.monotonic() + 10
    while (served := _get(port.port, "/healthz", ca_pem)[2]) == first and time.monotonic() < deadline:
        time.sleep(0.05)
    assert served == ssl.PEM_cert_to_DER_cert(renewed.cert_pem.decode()) != first


def test_without_a_token_file_metrics_are_open_over_tls(tmp_path: Path) -> None:
    gate = MetricsGate(str(tmp_path))
    assert gate.allows(None) and gate.allows("Bearer anything")
    (tmp_path / "metrics-token.sha256").write_text("not a digest\n")
    assert not gate.allows(f"Bearer {'x'}") and not gate.allows(None)  # malformed: nobody, never everybody
    (tmp_path / "metrics-token.sha256").write_text(token_hash("t") + "\n")
    assert gate.allows("Bearer t") and gate.allows("bearer  t ") and not gate.allows("Basic t")


def test_a_token_file_that_cannot_be_read_is_one_line_naming_the_setting(tmp_path: Path) -> None:
    assert token_file_problems({}) == []
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "ok").write_text("tok\n")
    assert token_file_problems({ENV_TOKEN_FILE: str(tmp_path / "ok")}) == []
    for name in ("missing", "empty"):
        problems = token_file_problems({ENV_TOKEN_FILE: str(tmp_path / name)})
        assert len(problems) == 1 and problems[0].startswith(f"{ENV_TOKEN_FILE}: ") and name in problems[0]
