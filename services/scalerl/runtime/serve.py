"""`scalerl serve ROLE`: one role per process, over a Kafka bus and an S3 (or shared-folder) store.

The process runs the role's loop in the main thread, a gRPC server (health checking, reflection, the
role's service) and a FastAPI side port (/healthz, /readyz, Prometheus /metrics) beside it. SIGTERM or
SIGINT sets the stop event: the role finishes or hands back its in-flight work, commits, and the
servers stop after it (grace period), so the process exits 0. A signal while the role is still
connecting (the broker or store unreachable) ends the wait at once, also with 0: nothing was taken
yet. An outage longer than `PROCESS_RETRY.max_outage_s` (`--max-outage`, 120 s) raises OutageTooLong.

A learner that finished its last step returns (exit 0) unless it was told to wait (`--when-finished
wait`, what the operator renders): then every rank stays up, Ready, its status saying `finished`, until
SIGTERM. Under a supervisor that restarts an exited container (a StatefulSet), exiting would read as a
crash: a restart, and a restarted learner that finds the run already done.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from typing import Any, Protocol

from scalerl.runtime import ROLES
from scalerl.runtime.roles import (
    PROCESS_RETRY,
    RetryStopped,
    ServiceContext,
    VerifierService,
    retry_io,
)
from scalerl.store.fencing import FENCED_EXIT, Fenced

log = logging.getLogger(__name__)


class RoleService(Protocol):
    def run(self, stop: threading.Event) -> Any: ...
    def ready(self) -> bool: ...
    def status(self) -> dict[str, Any]: ...


def build_service(role: str, ctx: ServiceContext, *, show_progress: bool = False) -> RoleService:
    # each role imports only what it runs: the verifier starts without torch (about 10 s of CPU less)
    if role == "generator":
        from scalerl.runtime.generator_service import GeneratorService

        return GeneratorService(ctx)
    if role == "verifier":
        return VerifierService(ctx)
    if role == "curriculum":
        from scalerl.runtime.curriculum_service import CurriculumService

        return CurriculumService(ctx)
    if role == "learner":
        from scalerl.runtime.learner_service import LearnerService

        service = LearnerService(ctx, show_progress=show_progress)
        service.build()
        return service
    raise ValueError(f"role {role!r}: expected one of {', '.join(ROLES)}")


_CONNECTING = threading.Event()  # set while the role is built: a signal then interrupts the blocking connect


def install_stop_signals(stop: threading.Event) -> None:
    """SIGTERM/SIGINT set `stop` (also the process's retry stop); while the role is still connecting they
    also raise RetryStopped in the main thread, so a connect blocked on an unreachable broker ends now."""
    PROCESS_RETRY.stop = stop

    def handler(signum: int, _frame: Any) -> None:
        log.info("signal %d: finishing in-flight work, then exiting", signum)
        stop.set()
        if _CONNECTING.is_set():
            _CONNECTING.clear()
            raise RetryStopped(f"signal {signum} while connecting")

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def serve(role: str, ctx: ServiceContext, *, grpc_port: int | None = None, http_port: int | None = None,
          stop: threading.Event | None = None, show_progress: bool = False,
          on_ready: Callable[[dict[str, int]], None] | None = None, wait_when_finished: bool = False) -> Any:
    """Build the role, start its servers, run until stopped (or, for the learner, until training ends).

    `grpc_port` / `http_port`: None = do not start that server, 0 = a free port. `on_ready` receives the
    bound ports once the servers are up. `wait_when_finished` (the learner): after the last step, keep the
    servers up until `stop` is set (see the module docstring). Returns what the role's loop returns (the
    learner's summary).
    """
    stop = stop or threading.Event()
    ranks = 1
    if role == "learner":  # under torchrun: ranks > 0 follow rank 0 and bind no ports
        from scalerl.runtime.learner_ranks import init_process_group_from_env, run_follower

        rank, ranks = init_process_group_from_env(ctx.spec.model.device)
        if rank > 0:
            return run_follower(ctx.spec, http_port, stop=stop if wait_when_finished else None)

    def build() -> RoleService:
        return build_service(role, ctx, show_progress=show_progress)

    # A role started while the broker or store is down (a restart, a rolling upgrade) waits for them; a
    # learner over several ranks does not retry as a whole (its start is a collective, and a retry would
    # desynchronise the ranks: its I/O steps retry one by one instead).
    _CONNECTING.set()
    try:  # (the line below too: a SIGTERM that lands while it is being written raises RetryStopped there)
        log.info("starting %s %s: connecting to %s and %s", role, ctx.role_id, ctx.bus_url, ctx.store_url)
        service = build() if ranks > 1 else retry_io(build, stop, what=f"start {role}")
    except RetryStopped as exc:
        log.info("stopped before %s started (%s): nothing taken, nothing to commit", role, exc)
        return None
    finally:
        _CONNECTING.clear()
    servers = start_servers(role, service, ctx, grpc_port=grpc_port, http_port=http_port)
    if on_ready is not None:
        on_ready(servers.ports)
    try:
        result = service.run(stop)
        if wait_when_finished and isinstance(result, dict):  # finished, not stopped: stay up until SIGTERM
            wait_finished(role, stop)
        return result
    except RetryStopped as exc:  # stopped while the bus/store was down: what was not committed is redelivered
        log.info("stopped during an outage (%s): uncommitted work is redelivered to the group", exc)
        return None
    except Fenced as exc:  # a newer learner of this job runs (scalerl.bus.fencing)
        log.error("%s", exc)
        raise SystemExit(FENCED_EXIT) from None
    finally:
        servers.stop()


def wait_finished(role: str, stop: threading.Event) -> None:
    """Stay up, servers answering, until `stop` (SIGTERM): a finished learner must not exit into a restart."""
    log.info("%s finished: staying up (ready, status finished) until SIGTERM", role)
    stop.wait()
    log.info("%s: signal received after the run finished; exiting 0", role)


class _Servers:
    def __init__(self) -> None:
        self.ports: dict[str, int] = {}
        self._stops: list[Callable[[], None]] = []

    def add(self, name: str, port: int, stop: Callable[[], None]) -> None:
        self.ports[name] = port
        self._stops.append(stop)

    def stop(self) -> None:
        for fn in reversed(self._stops):
            try:
                fn()
            except Exception as exc:  # shutting down: report, keep stopping the rest
                log.warning("server stop failed: %r", exc)


def start_servers(role: str, service: RoleService, ctx: ServiceContext, *, grpc_port: int | None,
                  http_port: int | None) -> _Servers:
    """The role's gRPC server and side port (see `scalerl.rpc` and `scalerl.telemetry`)."""
    servers = _Servers()
    if http_port is None and grpc_port is None:
        return servers
    from scalerl.runtime.telemetry_glue import service_metrics, start_grpc, start_sideport

    metrics = service_metrics(role, service)  # one per process: the gRPC server times Score calls into it
    if http_port is not None:
        port, stop_fn = start_sideport(role, service, http_port, metrics, ctx.rpc_security)
        servers.add("http", port, stop_fn)
    if grpc_port is not None:
        port, stop_fn = start_grpc(role, service, ctx, grpc_port, metrics)
        servers.add("grpc", port, stop_fn)
    return servers
