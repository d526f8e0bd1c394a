"""The generator and verifier as long-running services (one per process) over a durable bus, and what every
role's service shares (its context, retries of the bus and store, the input lag). The curriculum's service:
`scalerl.runtime.curriculum_service`; the learner's: `scalerl.runtime.learner_service`.

Each service is built from the job spec plus the bus and store URLs, runs `run(stop)` until the
`stop` event is set (SIGTERM), and then hands back what it holds: a generator finishes the batch it is
generating, publishes it and commits; uncommitted prompts are re-delivered to another generator of
the group. `status()` feeds the gRPC Status call and Prometheus; `ready()` the /readyz probe; `steps`
(StepTimes) takes the duration of every unit of work that did something, for the step-time histogram.

Delivery is at least once everywhere (offsets are committed after the output is produced); the learner
recognises a duplicate by its issue number or group id (`scalerl.bus.dedup`).
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from scalerl.bus import Bus, TopicNames, open_bus
from scalerl.config import JobSpec
from scalerl.faults.bus import wrap_bus
from scalerl.messages import MetricRecord
from scalerl.parts import make_task, make_verifier, seed_python
from scalerl.runtime.limits import job_limits
from scalerl.store import Store, open_store
from scalerl.store.fencing import Fenced
from scalerl.telemetry.steps import StepTimes
from scalerl.verifier.role import VerifierRole

if TYPE_CHECKING:
    from scalerl.rpc.security import RpcSecurity

log = logging.getLogger(__name__)
T = TypeVar("T")

POLL_S = 0.2
ENV_REPORT_S = 5.0
"""How often a verifier serving tool calls reports its load (`environment` records on the metrics topic,
the operator's autoscaling input: scalerl_operator.cluster.rlstatus)."""


@dataclass
class ServiceContext:
    """Everything a role process needs: the job, where the bus and store are, who it is."""

    spec: JobSpec
    bus_url: str
    store_url: str
    role_id: str
    out_dir: Path = field(default_factory=lambda: Path("runs"))
    rpc_security: RpcSecurity | None = None  # how its gRPC port is protected; None: read from the environment

    def open(self) -> tuple[Bus, Store, TopicNames]:
        bus = connect_bus(self.bus_url)
        retry_io(lambda: ensure_job_topics(bus, self.spec), what="create the job's topics")
        return bus, open_store(self.store_url), TopicNames.of(self.spec)


def ensure_job_topics(bus: Bus, spec: JobSpec) -> None:
    """Create the job's topics: data topics with `runtime.partitions`, the others with one partition
    (the policy topic must keep its announcements in order)."""
    t = TopicNames.of(spec)
    bus.ensure_topics([t.prompts, t.rollouts, t.scored], partitions=spec.runtime.partitions)
    bus.ensure_topics([t.policy, t.metrics, t.dlq], partitions=1)


MAX_OUTAGE_S = 120.0
CONNECT_TIMEOUT_S = 30.0  # one attempt's wait for the first broker


def connect_bus(url: str) -> Bus:
    """A role's bus (wrapped by the fault plan, if any: scalerl.faults). One connect attempt never outlasts the
    process's outage limit: `--max-outage 5` gives up after about 5 s, not after a 30 s attempt."""
    return wrap_bus(open_bus(url, connect_timeout_s=min(CONNECT_TIMEOUT_S, PROCESS_RETRY.max_outage_s)))


class OutageTooLong(RuntimeError):
    """The bus or store stayed unreachable for longer than the retry limit."""


class RetryStopped(BaseException):
    """A stop (SIGTERM) came while a bus/store call was being retried: nothing more can be committed.

    A BaseException, like KeyboardInterrupt, so that a client library's `except Exception` does not
    swallow it when the signal handler raises it inside a blocking connect."""


@dataclass
class RetryPolicy:
    """How this process waits out an outage: `scalerl serve --max-outage` and its SIGTERM event set it."""

    max_outage_s: float = MAX_OUTAGE_S
    stop: threading.Event | None = None


PROCESS_RETRY = RetryPolicy()


def retry_io(fn: Callable[[], T], stop: threading.Event | None = None, *, what: str = "bus/store call",
             max_outage_s: float | None = None, on_error: Callable[[], None] | None = None) -> T:
    """Call `fn` until it succeeds: a broker restart or a store hiccup is waited out (retry every
    second, `on_error` first, e.g. to rewind a consumer to its committed offsets; a fenced learner's
    `Fenced` is raised at once). After `max_outage_s`
    (default `PROCESS_RETRY.max_outage_s`) of failures it raises OutageTooLong, so the process exits
    non-zero and its supervisor restarts it; a stop (`stop`, default `PROCESS_RETRY.stop`) raises
    RetryStopped. Neither is retried by an enclosing retry_io, so nested retries share one limit."""
    stop = stop or PROCESS_RETRY.stop
    limit = PROCESS_RETRY.max_outage_s if max_outage_s is None else max_outage_s
    first_failure: float | None = None
    while True:
        try:
            return fn()
        except (OutageTooLong, Fenced):
            raise
        except Exception as exc:
            now = time.monotonic()
            first_failure = first_failure or now
            if now - first_failure > limit:
                raise OutageTooLong(f"{what}: the bus/store did not answer for {limit:g} s (last error: {exc!r})") \
                    from exc
            if stop is not None and stop.is_set():
                raise RetryStopped(what) from exc
            log.warning("%s failed (%r); retrying", what, exc)
            if on_error is not None:
                try:
                    on_error()
                except Exception as again:  # still down: the next attempt retries both
                    log.warning("recovery after %s failed: %r", what, again)
            if stop is not None and stop.wait(1.0):
                raise RetryStopped(what) from exc
            if stop is None:
                time.sleep(1.0)


def input_lag(bus: Bus, group: str, topic: str) -> dict[str, int]:
    """{topic: records not yet committed by the role's group} for the queue-lag metric; empty when the
    transport cannot tell (memory bus) or the broker does not answer right now."""
    lag = getattr(bus, "lag", None)
    if lag is None:
        return {}
    try:
        return {topic: int(lag(group, topic))}
    except Exception as exc:  # a scrape must not fail because the broker is restarting
        log.debug("lag of %s on %s unavailable: %r", group, topic, exc)
        return {}


def role_seed(spec: JobSpec, role_id: str) -> int:
    """A stable per-replica seed: replicas of one role sample different streams."""
    return spec.seed + 1 + zlib.crc32(role_id.encode()) % 1_000_003


class VerifierService:
    def __init__(self, ctx: ServiceContext) -> None:
        seed_python(ctx.spec.seed)  # grading uses no torch: the verifier never imports it (seconds per start)
        self.ctx = ctx
        self.bus, self.store, self.topics = ctx.open()
        task = make_task(ctx.spec)
        self.verifier = make_verifier(ctx.spec, task)
        self.role = VerifierRole(self.verifier, self.bus, self.topics, job_limits(ctx.spec, task),
                                 group=self.topics.group("verifiers"))
        self.steps = StepTimes()
        self.rollouts_consumed = 0
        # groups scored by gRPC Score calls (set by the gRPC server when it runs): counted with the bus's
        self.rpc_scored: Callable[[], int] = lambda: 0
        # the environment service's counters (scalerl.environment.service) when this process serves tool calls
        self.env_status: Callable[[], dict[str, Any]] = dict
        self._env_reported = float("-inf")

    def ready(self) -> bool:
        return True

    def status(self) -> dict[str, Any]:
        rpc = self.rpc_scored()
        v = self.verifier
        return {"role": "verifier", "id": self.ctx.role_id, "ready": True, "groups_scored": self.role.scored + rpc,
                "rollouts_consumed": self.rollouts_consumed + rpc, "dead_lettered": dict(self.role.dead.counts),
                "verdicts": dict(v.verdicts), "grading_s": v.grading_seconds, "tests_passed": v.tests_passed_sum,
                "lag": input_lag(self.bus, self.role.group, self.topics.rollouts), **self.env_status()}

    def _once(self) -> int:
        t0 = time.perf_counter()
        n = self.role.run_once(timeout_s=POLL_S)
        if n:
            self.steps.observe(time.perf_counter() - t0)
            self.rollouts_consumed += n
        return n

    def report_environment(self, now: float) -> bool:
        """Publish this process's environment load when it serves tool calls and ENV_REPORT_S have passed since
        the last report (busy_fraction 0-1, slots, running, queued, time_s: the Unix time of the reading)."""
        if now - self._env_reported < ENV_REPORT_S:  # (called after every poll: read the status only when due)
            return False
        env = self.env_status()
        if not env:
            return False
        self._env_reported = now
        values = {"busy_fraction": float(env["env_busy_fraction"]), "slots": float(env["env_slots"]),
                  "running": float(env["env_running"]), "queued": float(env["env_queued"]), "time_s": time.time()}
        try:
            self.bus.publish(self.topics.metrics, MetricRecord("environment", 0, values, source=self.ctx.role_id),
                             key=self.ctx.role_id)
        except Exception as exc:  # a load report is informative: the next one goes out in ENV_REPORT_S
            log.warning("environment load report failed: %r", exc)
        return True

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            retry_io(self._once, stop, what="scoring batch", on_error=self.role.rewind)
            self.report_environment(time.monotonic())
        self.role.consumer.close()
        self.bus.close()
        self.verifier.close()
