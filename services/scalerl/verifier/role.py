"""Verifier role on the bus: `rollouts` -> `scored`. Stateless; a bad record goes to `dlq`."""

from __future__ import annotations

from scalerl.bus import Bus, TopicNames
from scalerl.bus.dlq import dead_letter
from scalerl.messages import RolloutGroup
from scalerl.telemetry.hops import hop
from scalerl.verifier.verifier import Verifier


class VerifierRole:
    def __init__(self, verifier: Verifier, bus: Bus, topics: TopicNames, group: str = "verifiers") -> None:
        self.verifier = verifier
        self.bus = bus
        self.topics = topics
        self.group = group
        self.consumer = bus.consumer([topics.rollouts], group)
        self.scored = 0
        self.dead_lettered = 0

    def rewind(self) -> None:
        """After a failed batch: rejoin the group from its committed offsets (the batch is re-read)."""
        self.consumer.close()
        self.consumer = self.bus.consumer([self.topics.rollouts], self.group)

    def run_once(self, timeout_s: float = 0.0) -> int:
        """Score what is available; returns the number of records handled."""
        records = self.consumer.poll(timeout_s=timeout_s)
        for rec in records:
            if not isinstance(rec.value, RolloutGroup):
                dead_letter(self.bus, self.topics.dlq, rec, f"expected RolloutGroup, got {type(rec.value).__name__}")
                self.dead_lettered += 1
                continue
            with hop("verifier.score", rec.headers) as headers:
                try:
                    scored = self.verifier.score(rec.value)
                except Exception as exc:  # a verifier bug on one record must not stop the role
                    dead_letter(self.bus, self.topics.dlq, rec, f"scoring failed: {exc!r}")
                    self.dead_lettered += 1
                    continue
                self.bus.publish(self.topics.scored, scored, key=rec.key, headers=headers)
            self.scored += 1
        if records:
            self.bus.flush()
            self.consumer.commit()
        return len(records)
