"""Verifier role on the bus: `rollouts` -> `scored`. Stateless. It owns the dead letters of `rollouts`: a
record that does not decode, is not a RolloutGroup, breaks a rule of `scalerl.bus.validate` (the policy
version bound is the learner's to check: the verifier does not know the current version) or makes the
verifier raise goes to `dlq` with its reason and is counted; the role carries on."""

from __future__ import annotations

from scalerl.bus import Bus, TopicNames
from scalerl.bus.dlq import DeadLetters
from scalerl.bus.validate import Limits, reason_for
from scalerl.faults.points import crash_point
from scalerl.messages import RolloutGroup
from scalerl.telemetry.hops import hop
from scalerl.verifier.verifier import Verifier


class VerifierRole:
    def __init__(self, verifier: Verifier, bus: Bus, topics: TopicNames, limits: Limits,
                 group: str = "verifiers") -> None:
        self.verifier = verifier
        self.bus = bus
        self.topics = topics
        self.limits = limits
        self.group = group
        self.consumer = bus.consumer([topics.rollouts], group)
        self.dead = DeadLetters(bus, topics.dlq, group)
        self.scored = 0

    @property
    def dead_lettered(self) -> int:
        return self.dead.total

    def rewind(self) -> None:
        """After a failed batch: rejoin the group from its committed offsets (the batch is re-read)."""
        self.consumer.close()
        self.consumer = self.bus.consumer([self.topics.rollouts], self.group)

    def run_once(self, timeout_s: float = 0.0) -> int:
        """Score what is available; returns the number of records handled."""
        records = self.consumer.poll(timeout_s=timeout_s)
        for rec in records:
            reason = reason_for(rec.value, RolloutGroup, self.limits)
            if reason is not None:
                self.dead.send(rec, reason)
                continue
            with hop("verifier.score", rec.headers) as headers:
                try:
                    scored = self.verifier.score(rec.value)
                except Exception as exc:  # a verifier bug on one record must not stop the role
                    self.dead.send(rec, f"step_failed: the verifier raised {exc!r}")
                    continue
                self.bus.publish(self.topics.scored, scored, key=rec.key, headers=headers)
            self.scored += 1
        if records:
            crash_point("verifier.batch")
            self.bus.flush()
            self.consumer.commit()
        return len(records)
