"""The gRPC server every role runs: its servicer(s), grpc.health.v1 health checking, server
reflection, and the tracing interceptor; a graceful `stop(grace_s)`.

    server, port = serve_grpc(0, GeneratorServicer(...), security=RpcSecurity.from_env(), host="127.0.0.1")
    ...
    server.stop(grace_s=5.0)   # health -> NOT_SERVING, refuse new calls, let running ones finish

A servicer is any object with `service_name` (the full proto name, e.g. "scalerl.v1.Generator") and
`register(server)` (the generated `add_<Service>Servicer_to_server`); the role servicers live in the
roles' folders (generator/server.py, ..., environment/service.py). A servicer with `server_options()`
adds those gRPC server options (the environment's connection age).

Choices:
1. The synchronous `grpc.server` with a thread pool, not `grpc.aio`: the handlers call blocking torch
   and store code, and the role loops that share the engine are threads too.
2. `grpc.so_reuseport` is off, so binding a port another server holds fails instead of silently
   sharing it.
3. `security` has no default: every caller says how the port is protected (mutual TLS and authorization
   by method, or plain text for local development; `scalerl.rpc.security`).
4. Messages up to `max_message_bytes` (default 64 MiB) both ways: a Generate answer for many long
   samples is past gRPC's 4 MiB default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from typing import Any, NoReturn, Protocol, TypeVar

import grpc
from google.protobuf.message import Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from scalerl.rpc.convert import fill_status
from scalerl.rpc.security import RpcSecurity
from scalerl.telemetry.tracing import ServerTracingInterceptor

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name

S = TypeVar("S", bound=Message)


class RoleServicer(Protocol):
    service_name: str

    def register(self, server: grpc.Server) -> None: ...


def grpc_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    return [("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes)]


class RoleServer:
    """A started gRPC server (`grpc`) with its health servicer (`health`) and bound `port`."""

    def __init__(self, server: grpc.Server, health_servicer: health.HealthServicer, port: int,
                 service_names: Sequence[str]) -> None:
        self.grpc = server
        self.health = health_servicer
        self.port = port
        self.service_names = list(service_names)

    def set_serving(self, serving: bool) -> None:
        """Health status of the server ("") and of every role service: SERVING or NOT_SERVING."""
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for name in ("", *self.service_names):
            self.health.set(name, status)

    def stop(self, grace_s: float = 5.0) -> None:
        """Graceful shutdown: health says NOT_SERVING, new calls are refused, calls in progress get
        `grace_s` seconds to finish before they are cancelled; returns when the server is down."""
        if grace_s < 0:
            raise ValueError(f"grace_s must be >= 0, got {grace_s}")
        self.health.enter_graceful_shutdown()
        self.grpc.stop(grace_s).wait(grace_s + 5.0)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the server stops (True) or `timeout_s` passes (False)."""
        return bool(self.grpc.wait_for_termination(timeout_s))


def serve_grpc(port: int, *servicers: RoleServicer, security: RpcSecurity, host: str = "0.0.0.0", max_workers: int = 8,
               max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
               interceptors: Sequence[grpc.ServerInterceptor] = ()) -> tuple[RoleServer, int]:
    """Start a server with `servicers`, health (all SERVING) and reflection on `host:port`
    (0 = a free port), protected as `security` says; returns (server, bound port)."""
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be in 0..65535 (0 = a free port), got {port}")
    if max_workers < 1:
        raise ValueError(f"max_workers must be >= 1, got {max_workers}")
    if not servicers:
        raise ValueError("serve_grpc: give at least one servicer")
    names = [s.service_name for s in servicers]
    if len(set(names)) != len(names):
        raise ValueError(f"serve_grpc: a service is registered twice: {names}")
    extra = [o for s in servicers for o in (s.server_options() if hasattr(s, "server_options") else [])]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
                         interceptors=[ServerTracingInterceptor(), *security.interceptors(), *interceptors],
                         options=[*grpc_options(max_message_bytes), ("grpc.so_reuseport", 0), *extra])
    for s in servicers:
        s.register(server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection([*names, HEALTH_SERVICE, reflection.SERVICE_NAME], server)
    address = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
    try:
        bound = security.add_port(server, address)
    except RuntimeError as exc:
        raise OSError(f"gRPC server: cannot bind {address}: {exc}") from exc
    if not bound:
        raise OSError(f"gRPC server: cannot bind {address}")
    server.start()
    role_server = RoleServer(server, health_servicer, bound, names)
    role_server.set_serving(True)
    return role_server, bound


def abort(context: Any, code: grpc.StatusCode, details: str) -> NoReturn:
    """End the call with `code` and `details` (grpc's `context.abort`, typed as never returning)."""
    context.abort(code, details)
    raise AssertionError("grpc.ServicerContext.abort returned")  # it raises; never reached


def status_reply(message: S, status_fn: Callable[[], Mapping[str, Any]] | None, context: Any) -> S:
    """`message` with the fields returned by `status_fn` set on it; a callable that returns an unknown
    field or a value of the wrong type aborts the call with INTERNAL and the reason."""
    if status_fn is None:
        return message
    try:
        return fill_status(message, status_fn())
    except ValueError as exc:
        abort(context, grpc.StatusCode.INTERNAL, f"status: {exc}")
