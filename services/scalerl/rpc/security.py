"""Who may call a role's gRPC endpoint: mutual TLS under the job's own CA, and authorization by method.

Settings, from the environment as for Kafka (never a command line, never a log line):

    SCALERL_RPC_TLS_DIR     a folder with tls.crt and tls.key (this process's certificate, naming its
                            identity) and ca.crt (the job's CA): a Kubernetes TLS Secret's layout
                            (`scalerl.rpc.certs` makes them; the operator mounts them)
    SCALERL_RPC_PLAINTEXT   true: no TLS and no authentication, for local development only (a warning
                            at every start). Exactly one of the two must be set where a server runs.
    SCALERL_RPC_CLIENTS     extra identities (comma-separated common names issued by the job's CA, e.g.
                            `eval`) that may call Generate and Score besides the job's roles

Identity: the subject common name of the peer's certificate, verified against the job's CA. A CA
signs for one job only (`scalerl.rpc.certs`), so a certificate of another job, or none, fails the TLS
handshake: the caller sees UNAVAILABLE and the server logs the handshake error (gRPC Python cannot ask
for a client certificate without requiring it, so no call without one ever reaches a handler).

Authorization (`allowed`), deny by default:
- `Generator/UpdateWeights`: the learner only.
- `Generator/Generate`, `Verifier/Score`, `Environment/Execute`: the job's roles and the extra identities.
- every `Status`, health checking and reflection: the roles, the operator and the extra identities.
- anything else: nobody.
A refused call ends with PERMISSION_DENIED naming the identity and the method; a verified certificate
without a common name with UNAUTHENTICATED.

A server takes renewed certificate files (a Secret the operator renewed, refreshed by the kubelet) on
its next connection, without a restart (`_Reloader`); connections already open keep their session.

Servers are checked by name: every certificate of job J carries `J.rpc.scalerl` and a client verifies
the server against it whatever address it dialled (`grpc.ssl_target_name_override`); the client reads
the name from its own certificate.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

log = logging.getLogger(__name__)

ENV_TLS_DIR = "SCALERL_RPC_TLS_DIR"
ENV_PLAINTEXT = "SCALERL_RPC_PLAINTEXT"
ENV_CLIENTS = "SCALERL_RPC_CLIENTS"
ROLES = frozenset({"learner", "generator", "verifier", "curriculum"})
OPERATOR = "operator"
UPDATE_WEIGHTS = "/scalerl.v1.Generator/UpdateWeights"
WORK_METHODS = frozenset({"/scalerl.v1.Generator/Generate", "/scalerl.v1.Verifier/Score",
                          "/scalerl.v1.Environment/Execute"})
READ_METHODS = frozenset({
    *(f"/scalerl.v1.{s}/Status" for s in ("Generator", "Verifier", "Environment", "Learner", "Curriculum")),
    "/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
})
_TRUE = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False, "": False}


def plaintext_requested(env: Mapping[str, str]) -> bool:
    """Whether `env` sets SCALERL_RPC_PLAINTEXT to a true value (a malformed value is not a request)."""
    return _TRUE.get(env.get(ENV_PLAINTEXT, "").strip().lower(), False)


class RpcSecurityError(ValueError):
    """A malformed setting; one line per problem, naming the setting and what is allowed."""


def allowed(method: str, identity: str, clients: frozenset[str] = frozenset()) -> bool:
    """Whether `identity` may call `method` (a full gRPC method name, "/package.Service/Method")."""
    if method == UPDATE_WEIGHTS:
        return identity == "learner"
    if method in WORK_METHODS:
        return identity in ROLES or identity in clients
    if method in READ_METHODS:
        return identity in ROLES or identity == OPERATOR or identity in clients
    return False


@dataclass(frozen=True)
class RpcSecurity:
    """How this process's gRPC servers and clients protect their calls (see the module docstring)."""

    tls_dir: str = ""
    plaintext: bool = False
    clients: frozenset[str] = frozenset()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RpcSecurity:
        env = os.environ if env is None else env
        problems: list[str] = []
        raw_plain = env.get(ENV_PLAINTEXT, "").strip().lower()
        if raw_plain not in _TRUE:
            problems.append(f"{ENV_PLAINTEXT}: {raw_plain!r} is not allowed (true or false)")
        clients = frozenset(c.strip() for c in env.get(ENV_CLIENTS, "").split(",") if c.strip())
        security = cls(tls_dir=env.get(ENV_TLS_DIR, "").strip(), plaintext=_TRUE.get(raw_plain, False),
                       clients=clients)
        problems += security.problems()
        if problems:
            raise RpcSecurityError("\n".join(problems))
        return security

    @classmethod
    def development(cls) -> RpcSecurity:
        """Plain text, no authentication: tests and local development only."""
        return cls(plaintext=True)

    def problems(self) -> list[str]:
        """What is wrong with these settings, one line each (empty: usable)."""
        from scalerl.rpc.certs import IDENTITY, TLS_FILES

        if self.plaintext and self.tls_dir:
            return [f"{ENV_TLS_DIR} and {ENV_PLAINTEXT}=true: set one of them, not both"]
        if self.plaintext:
            return [f"{ENV_CLIENTS}: extra identities need TLS ({ENV_TLS_DIR}); with {ENV_PLAINTEXT}=true "
                    "nobody is authenticated"] if self.clients else []
        if not self.tls_dir:
            return [f"{ENV_TLS_DIR}: not set; set it to a folder with tls.crt, tls.key and ca.crt (the role's "
                    f"certificate, its key and the job's CA), or {ENV_PLAINTEXT}=true for local development "
                    "(no encryption, no authentication)"]
        out = [f"{ENV_TLS_DIR}: {Path(self.tls_dir) / f} is missing or unreadable (expected {', '.join(TLS_FILES)})"
               for f in TLS_FILES if not os.access(Path(self.tls_dir) / f, os.R_OK)]
        out += [f"{ENV_CLIENTS}: {c!r} is not an identity (lowercase letters, digits, '-' and '.')"
                for c in sorted(self.clients) if not IDENTITY.match(c)]
        out += [f"{ENV_CLIENTS}: {c!r} is a role of the job; list only extra identities"
                for c in sorted(self.clients & (ROLES | {OPERATOR}))]
        return out

    def _files(self) -> tuple[bytes, bytes, bytes]:
        d = Path(self.tls_dir)
        return (d / "tls.crt").read_bytes(), (d / "tls.key").read_bytes(), (d / "ca.crt").read_bytes()

    def _server_config(self) -> Any:
        cert, key, ca = self._files()
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def files_stamp(self) -> tuple[tuple[int, int], ...]:
        """(inode, mtime) of the three files (`scalerl.rpc.sidetls.files_stamp`)."""
        from scalerl.rpc.certs import TLS_FILES
        from scalerl.rpc.sidetls import files_stamp

        return files_stamp([Path(self.tls_dir) / f for f in TLS_FILES])

    @property
    def identity(self) -> str:
        """This process's identity (its certificate's common name); "" in plain text."""
        if self.plaintext:
            return ""
        from scalerl.rpc.certs import identity_of

        return identity_of(self._files()[0])

    def add_port(self, server: grpc.Server, address: str) -> int:
        """Bind `address` with TLS requiring a client certificate of the job's CA (or in plain text)."""
        if self.plaintext:
            log.warning("gRPC on %s in PLAIN TEXT with no authentication (%s=true): local development only",
                        address, ENV_PLAINTEXT)
            return int(server.add_insecure_port(address))
        return int(server.add_secure_port(address, grpc.dynamic_ssl_server_credentials(
            self._server_config(), _Reloader(self), require_client_authentication=True)))

    def interceptors(self) -> list[grpc.ServerInterceptor]:
        """The authorization interceptor (none in plain text: there is no identity to check)."""
        return [] if self.plaintext else [AuthorizationInterceptor(self.clients)]

    def channel(self, target: str, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
        """A channel to `target` presenting this process's certificate and verifying the server's."""
        if self.plaintext:
            return grpc.insecure_channel(target, options=list(options))
        from cryptography import x509

        cert, key, ca = self._files()
        names = x509.load_pem_x509_certificate(cert).extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
        if not names:
            raise RpcSecurityError(f"{ENV_TLS_DIR}: tls.crt names no DNS name to verify servers against")
        return grpc.secure_channel(target, grpc.ssl_channel_credentials(ca, key, cert),
                                   options=[*options, ("grpc.ssl_target_name_override", names[0])])


class _Reloader:
    """gRPC asks before each new connection's handshake: the server's certificate, key and CA are read
    again when their files changed (a renewed Secret), else the current ones stay. A half-written or
    unreadable set keeps the current one (logged); the next connection tries again."""

    def __init__(self, security: RpcSecurity) -> None:
        self.security = security
        self.stamp = security.files_stamp()

    def __call__(self) -> Any:
        try:
            stamp = self.security.files_stamp()
            if stamp == self.stamp:
                return None
            config = self.security._server_config()
        except (OSError, ValueError, RuntimeError) as exc:
            log.warning("gRPC certificate files in %s: cannot read them again (%s); keeping the current ones",
                        self.security.tls_dir, exc)
            return None
        self.stamp = stamp
        log.info("gRPC: certificate files in %s changed; new connections use them", self.security.tls_dir)
        return config


def peer_identity(context: grpc.ServicerContext) -> str:
    """The verified common name of the caller's certificate ("" when there is none)."""
    names = context.auth_context().get("x509_common_name") or []
    return names[0].decode(errors="replace") if names else ""


class AuthorizationInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
    """Checks every call's peer identity against `allowed` before the handler runs."""

    def __init__(self, clients: frozenset[str] = frozenset()) -> None:
        self.clients = clients

    def intercept_service(self, continuation: Callable[..., Any], handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method

        def guard(behaviour: Callable[[Any, grpc.ServicerContext], Any]) -> Callable[..., Any]:
            def checked(request: Any, context: grpc.ServicerContext) -> Any:
                who = peer_identity(context)
                if not who:
                    context.abort(grpc.StatusCode.UNAUTHENTICATED, f"{method}: the caller's certificate names "
                                  "no identity (common name)")
                if not allowed(method, who, self.clients):
                    log.warning("refused %s to %r (%s)", method, who, context.peer())
                    context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{who!r} may not call {method}")
                return behaviour(request, context)
            return checked

        for kind, make in (("unary_unary", grpc.unary_unary_rpc_method_handler),
                           ("unary_stream", grpc.unary_stream_rpc_method_handler),
                           ("stream_unary", grpc.stream_unary_rpc_method_handler),
                           ("stream_stream", grpc.stream_stream_rpc_method_handler)):
            behaviour = getattr(handler, kind)
            if behaviour is not None:
                return make(guard(behaviour), request_deserializer=handler.request_deserializer,
                            response_serializer=handler.response_serializer)
        return handler
