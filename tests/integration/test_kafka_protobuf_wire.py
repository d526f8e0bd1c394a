"""The Kafka bus carries protobuf `scalerl.v1.Envelope` bytes: what lands on the real broker decodes
with `decode_envelope` to the message published, byte-identical to `encode_envelope`; a protobuf
envelope of another schema version goes to the dead-letter topic with the reason."""

from __future__ import annotations

import os

import pytest

from scalerl.bus.base import TopicNames
from scalerl.messages import (
    SCHEMA_VERSION,
    Completion,
    MetricRecord,
    PolicyVersion,
    PromptTask,
    RolloutGroup,
    ScoredGroup,
    encode,
)
from scalerl.rpc.convert import decode_envelope, encode_envelope, to_proto
from scalerl.rpc.gen.scalerl.v1 import messages_pb2 as pb

pytestmark = pytest.mark.infra

if not os.environ.get("CI"):  # in CI a missing client is an error, never a skip
    pytest.importorskip("kafka", reason="kafka-python is not installed")
from scalerl.bus.kafka import KafkaBus  # noqa: E402


def _messages() -> list[object]:
    task = PromptTask("p-1", 1, "3+4=", "7", 2, "addition")
    c = Completion([4, 9, 2], [-0.1, -1 / 3, -2.5], [3, 3, 4], [True, False, True], "interrupted", "x", 1)
    rollout = RolloutGroup(task, [1, 2], [c, c])
    return [task, c, rollout, ScoredGroup(rollout, [1.0, -1.0], [True, False]),
            PolicyVersion(4, "s3://b/p/policy/v4.safetensors", "cd" * 32), MetricRecord("eval", 5, {"pass_rate": 0.25})]


def test_records_on_the_broker_are_protobuf_envelopes(bus: KafkaBus, unique: str, poll_until) -> None:
    topics = TopicNames(unique)
    bus.ensure_topics([topics.rollouts, topics.dlq])
    msgs = _messages()
    for i, msg in enumerate(msgs):
        bus.publish(topics.rollouts, msg, key=f"k{i}")
    newer = pb.Envelope(schema_version=SCHEMA_VERSION + 1)
    newer.prompt_task.CopyFrom(to_proto(msgs[0]))
    bus.publish_raw(topics.rollouts, newer.SerializeToString(), key=b"newer")
    bus.flush()

    raw = bus.read_raw(topics.rollouts)
    assert len(raw) == len(msgs) + 1
    for rec, msg in zip(raw, msgs, strict=False):
        assert rec.value == encode_envelope(msg) and rec.value[:1] != b"{"
        assert decode_envelope(rec.value, expected=type(msg)) == msg
        assert len(rec.value) < len(encode(msg))  # smaller than the JSON it replaces
        assert rec.headers["schema"] == str(SCHEMA_VERSION).encode()

    consumer = bus.consumer([topics.rollouts], group=f"{unique}-g")
    try:
        assert [r.value for r in poll_until(consumer, len(msgs))] == msgs
        assert consumer.poll(timeout_s=1.0) == []
        assert consumer.positions() == {f"{topics.rollouts}:0": len(msgs) + 1}
    finally:
        consumer.close()
    (dead,) = bus.read_raw(topics.dlq)
    assert dead.key == b"newer" and dead.value == newer.SerializeToString()
    assert f"schema version {SCHEMA_VERSION + 1} != {SCHEMA_VERSION}".encode() in dead.headers["reason"]
