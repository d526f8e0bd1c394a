"""The side port of a role: a small FastAPI app served by uvicorn in a background thread.

- `GET /healthz` -> 200 while the process is alive (a liveness probe);
- `GET /readyz`  -> 200 when `ready()` is true, else 503 (a readiness probe: e.g. the generator has
  not loaded the current policy yet); an exception in `ready()` counts as not ready, with its text;
- `GET /metrics` -> the role's Prometheus metrics (text exposition format); the `ready` gauge is set
  from `ready()` on each scrape. With a `metrics_gate`, a request it does not allow gets 401.

HTTPS when given a server `tls` context (`scalerl.rpc.sidetls`: the role's certificate, and the scrape
token the gate checks); plain HTTP only without one (local development).

`SidePort(ready, metrics, port=0).start()` binds the socket itself (port 0 = a free port), so the bound
port is known before the server thread starts; `stop()` asks uvicorn to exit and joins the thread.
uvicorn installs no signal handlers off the main thread: SIGTERM stays with the role's own handler.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from scalerl.telemetry.metrics import RoleMetrics

log = logging.getLogger(__name__)


def _readiness(ready: Callable[[], bool]) -> tuple[bool, str]:
    try:
        return bool(ready()), ""
    except Exception as exc:  # a failing check means "not ready", never a 500
        # the probe answers anyone who reaches the port: the exception's type only, its text to the log
        log.info("readiness check failed: %s: %s", type(exc).__name__, exc)
        return False, type(exc).__name__


def build_app(ready: Callable[[], bool], metrics: RoleMetrics,
              metrics_gate: Callable[[str | None], bool] | None = None) -> FastAPI:
    """The side-port app (see the module docstring)."""
    app = FastAPI(title=f"scalerl {metrics.role} side port", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "alive", "role": metrics.role}

    @app.get("/readyz")
    def readyz() -> JSONResponse:
        ok, reason = _readiness(ready)
        metrics.ready.set(1 if ok else 0)
        body: dict[str, object] = {"ready": ok, "role": metrics.role}
        if reason:
            body["reason"] = reason
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics")
    def prometheus_metrics(request: Request) -> Response:
        if metrics_gate is not None and not metrics_gate(request.headers.get("authorization")):
            return JSONResponse({"error": "a scrape token is needed (Authorization: Bearer)"}, status_code=401,
                                headers={"WWW-Authenticate": 'Bearer realm="metrics"'})
        metrics.ready.set(1 if _readiness(ready)[0] else 0)
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app


class SidePort:
    """/healthz, /readyz and /metrics on `host:port` in a background thread."""

    def __init__(self, ready: Callable[[], bool], metrics: RoleMetrics, *, host: str = "0.0.0.0",
                 port: int = 0, tls: ssl.SSLContext | None = None,
                 metrics_gate: Callable[[str | None], bool] | None = None) -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be in 0..65535 (0 = a free port), got {port}")
        self.host = host
        self.requested_port = port
        self.port: int | None = None
        self.tls = tls
        self.app = build_app(ready, metrics, metrics_gate)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the side port is not started")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    def start(self, timeout_s: float = 10.0) -> int:
        """Bind, serve in a thread, wait until uvicorn accepts; returns the bound port."""
        if self._thread is not None:
            raise RuntimeError("the side port is already started")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.requested_port))
        except OSError as exc:
            sock.close()
            raise OSError(f"side port: cannot bind {self.host}:{self.requested_port}: {exc.strerror}") from exc
        self._sock = sock
        self.port = int(sock.getsockname()[1])
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=5)
        if self.tls is not None:  # uvicorn serves the loaded config's context: ours, which reloads renewed files
            config.load()
            config.ssl = self.tls
        server = uvicorn.Server(config)
        self._server = server
        self._thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                                        name=f"sideport-{self.port}")
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"side port on {self.host}:{self.port} did not start within {timeout_s} s")
            time.sleep(0.01)
        return self.port

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop serving (open connections get `timeout_s` to finish) and join the thread; idempotent."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._sock is not None:
            self._sock.close()
        self._server = self._thread = self._sock = None
