"""The protobuf codec: exact round trips of the six messages, hand-worked bytes, and MessageError (never
anything else) on garbage, truncation, wrong type, another schema version and invalid contents."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from typing import Any

import pytest

from scalerl import messages as m
from scalerl.messages import (
    SCHEMA_VERSION,
    Completion,
    MessageError,
    MetricRecord,
    PolicyVersion,
    PromptTask,
    RolloutGroup,
    ScoredGroup,
)
from scalerl.rpc.convert import decode_envelope, encode_envelope, fill_status, from_proto, status_dict, to_proto
from scalerl.rpc.gen.scalerl.v1 import messages_pb2 as pb
from scalerl.rpc.gen.scalerl.v1 import services_pb2 as spb

# Doubles that a float32 wire type would not carry: 0.1 and 1/3 have no short binary form, the
# subnormal and 1e300 are outside float32's range, -0.0 keeps its sign only if bits are copied.
HARD_FLOATS = [-0.1, -1 / 3, -2.5e-320, -1e300, -0.0, -7.0]


def _task(split: str = "train") -> PromptTask:
    return PromptTask("p-7", 2**40, "12+34=é", "46", 16, "addition", split=split)  # type: ignore[arg-type]


def _completions() -> list[Completion]:
    c1 = Completion(list(range(1000, 1006)), HARD_FLOATS, [5, 5, 6, 6, 6, 9], [True, True, False, False, True, True],
                    "interrupted", "<think>x</think> 46", thinking_tokens=3)
    c2 = Completion([7, 2], [-0.5, -0.625], [6, 6], [True, True], "stop", "46")
    c3 = Completion([], [], [], [], "length", "")
    return [c1, c2, c3]


def _every_message() -> list[object]:
    rollout = RolloutGroup(_task("eval"), [1, 5, 6], _completions(), generator_id="generator-3")
    return [_task(), _completions()[0], rollout, ScoredGroup(rollout, [1.0, -1.0, -0.75], [True, False, False]),
            PolicyVersion(2**62, "s3://b/p/policy/v00000009.safetensors", "ab" * 32),
            MetricRecord("train", 12, {"z_last": 1.0, "loss": -0.25, "tokens_per_s": 1234.5})]


def _bits(xs: list[float]) -> list[bytes]:
    return [struct.pack("<d", x) for x in xs]


@pytest.mark.parametrize("msg", _every_message(), ids=lambda x: type(x).__name__)
def test_every_message_round_trips_exactly(msg: object) -> None:
    data = encode_envelope(msg)
    back = decode_envelope(data, expected=type(msg))
    assert back == msg and type(back) is type(msg)
    assert from_proto(to_proto(msg)) == msg
    assert encode_envelope(back) == data  # deterministic bytes


def test_floats_are_bit_exact_and_metric_order_is_kept() -> None:
    c = decode_envelope(encode_envelope(_completions()[0]))
    assert _bits(c.logprobs) == _bits(HARD_FLOATS)  # -0.0 included (== would not see its sign)
    rec = decode_envelope(encode_envelope(MetricRecord("eval", 3, {"b": 2.0, "a": 0.1, "c": -1e-300})))
    assert list(rec.values) == ["b", "a", "c"]


def test_versions_travel_run_length_encoded() -> None:
    p = to_proto(_completions()[0])
    # versions [5, 5, 6, 6, 6, 9] -> runs (5, 2), (6, 3), (9, 1), as messages.rle_encode
    assert [(r.version, r.count) for r in p.versions_rle] == [(5, 2), (6, 3), (9, 1)]
    assert [[r.version, r.count] for r in p.versions_rle] == m.rle_encode([5, 5, 6, 6, 6, 9])
    assert p.finish_reason == pb.FINISH_REASON_INTERRUPTED


def test_hand_worked_bytes_of_a_policy_version() -> None:
    # Envelope: field 1 varint schema_version = 1 -> 08 01; field 6 (policy_version) length-delimited
    # -> tag (6 << 3) | 2 = 0x32, then the 14-byte PolicyVersion: 08 09 (version 9),
    # 12 06 "s3://b" (uri), 1a 02 "ab" (checksum).
    assert SCHEMA_VERSION == 1
    want = b"\x08\x01" + b"\x32\x0e" + b"\x08\x09" + b"\x12\x06s3://b" + b"\x1a\x02ab"
    assert encode_envelope(PolicyVersion(9, "s3://b", "ab")) == want
    assert decode_envelope(want) == PolicyVersion(9, "s3://b", "ab")


def test_protobuf_is_smaller_than_the_json_codec() -> None:
    rng = random.Random(0)
    comps = [Completion([rng.randrange(50_000) for _ in range(500)], [-rng.random() for _ in range(500)],
                        [1] * 250 + [2] * 250, [True] * 500, "length", "x" * 20) for _ in range(4)]
    group = RolloutGroup(_task(), list(range(30)), comps)
    # per token: id varint <= 3 bytes + 8-byte double + 1-byte bool = 12 bytes; 2000 tokens <= 24 kB + framing
    assert len(encode_envelope(group)) < 2000 * 12 + 1000
    assert len(encode_envelope(group)) < len(m.encode(group)) / 2


def test_legacy_json_envelopes_still_decode() -> None:
    for msg in _every_message():
        assert decode_envelope(m.encode(msg)) == msg
    with pytest.raises(MessageError, match="schema version 99"):
        decode_envelope(b'{"schema": 99, "type": "PromptTask", "data": {}}')
    with pytest.raises(MessageError, match="not JSON"):
        decode_envelope(b"{1, 2")


GARBAGE = [b"", b"\x00", b"\xff" * 8, b"hello world", b"[1, 2", b"\x08\x01", b"\x08\x01\x12\x00\x12",
           *(bytes(random.Random(seed).randrange(256) for _ in range(64)) for seed in range(20))]


@pytest.mark.parametrize("data", GARBAGE, ids=range(len(GARBAGE)))
def test_garbage_is_a_message_error(data: bytes) -> None:
    with pytest.raises(MessageError):
        decode_envelope(data)


def test_every_truncation_is_a_message_error() -> None:
    data = encode_envelope(_every_message()[3])  # a ScoredGroup: nested messages at every level
    for cut in range(len(data)):
        with pytest.raises(MessageError):
            decode_envelope(data[:cut])


def test_wrong_type_and_other_schema_versions_are_rejected() -> None:
    with pytest.raises(MessageError, match="expected PromptTask, got PolicyVersion"):
        decode_envelope(encode_envelope(PolicyVersion(1, "u", "c")), expected=PromptTask)
    env = pb.Envelope(schema_version=SCHEMA_VERSION + 1)
    env.prompt_task.CopyFrom(to_proto(_task()))
    with pytest.raises(MessageError, match=f"schema version {SCHEMA_VERSION + 1} != {SCHEMA_VERSION}"):
        decode_envelope(env.SerializeToString())
    with pytest.raises(MessageError, match="holds no message"):
        decode_envelope(pb.Envelope(schema_version=SCHEMA_VERSION).SerializeToString())
    with pytest.raises(MessageError, match="expected bytes"):
        decode_envelope("not bytes")  # type: ignore[arg-type]


def _set_count(c: pb.Completion, count: int) -> None:
    c.versions_rle[0].count = count


def _clear_finish(c: pb.Completion) -> None:
    c.finish_reason = pb.FINISH_REASON_UNSPECIFIED


def _clear_split(t: pb.PromptTask) -> None:
    t.split = pb.SPLIT_UNSPECIFIED


def _zero_group(t: pb.PromptTask) -> None:
    t.group_size = 0


# (envelope field, message to break, how, the reason expected in the error)
BROKEN: list[tuple[str, object, Callable[[Any], None], str]] = [
    ("completion", _completions()[0], _clear_finish, "Completion.finish_reason: enum value 0"),
    ("completion", _completions()[0], lambda c: _set_count(c, 1), "versions_rle covers 5 tokens, token_ids has 6"),
    ("completion", _completions()[0], lambda c: _set_count(c, 2**62), "versions_rle covers"),  # no 2**62 list
    ("completion", _completions()[0], lambda c: _set_count(c, -1), "negative run length"),
    ("completion", _completions()[0], lambda c: c.logprobs.pop(), "differ in length"),
    ("prompt_task", _task(), _clear_split, "PromptTask.split"),
    ("prompt_task", _task(), _zero_group, "group_size must be >= 1"),
    ("rollout_group", _every_message()[2], lambda r: r.ClearField("task"), "RolloutGroup.task: missing"),
    ("scored_group", _every_message()[3], lambda s: s.rewards.pop(), "one reward per completion"),
    ("metric_record", MetricRecord("train", 1, {"a": 1.0}), lambda r: r.values.add(name="a", value=2.0),
     r"repeated names \['a'\]"),
]


@pytest.mark.parametrize(("field", "msg", "breaks", "reason"), BROKEN, ids=[b[3][:30] for b in BROKEN])
def test_invalid_contents_are_rejected_with_the_field(field: str, msg: object, breaks: Callable[[Any], None],
                                                      reason: str) -> None:
    proto = to_proto(msg)
    breaks(proto)
    env = pb.Envelope(schema_version=SCHEMA_VERSION)
    getattr(env, field).CopyFrom(proto)
    with pytest.raises(MessageError, match=reason):
        decode_envelope(env.SerializeToString())


def test_encoding_bad_dataclasses_is_a_message_error() -> None:
    with pytest.raises(MessageError, match="not a scalerl message: dict"):
        encode_envelope({"prompt_id": "x"})
    with pytest.raises(MessageError, match="cannot encode"):
        encode_envelope(Completion([2**31], [0.0], [0], [True], "stop", ""))  # token id past int32
    with pytest.raises(MessageError, match="cannot encode"):
        encode_envelope(PromptTask("p", 0, "q", "a", 1.5, "t"))  # type: ignore[arg-type]
    with pytest.raises(MessageError, match="differ in length"):
        encode_envelope(Completion([1, 2], [0.0], [0, 0], [True, True], "stop", ""))
    with pytest.raises(MessageError, match="finish_reason"):
        encode_envelope(Completion([], [], [], [], "done", ""))  # type: ignore[arg-type]


def test_status_fill_and_dict() -> None:
    msg = fill_status(spb.LearnerStatus(role="learner"), {"step": 7, "staleness_versions": 1.5, "ready": True})
    assert status_dict(msg) == {"role": "learner", "id": "", "ready": True, "policy_version": 0, "step": 7,
                                "groups_consumed": 0, "groups_dropped_stale": 0, "staleness_versions": 1.5,
                                "tokens_trained": 0, "step_seconds": 0.0}
    with pytest.raises(ValueError, match=r"unknown field 'steps' \(allowed: role, id, ready, policy_version, step"):
        fill_status(spb.LearnerStatus(), {"steps": 1})
    with pytest.raises(ValueError, match=r"LearnerStatus\.step: 1\.5 does not fit"):
        fill_status(spb.LearnerStatus(), {"step": 1.5})
