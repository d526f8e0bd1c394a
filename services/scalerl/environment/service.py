"""The environment service (`scalerl.v1.Environment`): tool calls of multi-turn episodes executed for
generators that wait on each observation.

    servicer = EnvironmentServicer(Toolbox(("python", "calculator")), replica_id="verifier-0", registry=reg)
    server, port = serve_grpc(0, servicer, security=..., options=servicer.server_options())

The verifier processes serve it beside `scalerl.v1.Verifier` (`scalerl serve verifier`), so the pool the
operator scales for scoring also executes tool calls, under the same sandbox settings.

Backpressure: `slots` calls execute side by side (each python call is its own sandboxed process); up to
`queue_limit` more wait for a slot, each until its deadline (then DEADLINE_EXCEEDED). A call beyond
that is refused at once with RESOURCE_EXHAUSTED, so its caller (`scalerl.environment.remote`) tries
another replica instead of queueing behind a busy one.

Load: `busy_fraction()` is the mean fraction of slots in use over the last `window_s` seconds (the time
integral of running calls / (window x slots)): 1.0 means every slot was busy the whole window, the
utilisation an HPA-style rule scales on.

Connections are closed after `MAX_CONNECTION_AGE_S` (calls in progress finish first): a client that
resolved the replicas by DNS resolves again, and so reaches replicas added since.

Prometheus (on the role's registry): `scalerl_environment_executions_total{tool,verdict}`,
`scalerl_environment_execution_seconds{tool}` (histogram), `scalerl_environment_rejected_total`,
`scalerl_environment_busy_ratio`, `scalerl_environment_running`, `scalerl_environment_queued`.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from scalerl.environment.tools import Observation, Toolbox, ToolCall
from scalerl.rpc.gen.scalerl.v1 import services_pb2 as spb
from scalerl.rpc.gen.scalerl.v1 import services_pb2_grpc as sgrpc
from scalerl.rpc.server import abort
from scalerl.sandbox import Limits

MAX_CONNECTION_AGE_S = 30.0
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class BusyMeter:
    """The time integral of calls running, and its mean over a trailing window, per slot.

        meter = BusyMeter(slots=2, window_s=10, clock=lambda: t)
        meter.change(+1) at t=0; meter.change(-1) at t=5  ->  busy_fraction() at t=10 == 5 / (10 x 2) = 0.25
    """

    def __init__(self, slots: int, window_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        if slots < 1 or window_s <= 0:
            raise ValueError(f"need slots >= 1 and window_s > 0, got {slots}, {window_s}")
        self.slots = slots
        self.window_s = window_s
        self.clock = clock
        self.running = 0
        self._t = clock()
        self._start = self._t
        self._integral = 0.0  # call-seconds since the meter started
        self._samples: deque[tuple[float, float]] = deque([(self._t, 0.0)])  # (time, integral) at changes

    def _advance(self) -> float:
        now = self.clock()
        self._integral += self.running * (now - self._t)
        self._t = now
        return now

    def change(self, delta: int) -> None:
        """A call started (+1) or ended (-1) now."""
        now = self._advance()
        self.running += delta
        self._samples.append((now, self._integral))
        while len(self._samples) > 2 and self._samples[1][0] <= now - self.window_s:
            self._samples.popleft()

    def busy_fraction(self) -> float:
        """Mean fraction of slots busy over the last window (over the meter's life while it is younger)."""
        now = self._advance()
        lo = max(now - self.window_s, self._start)
        if now <= lo:
            return min(1.0, self.running / self.slots)
        # the integral at `lo`: interpolate between the last sample at or before it and the next change
        before = [s for s in self._samples if s[0] <= lo]
        t0, i0 = before[-1] if before else self._samples[0]
        later = [s for s in self._samples if s[0] > lo]
        t1, i1 = later[0] if later else (now, self._integral)
        at_lo = i0 + (i1 - i0) * ((lo - t0) / (t1 - t0) if t1 > t0 else 0.0)
        return max(0.0, min(1.0, (self._integral - at_lo) / ((now - lo) * self.slots)))


class _Metrics:
    def __init__(self, registry: CollectorRegistry, servicer: EnvironmentServicer) -> None:
        p = "scalerl_environment"
        self.executions = Counter(f"{p}_executions", "Tool calls executed, by tool and verdict.", ["tool", "verdict"],
                                  registry=registry)
        self.seconds = Histogram(f"{p}_execution_seconds", "Wall time of one tool call on this replica, from its "
                                 "slot to its observation (seconds).", ["tool"], buckets=LATENCY_BUCKETS,
                                 registry=registry)
        self.rejected = Counter(f"{p}_rejected", "Calls refused with RESOURCE_EXHAUSTED (slots and queue full).",
                                registry=registry)
        Gauge(f"{p}_busy_ratio", "Mean fraction of execution slots in use over the last window (0-1).",
              registry=registry).set_function(servicer.busy_fraction)
        Gauge(f"{p}_running", "Calls executing now.", registry=registry).set_function(lambda: servicer.meter.running)
        Gauge(f"{p}_queued", "Calls waiting for a slot now.", registry=registry).set_function(lambda: servicer.queued)


class EnvironmentServicer(sgrpc.EnvironmentServicer):  # type: ignore[misc]
    service_name = "scalerl.v1.Environment"

    def __init__(self, toolbox: Toolbox, *, replica_id: str = "environment-0", slots: int | None = None,
                 queue_limit: int | None = None, window_s: float = 30.0, registry: CollectorRegistry | None = None,
                 ready: Callable[[], bool] | None = None) -> None:
        """slots: calls executed side by side (default: the toolbox's workers); queue_limit: calls that may
        wait for a slot (default: 4 x slots)."""
        self.toolbox = toolbox
        self.replica_id = replica_id
        self.slots = slots or toolbox.workers
        self.queue_limit = 4 * self.slots if queue_limit is None else queue_limit
        if self.slots < 1 or self.queue_limit < 0:
            raise ValueError(f"need slots >= 1 and queue_limit >= 0, got {self.slots}, {self.queue_limit}")
        self.meter = BusyMeter(self.slots, window_s)
        self.ready = ready or (lambda: True)
        self._lock = threading.Lock()
        self._slots = threading.Semaphore(self.slots)
        self.queued = 0
        self.executions = 0
        self.rejected = 0
        self.metrics = _Metrics(registry, self) if registry is not None else None

    def register(self, server: grpc.Server) -> None:
        sgrpc.add_EnvironmentServicer_to_server(self, server)

    @staticmethod
    def server_options() -> list[tuple[str, int]]:
        """gRPC server options: connections closed after MAX_CONNECTION_AGE_S (see the module docstring)."""
        return [("grpc.max_connection_age_ms", int(MAX_CONNECTION_AGE_S * 1000))]

    def busy_fraction(self) -> float:
        with self._lock:
            return self.meter.busy_fraction()

    def _limits(self, request: Any) -> Limits:
        """The toolbox's limits, tightened (never loosened) by the request's."""
        own = self.toolbox.limits
        wall = min(own.wall_s, request.wall_s) if request.HasField("wall_s") and request.wall_s > 0 else own.wall_s
        memory = (min(own.memory_bytes, request.memory_bytes)
                  if request.HasField("memory_bytes") and request.memory_bytes > 0 else own.memory_bytes)
        if (wall, memory) == (own.wall_s, own.memory_bytes):
            return own
        return dataclasses.replace(own, wall_s=wall, cpu_s=max(1, min(own.cpu_s, int(wall))), memory_bytes=memory)

    def _admit(self, context: grpc.ServicerContext) -> None:
        with self._lock:
            if self.meter.running + self.queued >= self.slots + self.queue_limit:
                self.rejected += 1
                if self.metrics is not None:
                    self.metrics.rejected.inc()
                abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED,
                      f"environment {self.replica_id}: {self.meter.running} calls running and {self.queued} queued "
                      f"(at most {self.slots} + {self.queue_limit}); try another replica")
            self.queued += 1
        remaining = context.time_remaining()
        got = self._slots.acquire(timeout=remaining if remaining is not None else None)
        with self._lock:
            self.queued -= 1
            if got:
                self.meter.change(+1)
        if not got:
            abort(context, grpc.StatusCode.DEADLINE_EXCEEDED,
                  f"environment {self.replica_id}: no slot free before the call's deadline")

    def _release(self) -> None:
        with self._lock:
            self.meter.change(-1)
            self.executions += 1
        self._slots.release()

    def Execute(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 (gRPC name)
        call = None if request.malformed else ToolCall(request.tool, request.input)
        limits = self._limits(request)
        self._admit(context)
        t0 = time.perf_counter()
        try:
            obs: Observation = self.toolbox.execute(call, limits)
        finally:
            self._release()
        seconds = time.perf_counter() - t0
        if self.metrics is not None:
            tool = call.name if call is not None and call.name in self.toolbox.names else "none"
            self.metrics.executions.labels(tool=tool, verdict=obs.verdict).inc()
            self.metrics.seconds.labels(tool=tool).observe(seconds)
        return spb.ToolCallResponse(observation=obs.text, verdict=obs.verdict, seconds=seconds,
                                    replica=self.replica_id)

    def Status(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 (gRPC name)
        with self._lock:
            return spb.EnvironmentStatus(
                role="environment", id=self.replica_id, ready=bool(self.ready()), executions=self.executions,
                rejected=self.rejected, slots=self.slots, running=self.meter.running, queued=self.queued,
                busy_fraction=self.meter.busy_fraction())

    def status(self) -> dict[str, Any]:
        """The counters of Status as a dict (the verifier's status(), its side port and bus metrics)."""
        with self._lock:
            return {"env_executions": self.executions, "env_rejected": self.rejected, "env_running": self.meter.running,
                    "env_queued": self.queued, "env_slots": self.slots, "env_busy_fraction": self.meter.busy_fraction()}
