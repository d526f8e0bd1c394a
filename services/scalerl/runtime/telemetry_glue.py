"""Wires a role service (runtime/roles.py, runtime/learner_service.py) to its servers: the gRPC
servicer of its folder and the side port with Prometheus metrics read from the role's `status()` and
its `steps` (the durations of its units of work), one StatusMetrics per process shared by both (the
verifier's gRPC Score calls are timed into the same histogram)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from scalerl.rpc.security import RpcSecurity
from scalerl.runtime.roles import ServiceContext
from scalerl.telemetry.metrics import RoleMetrics
from scalerl.telemetry.sideport import SidePort
from scalerl.telemetry.steps import StepTimes

# status() counter -> RoleMetrics counter attribute, per role
_COUNTERS = {
    "generator": {"tokens_generated": "tokens", "groups_generated": "groups_out", "prompts_consumed": "groups_in",
                  "weights_bytes": "weights_bytes", "weights_unbuildable": "weights_unbuildable",
                  "weights_broadcast_bytes": "weights_broadcast_bytes", "broadcast_failures": "broadcast_failures"},
    "verifier": {"groups_scored": "groups_out", "rollouts_consumed": "groups_in", "grading_s": "grading_seconds",
                 "tests_passed": "tests_passed"},
    "learner": {"tokens_trained": "tokens", "groups_consumed": "groups_in", "versions_published": "groups_out",
                "broadcast_sent": "broadcast_sent", "broadcast_skipped": "broadcast_skipped"},
    "curriculum": {"prompts_issued": "groups_out", "scored_consumed": "groups_in"},
}


class StatusMetrics(RoleMetrics):
    """RoleMetrics brought up to date at every scrape from the role's status() and the durations in
    `steps` (each observed once into the step-time histogram)."""

    def __init__(self, role: str, status: Callable[[], dict[str, Any]], steps: StepTimes | None = None) -> None:
        super().__init__(role)
        self._status = status
        self._steps = steps
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def sync(self) -> None:
        with self._lock:
            if self._steps is not None:
                for seconds in self._steps.drain():
                    self.step_seconds.observe(seconds)
            s = self._status()
            for key, attr in _COUNTERS[self.role].items():
                value = float(s.get(key, 0))
                delta = value - self._seen.get(key, 0.0)
                if delta > 0:
                    getattr(self, attr).inc(delta)
                self._seen[key] = value
            if "policy_version" in s:
                self.policy_version.set(float(s["policy_version"]))
            if "staleness_versions" in s:
                self.staleness.set(float(s["staleness_versions"]))
            if "weights_build_s" in s:
                self.weights_build_seconds.set(float(s["weights_build_s"]))
            if "broadcast_in_group" in s:
                self.broadcast_in_group.set(float(s["broadcast_in_group"]))
            if "broadcast_members" in s:
                self.broadcast_members.set(float(s["broadcast_members"]))
            if "broadcast_stuck" in s:
                self._labelled(self.broadcast_stuck, "generator", s["broadcast_stuck"], "broadcast_stuck")
            self._labelled(self.dead_lettered, "reason", s.get("dead_lettered", {}), "dead_lettered")
            if "verdicts" in s:
                self._labelled(self.verdicts, "verdict", s["verdicts"], "verdicts")
            for topic, lag in s.get("lag", {}).items():
                self.queue_lag.labels(topic=topic).set(float(lag))
            self.ready.set(1.0 if s.get("ready") else 0.0)
            if self.progress is not None:  # a value the status does not have (yet) has no sample
                self.progress.update({k: float(v) for k, v in s.items()
                                      if isinstance(v, int | float) and not isinstance(v, bool)})

    def _labelled(self, counter: Any, label: str, totals: dict[str, Any], key: str) -> None:
        """Bring a labelled counter up to the status's running totals {label value: count}."""
        for value, n in totals.items():
            seen = f"{key}/{value}"
            delta = float(n) - self._seen.get(seen, 0.0)
            if delta > 0:
                counter.labels(**{label: value}).inc(delta)
            self._seen[seen] = float(n)

    def render(self) -> bytes:
        self.sync()
        return super().render()


def service_metrics(role: str, service: Any) -> StatusMetrics:
    """The metrics of a role service (its status() and, where it has them, its step durations)."""
    return StatusMetrics(role, service.status, getattr(service, "steps", None))


def start_sideport(role: str, service: Any, port: int, metrics: StatusMetrics | None = None,
                   security: RpcSecurity | None = None) -> tuple[int, Callable[[], None]]:
    """The side port, HTTPS with the role's certificate and /metrics behind the scrape token
    (`scalerl.rpc.sidetls`) unless `security` (default: from the environment) is plain text."""
    from scalerl.rpc.sidetls import MetricsGate, https_context

    security = security or RpcSecurity.from_env()
    gate = None if security.plaintext else MetricsGate(security.tls_dir).allows
    side = SidePort(service.ready, metrics or service_metrics(role, service), port=port,
                    tls=None if security.plaintext else https_context(security.tls_dir), metrics_gate=gate)
    bound = side.start()
    return bound, side.stop


def _status_fields(service: Any, allowed: tuple[str, ...]) -> Callable[[], dict[str, Any]]:
    return lambda: {k: v for k, v in service.status().items() if k in allowed}


def start_grpc(role: str, service: Any, ctx: ServiceContext, port: int,
               metrics: StatusMetrics | None = None) -> tuple[int, Callable[[], None]]:
    from scalerl.rpc.server import serve_grpc

    servicer: Any
    if role == "generator":
        from scalerl.generator.server import GeneratorServicer

        servicer = GeneratorServicer(service.engine, service.tokenizer, ctx.spec, store=service.store,
                                     generator_id=ctx.role_id, ready=service.ready, engine_lock=service.engine_lock,
                                     episodes=service.role.episodes,
                                     status_fn=_status_fields(service, ("policy_version", "tokens_generated",
                                                                        "groups_generated")))
    elif role == "verifier":
        from scalerl.verifier.server import VerifierServicer

        servicer = VerifierServicer(service.verifier, verifier_id=ctx.role_id, ready=service.ready, metrics=metrics,
                                    status_fn=_status_fields(service, ("groups_scored",)))
        service.rpc_scored = lambda: servicer.groups_scored  # Status and metrics: bus + Score calls
        env = ctx.spec.environment
        if env.tools:  # the job's tool calls are executed here too (scalerl.environment.service)
            from scalerl.environment.service import EnvironmentServicer
            from scalerl.environment.tools import Toolbox, tool_limits

            tools = EnvironmentServicer(Toolbox(tuple(env.tools), tool_limits(env.tool_wall_s, env.tool_memory_mb)),
                                        replica_id=ctx.role_id, ready=service.ready,
                                        registry=metrics.registry if metrics is not None else None)
            service.env_status = tools.status
            server, bound = serve_grpc(port, servicer, tools, security=ctx.rpc_security or RpcSecurity.from_env(),
                                       max_workers=8 + tools.slots + tools.queue_limit)
            return bound, lambda: server.stop(grace_s=5.0)
    elif role == "learner":
        from scalerl.learner.server import LearnerServicer

        servicer = LearnerServicer(_status_fields(service, (
            "ready", "policy_version", "step", "groups_consumed", "groups_dropped_stale", "staleness_versions",
            "tokens_trained", "step_seconds")), learner_id=ctx.role_id, ready=service.ready)
    else:
        from scalerl.curriculum.server import CurriculumServicer

        servicer = CurriculumServicer(_status_fields(service, (
            "ready", "policy_version", "epoch", "prompts_issued", "prompts_inflight", "prompts_retired",
            "groups_scored")), curriculum_id=ctx.role_id, ready=service.ready)
    server, bound = serve_grpc(port, servicer, security=ctx.rpc_security or RpcSecurity.from_env())
    return bound, lambda: server.stop(grace_s=5.0)
