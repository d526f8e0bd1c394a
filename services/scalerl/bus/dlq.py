"""Dead-letter handling shared by every role: a bad record is parked with its reason, never raised."""

from __future__ import annotations

import logging

from scalerl.bus.base import Bus, Record

log = logging.getLogger(__name__)


def dead_letter(bus: Bus, dlq_topic: str, record: Record, reason: str) -> None:
    """Publish `record` to the dead-letter topic with a `reason` header and its origin."""
    headers = dict(record.headers)
    headers.update({"reason": reason[:500], "origin_topic": record.topic,
                    "origin_partition": str(record.partition), "origin_offset": str(record.offset)})
    log.warning("dead-lettered %s@%d: %s", record.topic, record.offset, reason)
    bus.publish(dlq_topic, record.value, key=record.key, headers=headers)
