"""The one dead-letter path: a record a role cannot use is parked in `<job>.dlq` with why, never raised.

One owner per topic, so each bad record is dead-lettered exactly once (`DLQ_OWNERS`): the consumer
group that must act on a topic's records dead-letters them, every other reader skips and counts them.

    prompts -> generators   rollouts -> verifiers   scored -> learner   policy -> curriculum
    metrics -> nobody (read by the operator and tools only)   dlq -> never re-routed

One header schema (`DLQ_HEADERS`), on undecodable records (copied raw by the Kafka consumer) and on
decoded ones that fail validation (`scalerl.bus.validate`) alike:

    reason            "<code>: <what was wrong>" (codes: scalerl.bus.validate.REASON_CODES)
    source_topic      the topic the record was read from
    source_partition  its partition
    source_offset     its offset there
    role              the consumer group (or role) that dead-lettered it
    dead_lettered_ms  when, in Unix milliseconds

The record's own headers are kept. `scalerl dlq list` shows dead letters, `scalerl dlq replay` sends
chosen ones back to their source topic once the cause is fixed (`replay_headers`).
"""

from __future__ import annotations

import logging
import time

from scalerl.bus.base import Bus, Record

log = logging.getLogger(__name__)

DLQ_HEADERS = ("reason", "source_topic", "source_partition", "source_offset", "role", "dead_lettered_ms")
REPLAYED_FROM = "replayed_from_dlq_offset"
REASON_MAX_CHARS = 1000
DLQ_OWNERS = {"prompts": "generators", "rollouts": "verifiers", "scored": "learner", "policy": "curriculum"}


def dlq_headers(reason: str, topic: str, partition: int, offset: int, role: str,
                now_ms: int | None = None) -> dict[str, str]:
    """The dead-letter headers of one record (see the module docstring)."""
    return {"reason": reason[:REASON_MAX_CHARS], "source_topic": topic, "source_partition": str(partition),
            "source_offset": str(offset), "role": role,
            "dead_lettered_ms": str(now_ms if now_ms is not None else int(time.time() * 1000))}


def replay_headers(headers: dict[str, bytes], dlq_offset: int) -> list[tuple[str, bytes]]:
    """A dead letter's (raw) headers for its replay: the dead-letter ones removed,
    `replayed_from_dlq_offset` added."""
    out = [(k, v) for k, v in headers.items() if k not in DLQ_HEADERS and k != REPLAYED_FROM]
    return [*out, (REPLAYED_FROM, str(dlq_offset).encode())]


def dead_letter(bus: Bus, dlq_topic: str, record: Record, reason: str, role: str) -> None:
    """Publish the decoded `record` to the dead-letter topic with the dead-letter headers."""
    headers = {k: v for k, v in record.headers.items() if k not in DLQ_HEADERS}
    headers.update(dlq_headers(reason, record.topic, record.partition, record.offset, role))
    log.warning("dead-lettered %s:%d@%d (%s): %s", record.topic, record.partition, record.offset, role, reason)
    bus.publish(dlq_topic, record.value, key=record.key, headers=headers)


class DeadLetters:
    """A role's gate to the dead-letter topic: sends (when the role owns the topic) and counts by reason
    code (`counts`, for the role's status, metrics and summary)."""

    def __init__(self, bus: Bus, dlq_topic: str, role: str) -> None:
        self.bus = bus
        self.dlq_topic = dlq_topic
        self.role = role
        self.counts: dict[str, int] = {}

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def count(self, reason: str) -> None:
        code = reason.split(":", 1)[0]
        self.counts[code] = self.counts.get(code, 0) + 1

    def send(self, record: Record, reason: str) -> None:
        """Dead-letter `record` (the caller flushes before committing its offset) and count it."""
        dead_letter(self.bus, self.dlq_topic, record, reason, self.role)
        self.count(reason)
