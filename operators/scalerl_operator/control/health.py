"""The operator's own health endpoint, served from process start, leader or not.

kopf's liveness endpoint only starts inside `kopf.run`, and with `--leader-election` a standby never
gets there: its startup probe would fail and the kubelet would kill it in a loop whenever
`operator.replicas > 1`. This server runs before the Lease is contended, so:

- `GET /healthz` → 200 while the process is healthy: `standby` (waiting for the Lease), `starting`
  (leading, kopf not yet ready), `leader` (kopf watching). 500 `kopf not ready after Ns` when this
  replica leads but kopf did not come up within `startup_grace_s`, and 500 once the process is
  stopping: the kubelet restarts a wedged leader, never a healthy standby.
- `GET /readyz` → the same code and body (a standby is Ready: it serves its purpose, waiting), so a
  `helm install --wait` with two replicas completes.

Plain `http.server` in a daemon thread: no asyncio loop to share with kopf's.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal
from urllib.parse import urlsplit

Role = Literal["standby", "starting", "leader", "stopping"]


@dataclass
class HealthState:
    """What the endpoint reports; `__main__` moves it along standby → starting → leader → stopping."""

    startup_grace_s: float = 120.0
    role: Role = "standby"
    since_s: float = field(default_factory=time.monotonic)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def set(self, role: Role) -> None:
        with self._lock:
            self.role, self.since_s = role, time.monotonic()

    def report(self, now_s: float | None = None) -> tuple[int, str]:
        """(HTTP code, body). Example: starting for 130 s with a 120 s grace → (500, ...)."""
        now_s = time.monotonic() if now_s is None else now_s
        with self._lock:
            role, since = self.role, self.since_s
        if role == "stopping":
            return 500, "stopping"
        if role == "starting" and now_s - since > self.startup_grace_s:
            return 500, f"kopf not ready after {now_s - since:.0f}s"
        return 200, role


def parse_endpoint(url: str) -> tuple[str, int]:
    """`http://0.0.0.0:8080/healthz` → ("0.0.0.0", 8080); the path is ignored (both paths are served)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.port is None:
        raise ValueError(f"--liveness: want http://HOST:PORT/healthz, got {url!r}")
    return parts.hostname or "0.0.0.0", parts.port


def serve(state: HealthState, host: str, port: int) -> ThreadingHTTPServer:
    """Start the endpoint in a daemon thread; `server.shutdown()` stops it."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] not in ("/healthz", "/readyz"):
                code, body = 404, "not found"
            else:
                code, body = state.report()
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:  # silent: probes come every few seconds
            return

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    return server
