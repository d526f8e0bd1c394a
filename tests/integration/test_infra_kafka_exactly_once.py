"""Exactly-once bookkeeping of the Kafka bus against the real broker (#27): a sole owner (the learner) keeps
reading from its own positions after it loses its group membership, never from the group's committed
offsets (finding 4: a resumed learner that lost membership before its first commit jumped to the dead
learner's commits, past groups it never trained); a shared consumer still starts from the commits."""

from __future__ import annotations

import os
import time

import pytest

pytestmark = pytest.mark.infra

if not os.environ.get("CI"):  # in CI a missing client is an error, never a skip
    pytest.importorskip("kafka", reason="kafka-python is not installed")
from scalerl.bus.kafka import KafkaBusConsumer  # noqa: E402
from scalerl.messages import MetricRecord  # noqa: E402


def _offsets(c: KafkaBusConsumer, want: int, timeout_s: float = 60) -> list[int]:
    """Poll until `want` records arrived (the broker is shared: wait, do not sample once)."""
    got: list[int] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        got += [r.offset for r in c.poll(timeout_s=0.5, max_records=want - len(got))]
    return got


@pytest.mark.parametrize("sole_owner", [True, False])
def test_a_sole_owner_reads_on_from_its_positions_after_losing_membership(bus, unique, sole_owner):
    topic, group = f"{unique}.scored", f"{unique}.learner"
    bus.ensure_topics([topic], partitions=1)
    for i in range(20):
        bus.publish(topic, MetricRecord("train", i, {}), key="k")
    bus.flush()
    dead = bus.consumer([topic], group)  # the dead learner: read everything and committed it
    assert len(_offsets(dead, 20)) == 20
    dead.commit()
    dead.close()

    resumed = bus.consumer([topic], group, sole_owner=sole_owner)
    try:
        resumed.seek({f"{topic}:0": 5})  # the checkpoint's position
        assert _offsets(resumed, 4) == [5, 6, 7, 8]
        resumed.drop_membership()  # before its first commit (a session lost across a broker restart)
        after = _offsets(resumed, 11, timeout_s=30 if sole_owner else 8)
    finally:
        resumed.close()
    if sole_owner:
        assert after == list(range(9, 20))  # (today's code: [] — it jumped to the dead learner's offset 20)
    else:
        assert after == []  # a shared member takes the group's commits, as its peers do
