"""Bus interface shared by the in-memory and Kafka transports.

Ordering invariant (both transports): within one (topic, partition) records are delivered in offset
order; `commit()` stores, for each partition, the offset of the *next* record to read, exactly as
Kafka does. `positions()` returns the same mapping for what has been polled so far, so the learner can
save it in a checkpoint and `seek()` back to it on restart.

Example::

    bus.publish("job.prompts", task, key=task.prompt_id)
    c = bus.consumer(["job.prompts"], group="generators")
    for rec in c.poll(timeout_s=0.1):
        ...produce output...
    c.commit()            # only after the output is produced
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

TOPIC_KINDS = ("prompts", "rollouts", "scored", "policy", "metrics", "dlq")


@dataclass(frozen=True, slots=True)
class TopicNames:
    """Per-job topic names: `<job>.<kind>`, where `job` is the spec's `runtime.bus_prefix`, else its name
    (`TopicNames.of(spec)`)."""

    job: str

    @classmethod
    def of(cls, spec: Any) -> TopicNames:
        return cls(spec.runtime.bus_prefix or spec.name)

    @property
    def prompts(self) -> str:
        return f"{self.job}.prompts"

    @property
    def rollouts(self) -> str:
        return f"{self.job}.rollouts"

    @property
    def scored(self) -> str:
        return f"{self.job}.scored"

    @property
    def policy(self) -> str:
        return f"{self.job}.policy"

    @property
    def metrics(self) -> str:
        return f"{self.job}.metrics"

    @property
    def dlq(self) -> str:
        return f"{self.job}.dlq"

    def all(self) -> list[str]:
        return [f"{self.job}.{k}" for k in TOPIC_KINDS]

    def group(self, role: str) -> str:
        """The consumer group of a role's replicas in this job, e.g. `<job>.generators`."""
        return f"{self.job}.{role}"


@dataclass(frozen=True, slots=True)
class Record:
    """One delivered message. `value` is the decoded message object."""

    topic: str
    partition: int
    offset: int
    key: str | None
    value: Any
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def position_key(self) -> str:
        """"topic:partition", the key used in `positions()` / `seek()` mappings."""
        return f"{self.topic}:{self.partition}"


class Consumer(ABC):
    """A member of a consumer group reading some topics."""

    @abstractmethod
    def poll(self, timeout_s: float = 0.0, max_records: int = 1000) -> list[Record]:
        """Return the next records (possibly none after waiting up to `timeout_s`)."""

    @abstractmethod
    def commit(self, positions: dict[str, int] | None = None) -> None:
        """Commit `positions` ("topic:partition" -> next offset), or everything polled so far."""

    @abstractmethod
    def positions(self) -> dict[str, int]:
        """"topic:partition" -> offset of the next record this consumer will return."""

    @abstractmethod
    def seek(self, positions: dict[str, int]) -> None:
        """Continue reading each partition from the given offset."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (leave the group)."""


class Bus(ABC):
    """A publish/subscribe log with consumer groups."""

    @abstractmethod
    def publish(self, topic: str, value: Any, *, key: str | None = None,
                headers: dict[str, str] | None = None) -> None:
        """Append `value` (a message from `scalerl.messages`) to `topic`."""

    @abstractmethod
    def consumer(self, topics: list[str], group: str, *, dead_letters: bool = True,
                 sole_owner: bool = False) -> Consumer:
        """Join consumer group `group` on `topics`; starts from the group's committed offsets.
        `dead_letters`: this group owns the dead letters of `topics` (`scalerl.bus.dlq.DLQ_OWNERS`): a
        record that does not decode is copied to the dead-letter topic; otherwise it is only skipped.
        (The memory bus passes objects, never bytes: nothing there fails to decode.)
        `sole_owner`: the group's only member, whose own positions (restored by `seek` or read so far) always
        win over the group's committed offsets, after every rebalance too (the learner: its positions live
        in its checkpoints)."""

    def reader(self, topics: list[str], *, dead_letters: bool = False, role: str = "reader") -> Consumer:
        """Every record of `topics` from the beginning, for this reader alone (commits nothing);
        `dead_letters` / `role` as for `consumer` (role: who is named in the dead-letter headers)."""
        return self.consumer(topics, group=f"{role}-{uuid.uuid4().hex}", dead_letters=dead_letters)

    def partitions(self, topic: str) -> list[int]:
        """The partition ids of `topic` (one partition, 0, unless the transport has more)."""
        return [0]

    def ensure_topics(self, topics: list[str], partitions: int = 1) -> None:  # noqa: B027
        """Create the topics if the transport needs it (Kafka); a no-op in memory."""

    def flush(self) -> None:  # noqa: B027
        """Block until every published message is durable."""

    def close(self) -> None:  # noqa: B027
        """Release connections."""
