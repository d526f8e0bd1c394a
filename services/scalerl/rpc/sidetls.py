"""How a role's side port (/healthz, /readyz, /metrics) is protected: HTTPS with the role's own certificate,
and a scrape token for /metrics.

    context = https_context(security.tls_dir)  # not in plain text (SCALERL_RPC_PLAINTEXT=true)
    gate = MetricsGate(security.tls_dir)       # gate.allows(request's Authorization header) -> bool

Choices:
1. **HTTPS whenever the gRPC port is TLS**, with the same certificate and key (`SCALERL_RPC_TLS_DIR`), read
   again on the first connection after the files change (a renewed Secret), like the gRPC port. No client
   certificate is asked for: the kubelet's HTTPS probes present none and verify nothing, and a cluster-wide
   Prometheus cannot hold a certificate of every job's CA.
2. **/healthz and /readyz answer anyone who reaches the port** (the kubelet cannot authenticate): they say
   only alive/ready, the role's name and, when not ready, the type of the failed check's exception. The
   NetworkPolicy of the job limits who reaches the port (the job's Pods, the scrapers).
3. **/metrics needs `Authorization: Bearer <scrape token>`** when the TLS folder holds
   `metrics-token.sha256` (the hex SHA-256 of the token; the operator writes it into every role's
   certificate Secret from the chart's scrape-token Secret, the local launcher beside each role's
   certificate). Only the hash is on the role's side: a role, its Pod spec or its Secret never hold the token.
   Without that file /metrics is open to whoever reaches the port (a warning at start). The comparison is
   constant-time; the file is read again when it changes (a rotated token).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

TOKEN_HASH_FILE = "metrics-token.sha256"  # in SCALERL_RPC_TLS_DIR (a key of the role's certificate Secret)
ENV_TOKEN_FILE = "SCALERL_METRICS_TOKEN_FILE"  # the launcher: the scrape token to use (else it makes one)
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def token_hash(token: str) -> str:
    """The hex SHA-256 of a scrape token (surrounding whitespace ignored), as `metrics-token.sha256` holds it."""
    return hashlib.sha256(token.strip().encode()).hexdigest()


def new_token() -> str:
    """A fresh scrape token: 256 random bits, URL-safe text."""
    return secrets.token_urlsafe(32)


def files_stamp(paths: list[Path]) -> tuple[tuple[int, int], ...]:
    """(inode, mtime) of each file, following links: changes when one is replaced (the kubelet swaps a mounted
    Secret's files through a symlink). Also the gRPC port's (`RpcSecurity.files_stamp`)."""
    out = []
    for p in paths:
        st = p.stat()
        out.append((st.st_ino, st.st_mtime_ns))
    return tuple(out)


class _ReloadingContext(ssl.SSLContext):
    """A server context whose certificate chain is loaded again, before a new connection's handshake, when
    the files changed. asyncio wraps every accepted connection with `wrap_bio` in the event loop's thread,
    so the reload never races a handshake."""

    tls_dir: Path
    files_stamp: tuple[tuple[int, int], ...]

    def _files(self) -> list[Path]:
        return [self.tls_dir / "tls.crt", self.tls_dir / "tls.key"]

    def load(self) -> None:
        stamp = files_stamp(self._files())
        cert, key = self._files()
        self.load_cert_chain(str(cert), str(key))
        self.files_stamp = stamp

    def wrap_bio(self, *args: Any, **kwargs: Any) -> ssl.SSLObject:
        try:
            if files_stamp(self._files()) != self.files_stamp:
                self.load()
                log.info("side port: certificate files in %s changed; new connections use them", self.tls_dir)
        except (OSError, ssl.SSLError) as exc:  # half-written: keep the current chain, try again next time
            log.warning("side port: cannot read the certificate files in %s again (%s); keeping the current ones",
                        self.tls_dir, exc)
        return super().wrap_bio(*args, **kwargs)


def https_context(tls_dir: str) -> ssl.SSLContext:
    """The side port's server TLS context (TLS 1.2 or later) with the certificate in `tls_dir`."""
    ctx = _ReloadingContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.tls_dir = Path(tls_dir)
    ctx.load()
    return ctx


class MetricsGate:
    """Who may read /metrics: holders of the scrape token whose hash is in `<tls_dir>/metrics-token.sha256`;
    anyone when there is no such file (or no TLS folder)."""

    def __init__(self, tls_dir: str) -> None:
        self.path = Path(tls_dir) / TOKEN_HASH_FILE if tls_dir else None
        self._stamp: tuple[tuple[int, int], ...] | None = None
        self._hash: str | None = None
        if self.expected() is None:
            log.warning("side port: /metrics needs no token (no %s in %s): anyone who reaches the port reads it",
                        TOKEN_HASH_FILE, tls_dir or "SCALERL_RPC_TLS_DIR")

    def expected(self) -> str | None:
        """The current token hash (None: no file, /metrics open); a malformed file refuses everyone."""
        if self.path is None:
            return None
        try:
            stamp = files_stamp([self.path])
        except FileNotFoundError:
            return None
        if stamp != self._stamp:
            text = self.path.read_text().strip().lower()
            if not _HEX64.match(text):
                log.warning("side port: %s is not a hex SHA-256; /metrics refuses every token", self.path)
                text = "!"  # matches no hex digest
            self._stamp, self._hash = stamp, text
        return self._hash

    def allows(self, authorization: str | None) -> bool:
        expected = self.expected()
        if expected is None:
            return True
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return False
        return hmac.compare_digest(token_hash(token), expected)


def read_token_file(path: str | os.PathLike[str], setting: str = ENV_TOKEN_FILE) -> str:
    """The scrape token in `path` (surrounding whitespace ignored); ValueError naming `setting` (the variable
    that named the file) when it cannot be read or is empty."""
    try:
        token = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{setting}: cannot read {path} ({getattr(exc, 'strerror', None) or exc})") from exc
    if not token:
        raise ValueError(f"{setting}: {path} is empty (want the scrape token)")
    return token


def token_file_problems(env: Mapping[str, str], setting: str = ENV_TOKEN_FILE) -> list[str]:
    """What is wrong with the token file the variable `setting` names in `env` (empty: unset or usable)."""
    path = env.get(setting, "")
    try:
        if path:
            read_token_file(path, setting)
    except ValueError as exc:
        return [str(exc)]
    return []


def write_token_hash(folder: str | os.PathLike[str], token: str) -> Path:
    """`<folder>/metrics-token.sha256` for `token` (the launcher's counterpart of the operator's Secret key)."""
    path = Path(folder) / TOKEN_HASH_FILE
    path.write_text(token_hash(token) + "\n")
    return path
