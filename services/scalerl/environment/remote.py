"""Tools executed by the environment service (`environment.service`): the `Tools` an episode runner uses
when its calls must not run in the generator's own process.

    tools = RemoteToolbox(("python",), "ipv4:127.0.0.1:50061,127.0.0.1:50062", security=RpcSecurity.from_env())
    tools.run_many([ToolCall("python", "print(6 * 7)")])   # -> ["42"]

Target: a gRPC target naming every replica, so that one channel spreads calls over them (round robin):
`dns:///HOST:PORT` (every address the name resolves to: a headless Kubernetes Service; resolved again
whenever a replica closes a connection, which each does every `MAX_CONNECTION_AGE_S`),
`ipv4:HOST:PORT,HOST:PORT...` (a fixed list) or `HOST:PORT` (one replica).

Each call has a deadline (`timeout_s`: by default twice the call's wall limit plus 10 s, for the queue
wait and the sandbox's start). A call that fails because its replica went away (UNAVAILABLE), was full
(RESOURCE_EXHAUSTED), took past its deadline (DEADLINE_EXCEEDED) or was cancelled is sent again, to the
next ready replica, after a growing pause (0.1, 0.2, ... 2 s, jittered): until `attempts` failures, or,
while replicas only answer that they are full (backpressure: not a failure), until `attempts x timeout_s`
seconds have passed. A tool call changes
nothing outside its own sandbox, so executing it twice (a replica killed after it ran the call but before
it answered) gives the episode the same single observation. Other errors (PERMISSION_DENIED: this
identity may not call, INVALID_ARGUMENT) are not retried. When every attempt failed, `EnvironmentUnavailable`
is raised: the generator's batch fails, its prompts are not committed and come back to it (the role's
retry), so no episode is lost or trained half-made.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from typing import Any

import grpc

from scalerl.endpoints import grpc_target_problem
from scalerl.environment.tools import TOOL_LIMITS, Observation, ToolCall, check_names, instructions, side_by_side
from scalerl.rpc.gen.scalerl.v1 import services_pb2 as spb
from scalerl.rpc.gen.scalerl.v1 import services_pb2_grpc as sgrpc
from scalerl.rpc.security import RpcSecurity
from scalerl.rpc.server import grpc_options
from scalerl.sandbox import Limits

RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED,
                       grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED})


class EnvironmentUnavailable(RuntimeError):
    """No replica of the environment service answered a call within its attempts."""


class RemoteToolbox:
    """`Tools` whose calls the environment service executes (see the module docstring)."""

    def __init__(self, names: Sequence[str], target: str, *, security: RpcSecurity, limits: Limits = TOOL_LIMITS,
                 attempts: int = 4, timeout_s: float | None = None, workers: int = 8) -> None:
        why = grpc_target_problem("environment.service", target)
        if why:
            raise ValueError(why)
        if attempts < 1 or workers < 1:
            raise ValueError(f"need attempts >= 1 and workers >= 1, got {attempts}, {workers}")
        self.names = check_names(names)
        self.target = target
        self.limits = limits
        self.attempts = attempts
        self.timeout_s = timeout_s if timeout_s is not None else 2 * limits.wall_s + 10.0
        self.workers = workers
        options = [*grpc_options(), ("grpc.lb_policy_name", "round_robin"), ("grpc.enable_retries", 0)]
        self._channel = security.channel(target, options=options)
        self._stub = sgrpc.EnvironmentStub(self._channel)
        self._lock = threading.Lock()
        self.retries = 0  # calls sent again (to another replica)
        self.served_by: dict[str, int] = {}  # replica id -> calls it answered

    def instructions(self) -> str:
        return instructions(self.names)

    def execute(self, call: ToolCall | None) -> Observation:
        request = spb.ToolCallRequest(malformed=call is None, wall_s=self.limits.wall_s,
                                      memory_bytes=self.limits.memory_bytes)
        if call is not None:
            request.tool, request.input = call.name, call.text
        last: grpc.RpcError | None = None
        failures, tries = 0, 0
        give_up = time.monotonic() + self.attempts * self.timeout_s
        while failures < self.attempts and time.monotonic() < give_up:
            if tries:
                with self._lock:
                    self.retries += 1
                time.sleep(min(2.0, 0.1 * 2 ** min(tries, 5)) * (0.5 + random.random()))  # jitter
            tries += 1
            try:
                r = self._stub.Execute(request, timeout=self.timeout_s, wait_for_ready=tries > 1)
            except grpc.RpcError as exc:
                if exc.code() not in RETRYABLE:
                    raise EnvironmentUnavailable(f"environment {self.target}: {exc.code().name}: {exc.details()}") \
                        from exc
                last = exc
                failures += exc.code() is not grpc.StatusCode.RESOURCE_EXHAUSTED  # full is not failed: wait, retry
                continue
            with self._lock:
                self.served_by[r.replica] = self.served_by.get(r.replica, 0) + 1
            return Observation(r.observation, r.verdict)
        assert last is not None
        raise EnvironmentUnavailable(f"environment {self.target}: no replica answered in {tries} tries over "
                                     f"{self.attempts} x {self.timeout_s:g} s (last: {last.code().name}: "
                                     f"{last.details()})") from last

    def run_many(self, calls: Sequence[ToolCall | None]) -> list[str]:
        """Observations of `calls`, sent side by side (the service spreads them over its replicas)."""
        return side_by_side(self.execute, calls, self.workers)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> RemoteToolbox:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
