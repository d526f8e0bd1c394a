"""KafkaBus against a real broker: codec round trip, partitioning by key, committed offsets, seek,
dead-letter routing and lag. Each test uses its own topics and consumer groups."""

from __future__ import annotations

import os
import random

import pytest

from scalerl.bus.base import TopicNames
from scalerl.bus.factory import open_bus
from scalerl.messages import (
    SCHEMA_VERSION,
    Completion,
    MetricRecord,
    PolicyVersion,
    PromptTask,
    RolloutGroup,
    ScoredGroup,
)

pytestmark = pytest.mark.infra

if not os.environ.get("CI"):  # in CI a missing client is an error, never a skip
    pytest.importorskip("kafka", reason="kafka-python is not installed")
from scalerl.bus.kafka import KafkaBus, dlq_topic  # noqa: E402


def _task(pid: str, epoch: int = 0) -> PromptTask:
    return PromptTask(pid, epoch, f"what is {pid}?", "42", 2, "addition")


def _every_message() -> list[object]:
    task = PromptTask("p-7", 3, "1+2=", "3", 2, "addition", split="eval")
    c1 = Completion([4, 9, 2, 7], [-0.1, -0.25, -0.3, -1.5], [5, 5, 6, 6], [True, True, False, True],
                    "interrupted", "<think>x</think> 3", thinking_tokens=2)
    c2 = Completion([4, 2], [-0.5, -0.625], [6, 6], [True, True], "stop", "3")
    rollout = RolloutGroup(task, [1, 5, 6], [c1, c2], generator_id="generator-3")
    return [task, c1, rollout, ScoredGroup(rollout, [1.0, -1.0], [True, False]),
            PolicyVersion(9, "s3://b/p/policy/v00000009.safetensors", "ab" * 32),
            MetricRecord("train", 12, {"loss": -0.25, "reward_mean": 0.5, "tokens_per_s": 1234.5})]


def test_open_bus_url_gives_kafka(infra) -> None:
    b = open_bus(f"kafka://{infra.kafka_bootstrap}")
    try:
        assert isinstance(b, KafkaBus)
        assert b.bootstrap == [infra.kafka_bootstrap]
    finally:
        b.close()


def test_round_trip_every_message_type(bus: KafkaBus, unique: str, poll_until) -> None:
    topics = TopicNames(unique)
    bus.ensure_topics(topics.all(), partitions=1)
    bus.ensure_topics(topics.all(), partitions=1)  # idempotent
    assert set(topics.all()) <= set(bus._get_admin().list_topics())
    msgs = _every_message()
    for i, m in enumerate(msgs):
        bus.publish(topics.rollouts, m, key=f"key-{i}",
                    headers={"traceparent": f"00-{'a' * 32}-{'b' * 16}-01", "policy_version": str(i)})
    bus.flush()
    c = bus.consumer([topics.rollouts], group=f"{unique}-g")
    try:
        recs = poll_until(c, len(msgs))
        assert [r.value for r in recs] == msgs
        assert [type(r.value) for r in recs] == [type(m) for m in msgs]
        assert [r.key for r in recs] == [f"key-{i}" for i in range(len(msgs))]
        assert [r.offset for r in recs] == list(range(len(msgs)))
        for i, r in enumerate(recs):
            assert r.topic == topics.rollouts and r.partition == 0
            assert r.headers["schema"] == str(SCHEMA_VERSION)
            assert r.headers["traceparent"] == f"00-{'a' * 32}-{'b' * 16}-01"
            assert r.headers["policy_version"] == str(i)
        assert c.positions() == {f"{topics.rollouts}:0": len(msgs)}
        assert c.poll(timeout_s=0.5) == []
    finally:
        c.close()


def test_large_rollout_group_fits(bus: KafkaBus, unique: str, poll_until) -> None:
    """A ~3 MB rollout group (past Kafka's 1 MB default) goes through, compressed."""
    rng = random.Random(0)
    task = _task("big")
    comps = [Completion([rng.randrange(50000) for _ in range(6000)],
                        [-rng.random() for _ in range(6000)], [1] * 3000 + [2] * 3000,
                        [True] * 6000, "length", "x" * 100) for _ in range(16)]
    group = RolloutGroup(task, list(range(200)), comps)
    from scalerl.messages import encode

    assert len(encode(group)) > 2_000_000
    bus.ensure_topics([f"{unique}.rollouts"])
    bus.publish(f"{unique}.rollouts", group, key="big")
    bus.flush()
    c = bus.consumer([f"{unique}.rollouts"], group=f"{unique}-g")
    try:
        recs = poll_until(c, 1)
        assert len(recs) == 1 and recs[0].value == group
    finally:
        c.close()


def test_keys_keep_a_prompt_group_on_one_partition(bus: KafkaBus, unique: str, poll_until) -> None:
    topic = f"{unique}.rollouts"
    bus.ensure_topics([topic], partitions=4)
    assert bus.partitions(topic) == [0, 1, 2, 3]
    prompt_ids = [f"prompt-{i}" for i in range(12)]
    for epoch in range(4):
        for pid in prompt_ids:
            bus.publish(topic, _task(pid, epoch), key=pid)
    bus.flush()
    c = bus.consumer([topic], group=f"{unique}-g")
    try:
        recs = poll_until(c, 48)
    finally:
        c.close()
    assert len(recs) == 48
    by_key: dict[str, list] = {}
    for r in recs:
        assert r.key == r.value.prompt_id
        by_key.setdefault(r.key, []).append(r)
    assert sorted(by_key) == sorted(prompt_ids)
    for pid, rs in by_key.items():
        assert len({r.partition for r in rs}) == 1, f"{pid} spread over partitions"
        # within the partition the group keeps its publish order
        assert [r.value.epoch for r in sorted(rs, key=lambda r: r.offset)] == [0, 1, 2, 3]
    assert len({r.partition for r in recs}) > 1, "keys should spread over the 4 partitions"


def test_committed_offsets_survive_a_new_consumer(bus: KafkaBus, unique: str, poll_until) -> None:
    topic = f"{unique}.scored"
    bus.ensure_topics([topic], partitions=3)
    sent = [f"p{i}" for i in range(30)]
    for pid in sent:
        bus.publish(topic, _task(pid), key=pid)
    bus.flush()
    group = f"{unique}-learners"

    a = bus.consumer([topic], group)
    try:
        first = poll_until(a, 11, max_records=11)
        assert len(first) == 11
        a.commit()
    finally:
        a.close()
    assert bus.lag(group, topic) == 19

    b = bus.consumer([topic], group)
    try:
        rest = poll_until(b, 19)
        assert b.poll(timeout_s=1.0) == []  # nothing re-delivered beyond the 19 uncommitted
        b.commit(b.positions())
    finally:
        b.close()
    got_a = [r.value.prompt_id for r in first]
    got_b = [r.value.prompt_id for r in rest]
    assert not set(got_a) & set(got_b), "a committed record was delivered again"
    assert sorted(got_a + got_b) == sorted(sent), "records lost"
    assert bus.lag(group, topic) == 0

    c = bus.consumer([topic], group)  # a third member of the group starts at the end
    try:
        assert c.poll(timeout_s=2.0) == []
    finally:
        c.close()


def test_seek_to_saved_positions_rereads_exactly(bus: KafkaBus, unique: str, poll_until) -> None:
    topic = f"{unique}.rollouts"
    bus.ensure_topics([topic], partitions=2)
    for i in range(20):
        bus.publish(topic, _task(f"p{i}"), key=f"p{i}")
    bus.flush()

    c = bus.consumer([topic], f"{unique}-a")
    try:
        head = poll_until(c, 7, max_records=7)
        assert len(head) == 7
        saved = c.positions()  # what a learner stores in its checkpoint
        assert set(saved) == {f"{topic}:0", f"{topic}:1"}
        tail = poll_until(c, 13)
        assert len(tail) == 13
        expected = sorted((r.partition, r.offset, r.value.prompt_id) for r in tail)
        # seek after the group assignment: re-read the same tail
        c.seek(saved)
        again = poll_until(c, 13)
        assert sorted((r.partition, r.offset, r.value.prompt_id) for r in again) == expected
        assert c.poll(timeout_s=0.5) == []
    finally:
        c.close()

    # seek right after creation, before the consumer has joined its group (restart from checkpoint)
    d = bus.consumer([topic], f"{unique}-b")
    try:
        d.seek(saved)
        assert d.positions() == saved
        restored = poll_until(d, 13)
        assert sorted((r.partition, r.offset, r.value.prompt_id) for r in restored) == expected
        assert d.poll(timeout_s=1.0) == []
    finally:
        d.close()


def test_poison_message_goes_to_dlq_and_consumer_continues(bus: KafkaBus, unique: str,
                                                           poll_until) -> None:
    topics = TopicNames(unique)
    bus.ensure_topics([topics.rollouts, topics.dlq])
    assert dlq_topic(topics.rollouts) == topics.dlq
    garbage = bytes(random.Random(1).randrange(256) for _ in range(64))
    newer = b'{"schema": 99, "type": "PromptTask", "data": {}}'
    bus.publish(topics.rollouts, _task("good-1"), key="good-1")
    bus.publish_raw(topics.rollouts, garbage, key=b"bad-1", headers=[("traceparent", b"tp-1")])
    bus.publish(topics.rollouts, _task("good-2"), key="good-2")
    bus.publish_raw(topics.rollouts, newer, key=b"bad-2")
    bus.publish_raw(topics.rollouts, b"[1, 2", key=b"bad-3")
    bus.publish(topics.rollouts, _task("good-3"), key="good-3")
    bus.flush()

    group = f"{unique}-g"
    c = bus.consumer([topics.rollouts], group)
    try:
        good = poll_until(c, 3)
        assert [r.value for r in good] == [_task("good-1"), _task("good-2"), _task("good-3")]
        assert [r.offset for r in good] == [0, 2, 5]
        assert c.poll(timeout_s=0.5) == []
        assert c.positions() == {f"{topics.rollouts}:0": 6}  # the dead letters count as consumed
        c.commit()
    finally:
        c.close()
    assert bus.lag(group, topics.rollouts) == 0

    dead = bus.read_raw(topics.dlq)
    assert [(d.value, d.key) for d in dead] == [(garbage, b"bad-1"), (newer, b"bad-2"), (b"[1, 2", b"bad-3")]
    for d, offset in zip(dead, [1, 3, 4], strict=True):
        assert d.headers["reason"], "a dead letter says why"
        assert d.headers["source_topic"] == topics.rollouts.encode()
        assert d.headers["source_partition"] == b"0"
        assert d.headers["source_offset"] == str(offset).encode()
        assert d.headers["reason"].startswith(b"undecodable: ") and d.headers["role"] == group.encode()
    assert b"schema version 99" in dead[1].headers["reason"]
    assert dead[0].headers["traceparent"] == b"tp-1"  # original headers are kept

    # the consumer keeps working after bad data: a new good record arrives normally
    bus.publish(topics.rollouts, _task("good-4"), key="good-4")
    bus.flush()
    c2 = bus.consumer([topics.rollouts], group)
    try:
        assert [r.value for r in poll_until(c2, 1)] == [_task("good-4")]
    finally:
        c2.close()


def test_lag(bus: KafkaBus, unique: str, poll_until) -> None:
    topic = f"{unique}.prompts"
    bus.ensure_topics([topic], partitions=2)
    group = f"{unique}-g"
    assert bus.lag(group, topic) == 0
    for i in range(9):
        bus.publish(topic, _task(f"p{i}"), key=f"p{i}")
    bus.flush()
    assert bus.lag(group, topic) == 9  # never committed: everything is pending
    c = bus.consumer([topic], group)
    try:
        got = poll_until(c, 4, max_records=4)
        assert len(got) == 4
        c.commit()
        assert bus.lag(group, topic) == 5
        assert bus.committed(group, topic) == {
            int(k.rsplit(":", 1)[1]): v for k, v in c.positions().items() if v > 0}
        poll_until(c, 5)
        c.commit()
        assert bus.lag(group, topic) == 0
    finally:
        c.close()
    bus.publish(topic, _task("late"), key="late")
    bus.flush()
    assert bus.lag(group, topic) == 1
    assert bus.lag(f"{unique}-other", topic) == 10
