"""A test's client of a role's side port as `scalerl serve` runs it with TLS (`scalerl.rpc.sidetls`): an
HTTPS GET that verifies the job's CA and the name every certificate of the job carries, with an optional
scrape token."""

from __future__ import annotations

import http.client
import socket
import ssl
from pathlib import Path

from cryptography import x509


def https_get(port: int, path: str, ca_pem: bytes, name: str, token: str | None = None,
              host: str = "127.0.0.1", timeout_s: float = 30) -> tuple[int, bytes, bytes]:
    """(status, body, the server certificate DER) of `GET path`, the server checked against `ca_pem` and
    `name` whatever address was dialled; `token`: sent as `Authorization: Bearer`."""
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    with ctx.wrap_socket(socket.create_connection((host, port), timeout=timeout_s), server_hostname=name) as raw:
        auth = f"Authorization: Bearer {token}\r\n" if token is not None else ""
        raw.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n".encode())
        r = http.client.HTTPResponse(raw)  # type: ignore[arg-type]
        r.begin()
        return r.status, r.read(), raw.getpeercert(binary_form=True) or b""


def side_get(port: int, path: str, tls_dir: Path, token: str | None = None) -> tuple[int, bytes]:
    """`https_get` with the CA and job name of a role's TLS folder (`<out>/tls/<role>` of a local run)."""
    cert = x509.load_pem_x509_certificate((tls_dir / "tls.crt").read_bytes())
    name = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName)[0]
    status, body, _ = https_get(port, path, (tls_dir / "ca.crt").read_bytes(), name, token)
    return status, body
