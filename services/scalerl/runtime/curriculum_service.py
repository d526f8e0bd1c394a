"""The curriculum as a service (`scalerl serve curriculum`): issues prompts on `prompts`, learns pass rates
from `scored`, keeps flow control from the learner's announcements on `policy`; its state in the store."""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from scalerl.bus.background import BackgroundConsumer
from scalerl.bus.dlq import DeadLetters
from scalerl.bus.fencing import FenceFilter
from scalerl.bus.validate import reason_for
from scalerl.curriculum.curriculum import Curriculum, CurriculumExhausted, task_dict
from scalerl.faults.points import crash_point
from scalerl.messages import PolicyVersion, PromptTask, ScoredGroup, task_of
from scalerl.parts import make_task, seed_everything
from scalerl.runtime.limits import job_limits
from scalerl.runtime.roles import POLL_S, ServiceContext, input_lag, retry_io
from scalerl.runtime.setup import make_curriculum
from scalerl.telemetry.hops import hop
from scalerl.telemetry.steps import StepTimes

log = logging.getLogger(__name__)


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
