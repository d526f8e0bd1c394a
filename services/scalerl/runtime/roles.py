"""The generator, verifier and curriculum as long-running services (one per process) over a durable bus.

Each service is built from the job spec plus the bus and store URLs, runs `run(stop)` until the
`stop` event is set (SIGTERM), and then hands back what it holds: a generator finishes the batch it is
generating, publishes it and commits; uncommitted prompts are re-delivered to another generator of
the group. `status()` feeds the gRPC Status call and Prometheus; `ready()` the /readyz probe; `steps`
(StepTimes) takes the duration of every unit of work that did something, for the step-time histogram.

Delivery is at least once everywhere (offsets are committed after the output is produced); every
consumer downstream recognises a duplicate by its group id (prompt id @ epoch).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from scalerl.bus import Bus, TopicNames, open_bus
from scalerl.bus.background import BackgroundConsumer
from scalerl.bus.dlq import DeadLetters
from scalerl.bus.fencing import FenceFilter
from scalerl.bus.validate import reason_for
from scalerl.config import JobSpec
from scalerl.curriculum.curriculum import Curriculum, CurriculumExhausted, task_dict
from scalerl.faults.bus import wrap_bus
from scalerl.faults.points import crash_point
from scalerl.generator.factory import make_engine
from scalerl.generator.role import GeneratorRole
from scalerl.messages import PolicyVersion, PromptTask, ScoredGroup, task_of
from scalerl.model.factory import embedding_rows, load_model_and_tokenizer, resolve_device
from scalerl.parts import configure_threads, make_task, make_verifier, seed_everything
from scalerl.runtime.setup import job_limits, make_curriculum
from scalerl.store import Store, open_store
from scalerl.store.fencing import Fenced
from scalerl.telemetry.hops import hop
from scalerl.telemetry.steps import StepTimes
from scalerl.verifier.role import VerifierRole

log = logging.getLogger(__name__)
T = TypeVar("T")

POLL_S = 0.2


@dataclass
class ServiceContext:
    """Everything a role process needs: the job, where the bus and store are, who it is."""

    spec: JobSpec
    bus_url: str
    store_url: str
    role_id: str
    out_dir: Path = field(default_factory=lambda: Path("runs"))

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


class GeneratorService:
    def __init__(self, ctx: ServiceContext) -> None:
        spec = ctx.spec
        seed_everything(spec.seed)
        configure_threads(spec)
        self.ctx = ctx
        self.bus, self.store, self.topics = ctx.open()
        model, self.tokenizer = load_model_and_tokenizer(spec.model, spec.seed)  # weights come from the store
        model.to(resolve_device(spec.model.device)).eval()
        self.engine = make_engine(spec, model, self.tokenizer, seed=role_seed(spec, ctx.role_id),
                                  workdir=ctx.out_dir / f"{ctx.role_id}-init")
        log.info("%s: sampling with %s (generation.engine %s)", ctx.role_id, type(self.engine).__name__,
                 spec.generation.engine)
        self.engine_lock = threading.Lock()  # the bus loop and gRPC Generate/UpdateWeights share the engine
        limits = job_limits(spec, make_task(spec), embedding_rows(model))
        self.role = GeneratorRole(spec, self.engine, self.tokenizer, self.bus, self.store, self.topics, limits,
                                  generator_id=ctx.role_id, group=self.topics.group("generators"))
        # Announcements are read in the background: the check between decode steps costs no I/O.
        self.role.policy = BackgroundConsumer(self.role.policy, name="policy-reader")
        self.steps = StepTimes()
        self.prompts_consumed = 0

    def ready(self) -> bool:
        """Ready once it holds an announced policy (it never samples with untrained weights)."""
        return self.role.loaded is not None

    def status(self) -> dict[str, Any]:
        return {"role": "generator", "id": self.ctx.role_id, "policy_version": self.engine.version,
                "ready": self.ready(), "tokens_generated": self.role.gen_tokens,
                "groups_generated": self.role.groups_out, "prompts_consumed": self.prompts_consumed,
                "staleness_versions": self.role.staleness,
                "swaps_in_flight": self.engine.swaps_in_flight,
                "dead_lettered": dict(self.role.dead.counts),
                "lag": input_lag(self.bus, self.role.group, self.topics.prompts)}

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set() and not self.ready():  # wait for the learner's first announcement
            update = retry_io(lambda: self.role.poll_policy(timeout_s=POLL_S), stop, what="policy fetch")
            if update is not None:
                self.engine.load_weights(update[1], update[0])

        def once() -> int:
            with self.engine_lock:
                t0 = time.perf_counter()
                n = self.role.run_once(timeout_s=POLL_S)
            if n:
                self.steps.observe(time.perf_counter() - t0)
                self.prompts_consumed += n
            return n

        while not stop.is_set():
            retry_io(once, stop, what="generation batch", on_error=self.role.rewind)
        self.close()

    def close(self) -> None:
        self.role.prompts.close()
        self.role.policy.close()
        self.bus.flush()
        self.bus.close()


class VerifierService:
    def __init__(self, ctx: ServiceContext) -> None:
        seed_everything(ctx.spec.seed)
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

    def ready(self) -> bool:
        return True

    def status(self) -> dict[str, Any]:
        rpc = self.rpc_scored()
        return {"role": "verifier", "id": self.ctx.role_id, "ready": True, "groups_scored": self.role.scored + rpc,
                "rollouts_consumed": self.rollouts_consumed + rpc, "dead_lettered": dict(self.role.dead.counts),
                "lag": input_lag(self.bus, self.role.group, self.topics.rollouts)}

    def _once(self) -> int:
        t0 = time.perf_counter()
        n = self.role.run_once(timeout_s=POLL_S)
        if n:
            self.steps.observe(time.perf_counter() - t0)
            self.rollouts_consumed += n
        return n

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            retry_io(self._once, stop, what="scoring batch", on_error=self.role.rewind)
        self.role.consumer.close()
        self.bus.close()


CURRICULUM_STATE = "curriculum/state.json"


class CurriculumService:
    """Issues prompts; learns pass rates from `scored` (No-Positive-Resampling); flow control from the
    learner's progress on `policy`: at most `max_inflight` prompts issued and not yet decided, where the
    learner's announcements say how many groups it has decided (`learner_consumed`: trained, dropped or
    dead-lettered by the learner, or held while it waits for fresher rollouts: `scalerl.runtime.learner_intake`;
    B per step when a learner does not say) and the curriculum counts the
    issued prompts that were dead-lettered before they reached `scored` (by a generator or a verifier: read
    from the dead-letter topic, each issued group once; `dead_upstream`).

    State is written ahead: every round that changed it saves it to the store *before* it publishes, with the
    round's new tasks (numbered: `PromptTask.seq`) listed as `unconfirmed` until the bus confirms them. A
    restart publishes the unconfirmed tasks again under the same numbers, so an issue number never names two
    prompts, and the learner skips the copies (`scalerl.bus.dedup`). (Within one process a failed flush is
    not published again: the bus keeps the failed sends and sends them with the next flush.) Saving after
    publishing let a restarted curriculum draw that batch again, and at an epoch boundary draw other prompts
    (the next epoch's order depends on the pass rates read by then)."""

    def __init__(self, ctx: ServiceContext) -> None:
        spec = ctx.spec
        seed_everything(spec.seed)
        self.ctx = ctx
        self.bus, self.store, self.topics = ctx.open()
        task = make_task(spec)
        self.curriculum = make_curriculum(spec, task.problems("train"))
        self.limits = job_limits(spec, task)
        self.issued = 0
        self.groups_scored = 0
        self.learner_version = 0
        self.learner_consumed: int | None = None
        self.dead_upstream = 0  # issued groups dead-lettered before `scored` (see the class docstring)
        self.fence = FenceFilter()
        self.exhausted = False
        self.unconfirmed: list[PromptTask] = []  # saved as issued, not yet confirmed by the bus (class docstring)
        self.republish: list[PromptTask] = []
        if self.store.exists(CURRICULUM_STATE):
            state = json.loads(self.store.get_bytes(CURRICULUM_STATE))
            self.curriculum.load_state_dict(state["curriculum"])
            # Issued prompts are in the durable log already: outstanding, not to be issued again.
            self.curriculum.pending = {Curriculum.key(t): t for t in self.curriculum.reissue}
            self.curriculum.reissue = []
            self.issued = int(state["issued"])
            self.dead_upstream = int(state.get("dead_upstream", 0))
            # published by a process that died before the bus confirmed them: published again, once
            self.republish = [PromptTask(**t) for t in state.get("unconfirmed", [])]
            self.unconfirmed = list(self.republish)
            log.info("curriculum resumed: %d prompts issued, epoch %d", self.issued, self.curriculum.epoch)
        # `scored` is the learner's to dead-letter (the curriculum skips and counts what it cannot use);
        # `policy` is the curriculum's (one replica; generators only skip)
        self.scored = self.bus.consumer([self.topics.scored], self.topics.group("curriculum"), dead_letters=False)
        self.policy = BackgroundConsumer(self.bus.reader([self.topics.policy], dead_letters=True,
                                                         role=self.topics.group("curriculum")), name="policy-reader")
        self.dead_letters = BackgroundConsumer(self.bus.reader([self.topics.dlq], role=self.topics.group("curriculum")),
                                               name="dlq-reader")
        self.dead = DeadLetters(self.bus, self.topics.dlq, self.topics.group("curriculum"))
        self.skipped: dict[str, int] = {}  # scored records not used, by reason code (dead-lettered by the learner)
        self.records_in = 0  # scored records read, used or skipped
        self.steps = StepTimes()

    def ready(self) -> bool:
        return True

    def status(self) -> dict[str, Any]:
        return {"role": "curriculum", "id": self.ctx.role_id, "ready": True, "prompts_issued": self.issued,
                "policy_version": self.learner_version, "epoch": self.curriculum.epoch,
                "prompts_inflight": self.outstanding(), "prompts_retired": self.curriculum.retired_count,
                "groups_scored": self.groups_scored, "scored_consumed": self.records_in, "exhausted": self.exhausted,
                "dead_lettered": dict(self.dead.counts), "scored_skipped": dict(self.skipped),
                "dead_upstream": self.dead_upstream,
                "lag": input_lag(self.bus, self.topics.group("curriculum"), self.topics.scored)}

    def outstanding(self) -> int:
        consumed = self.learner_consumed
        if consumed is None:
            consumed = self.ctx.spec.train.prompts_per_step * self.learner_version
        return max(0, self.issued - consumed - self.dead_upstream)

    def _read_dead_letters(self) -> int:
        """Issued groups dead-lettered before they reached `scored` since the last round: each decided once."""
        n = 0
        for rec in self.dead_letters.poll(timeout_s=0.0):
            task = None if isinstance(rec.value, ScoredGroup) else task_of(rec.value)  # (not a scored group's)
            if task is not None and self.curriculum.pending.pop(Curriculum.key(task), None) is not None:
                n += 1
        self.dead_upstream += n
        return n

    def step(self, timeout_s: float = POLL_S) -> int:
        """One round: read progress, issue what flow control allows, save state. Returns prompts issued."""
        for rec in self.policy.poll(timeout_s=0.0):
            if isinstance(rec.value, PolicyVersion):  # the last announcement carries the learner's step
                if not self.fence.admits(rec.headers):
                    continue  # a fenced learner's (scalerl.bus.fencing)
                step = rec.headers.get("learner_step", "")
                self.learner_version = int(step) if step.isdigit() else rec.value.version
                consumed = rec.headers.get("learner_consumed", "")
                self.learner_consumed = int(consumed) if consumed.isdigit() else None
            else:
                self.dead.send(rec, f"wrong_type: expected PolicyVersion, got {type(rec.value).__name__}")
        scored = []
        records = self.scored.poll(timeout_s=timeout_s)
        t0 = time.perf_counter()  # the round's work, after the wait for records
        self.records_in += len(records)
        for rec in records:
            reason = reason_for(rec.value, ScoredGroup, self.limits)
            if reason is None:
                scored.append(rec.value)
            else:  # the learner dead-letters it; here it only must not count as an observation
                code = reason.split(":", 1)[0]
                self.skipped[code] = self.skipped.get(code, 0) + 1
        self.curriculum.consumed(scored)  # pass-rate history; duplicates are ignored
        self.groups_scored += len(scored)
        dead = self._read_dead_letters()
        tasks = []
        if not self.exhausted:
            try:
                tasks = self.curriculum.next_tasks(outstanding=self.outstanding())
            except CurriculumExhausted as exc:
                log.error("%s; no more prompts will be issued", exc)
                self.exhausted = True
        republish, self.republish = self.republish, []  # (a dead process's unconfirmed round: once)
        if tasks or scored or dead:  # write ahead: saved before it is published (see the class docstring)
            self.issued += len(tasks)
            self.unconfirmed += tasks
            self.store.put_bytes(CURRICULUM_STATE, json.dumps(
                {"curriculum": self.curriculum.state_dict(), "issued": self.issued,
                 "dead_upstream": self.dead_upstream, "unconfirmed": [task_dict(t) for t in self.unconfirmed]}
            ).encode())
        for task in republish + tasks:
            with hop("curriculum.issue", {"policy_version": str(self.learner_version)}, root=True) as headers:
                self.bus.publish(self.topics.prompts, task, key=task.prompt_id, headers=headers)
        if tasks or scored or dead or self.unconfirmed:
            # (a failed flush raises and the round is retried: the bus keeps the failed sends and sends them
            # again with the next flush, so a retried round publishes nothing twice)
            self.bus.flush()
            if tasks:
                crash_point("curriculum.issue")
            self.unconfirmed = []
            self.scored.commit()
            self.steps.observe(time.perf_counter() - t0)
        return len(tasks)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            retry_io(self.step, stop, what="curriculum round")
        self.scored.close()
        self.policy.close()
        self.dead_letters.close()
        self.bus.close()
