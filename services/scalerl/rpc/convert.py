"""Dataclass <-> protobuf for the six bus messages, and the `Envelope` codec used as the Kafka wire format.

`encode_envelope(msg)` gives the bytes of a `scalerl.v1.Envelope` (schema version + the message);
`decode_envelope(data, expected)` inverts it and raises `MessageError` (never anything else) on bytes
that do not parse, a schema version other than ours, an empty envelope, a message of another type
than `expected`, or a message that breaks the rules of `scalerl.messages.validate` (lengths of the
per-token lists, finish reason, group size, one reward per completion) or of the protobuf form
(unset enums, missing sub-messages, run lengths that do not cover the tokens, repeated metric names).

Round trips are exact: log-probs, rewards and metric values travel as `double` (Python floats are
doubles), per-token versions run-length encoded (messages.rle_encode), metric keys in their order.

Decision: bytes that start with "{" are read as the legacy JSON envelope of `messages.encode`
(records written before the bus switched to protobuf, e.g. during a rolling upgrade) with its own
schema check. A protobuf `Envelope` never starts with that byte (0x7b would be field 15 as a group).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from google.protobuf.message import Message

from scalerl import messages as m
from scalerl.messages import SCHEMA_VERSION, MessageError
from scalerl.rpc.gen.scalerl.v1 import messages_pb2 as pb

_FINISH_TO_PB = {"stop": pb.FINISH_REASON_STOP, "length": pb.FINISH_REASON_LENGTH,
                 "interrupted": pb.FINISH_REASON_INTERRUPTED}
_FINISH_FROM_PB = {v: k for k, v in _FINISH_TO_PB.items()}
_SPLIT_TO_PB = {"train": pb.SPLIT_TRAIN, "eval": pb.SPLIT_EVAL}
_SPLIT_FROM_PB = {v: k for k, v in _SPLIT_TO_PB.items()}

# Envelope oneof field <-> dataclass.
_ENVELOPE_FIELDS: dict[type, str] = {
    m.PromptTask: "prompt_task", m.Completion: "completion", m.RolloutGroup: "rollout_group",
    m.ScoredGroup: "scored_group", m.PolicyVersion: "policy_version", m.MetricRecord: "metric_record",
}
_ENVELOPE_CLASSES = {v: k for k, v in _ENVELOPE_FIELDS.items()}

P = TypeVar("P", bound=Message)


def _enum(table: Mapping[Any, str], value: int, where: str, enum_name: str) -> str:
    try:
        return table[value]
    except KeyError:
        allowed = ", ".join(pb.DESCRIPTOR.enum_types_by_name[enum_name].values_by_number[k].name
                            for k in sorted(table))
        raise MessageError(f"{where}: enum value {value} is unset or unknown (allowed: {allowed})") from None


# ---- dataclass -> protobuf ---------------------------------------------------------------------------

def _prompt_task_pb(t: m.PromptTask, out: pb.PromptTask) -> None:
    if t.split not in _SPLIT_TO_PB:
        raise MessageError(f"PromptTask.split: {t.split!r} is not train|eval")
    out.prompt_id, out.epoch, out.prompt, out.answer = t.prompt_id, t.epoch, t.prompt, t.answer
    out.group_size, out.task, out.split, out.seq = t.group_size, t.task, _SPLIT_TO_PB[t.split], t.seq


def _completion_pb(c: m.Completion, out: pb.Completion) -> None:
    if c.finish_reason not in _FINISH_TO_PB:
        raise MessageError(f"Completion.finish_reason: {c.finish_reason!r} is not stop|length|interrupted")
    out.token_ids.extend(c.token_ids)
    out.logprobs.extend(c.logprobs)
    out.versions_rle.extend(pb.VersionRun(version=v, count=n) for v, n in m.rle_encode(c.versions))
    out.loss_mask.extend(c.loss_mask)
    out.finish_reason = _FINISH_TO_PB[c.finish_reason]
    out.text, out.thinking_tokens = c.text, c.thinking_tokens


def _rollout_pb(r: m.RolloutGroup, out: pb.RolloutGroup) -> None:
    _prompt_task_pb(r.task, out.task)
    out.prompt_token_ids.extend(r.prompt_token_ids)
    for c in r.completions:
        _completion_pb(c, out.completions.add())
    out.generator_id = r.generator_id


def _scored_pb(s: m.ScoredGroup, out: pb.ScoredGroup) -> None:
    _rollout_pb(s.rollout, out.rollout)
    out.rewards.extend(s.rewards)
    out.correct.extend(s.correct)


def _policy_pb(p: m.PolicyVersion, out: pb.PolicyVersion) -> None:
    out.version, out.uri, out.checksum = p.version, p.uri, p.checksum


def _metric_pb(r: m.MetricRecord, out: pb.MetricRecord) -> None:
    out.kind, out.step, out.source = r.kind, r.step, r.source
    out.values.extend(pb.MetricValue(name=k, value=v) for k, v in r.values.items())


_TO_PB: dict[type, tuple[type[Message], Callable[[Any, Any], None]]] = {
    m.PromptTask: (pb.PromptTask, _prompt_task_pb), m.Completion: (pb.Completion, _completion_pb),
    m.RolloutGroup: (pb.RolloutGroup, _rollout_pb), m.ScoredGroup: (pb.ScoredGroup, _scored_pb),
    m.PolicyVersion: (pb.PolicyVersion, _policy_pb), m.MetricRecord: (pb.MetricRecord, _metric_pb),
}


def _fill(msg: Any, out: Message) -> None:
    """Write dataclass `msg` into the protobuf `out` of its type; MessageError on any bad value."""
    cls = type(msg)
    if cls not in _TO_PB:
        raise MessageError(f"not a scalerl message: {cls.__name__} (allowed: "
                           f"{', '.join(c.__name__ for c in _TO_PB)})")
    m.validate(msg)
    try:
        _TO_PB[cls][1](msg, out)
    except MessageError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:  # wrong Python type, int out of range
        raise MessageError(f"{cls.__name__}: cannot encode: {exc}") from exc


def to_proto(msg: Any) -> Message:
    """The protobuf form (scalerl.v1.<Type>) of a scalerl.messages dataclass (validated first)."""
    cls = type(msg)
    if cls not in _TO_PB:
        raise MessageError(f"not a scalerl message: {cls.__name__}")
    out = _TO_PB[cls][0]()
    _fill(msg, out)
    return out


# ---- protobuf -> dataclass ---------------------------------------------------------------------------

def _prompt_task(p: pb.PromptTask) -> m.PromptTask:
    split = _enum(_SPLIT_FROM_PB, p.split, "PromptTask.split", "Split")
    return m.PromptTask(prompt_id=p.prompt_id, epoch=p.epoch, prompt=p.prompt, answer=p.answer,
                        group_size=p.group_size, task=p.task, split=split, seq=p.seq)  # type: ignore[arg-type]


def _completion(p: pb.Completion) -> m.Completion:
    runs = [[r.version, r.count] for r in p.versions_rle]
    if any(n < 0 for _, n in runs):
        raise MessageError("Completion.versions_rle: negative run length")
    covered = sum(n for _, n in runs)
    if covered != len(p.token_ids):  # checked before expanding: a huge count must not allocate
        raise MessageError(f"Completion.versions_rle covers {covered} tokens, token_ids has {len(p.token_ids)}")
    reason = _enum(_FINISH_FROM_PB, p.finish_reason, "Completion.finish_reason", "FinishReason")
    return m.Completion(token_ids=list(p.token_ids), logprobs=list(p.logprobs), versions=m.rle_decode(runs),
                        loss_mask=list(p.loss_mask), finish_reason=reason,  # type: ignore[arg-type]
                        text=p.text, thinking_tokens=p.thinking_tokens)


def _rollout(p: pb.RolloutGroup) -> m.RolloutGroup:
    if not p.HasField("task"):
        raise MessageError("RolloutGroup.task: missing")
    return m.RolloutGroup(task=_prompt_task(p.task), prompt_token_ids=list(p.prompt_token_ids),
                          completions=[_completion(c) for c in p.completions], generator_id=p.generator_id)


def _scored(p: pb.ScoredGroup) -> m.ScoredGroup:
    if not p.HasField("rollout"):
        raise MessageError("ScoredGroup.rollout: missing")
    return m.ScoredGroup(rollout=_rollout(p.rollout), rewards=list(p.rewards), correct=list(p.correct))


def _policy(p: pb.PolicyVersion) -> m.PolicyVersion:
    return m.PolicyVersion(version=p.version, uri=p.uri, checksum=p.checksum)


def _metric(p: pb.MetricRecord) -> m.MetricRecord:
    values = {v.name: v.value for v in p.values}
    if len(values) != len(p.values):
        names = [v.name for v in p.values]
        raise MessageError(f"MetricRecord.values: repeated names {sorted({n for n in names if names.count(n) > 1})}")
    return m.MetricRecord(kind=p.kind, step=p.step, values=values, source=p.source)


_FROM_PB: dict[str, Callable[[Any], Any]] = {
    "scalerl.v1.PromptTask": _prompt_task, "scalerl.v1.Completion": _completion,
    "scalerl.v1.RolloutGroup": _rollout, "scalerl.v1.ScoredGroup": _scored,
    "scalerl.v1.PolicyVersion": _policy, "scalerl.v1.MetricRecord": _metric,
}


def from_proto(msg: Message) -> Any:
    """The scalerl.messages dataclass of a protobuf message, validated; MessageError if invalid."""
    name = msg.DESCRIPTOR.full_name
    if name not in _FROM_PB:
        raise MessageError(f"not a scalerl message: {name}")
    obj = _FROM_PB[name](msg)
    m.validate(obj)
    return obj


# ---- envelope ----------------------------------------------------------------------------------------

def encode_envelope(msg: Any) -> bytes:
    """`msg` (any of the six message dataclasses) as the bytes of a scalerl.v1.Envelope."""
    field = _ENVELOPE_FIELDS.get(type(msg))
    if field is None:
        raise MessageError(f"not a scalerl message: {type(msg).__name__}")
    env = pb.Envelope(schema_version=SCHEMA_VERSION)
    _fill(msg, getattr(env, field))
    data: bytes = env.SerializeToString()
    return data


def decode_envelope(data: bytes, expected: type | None = None, *, legacy_json: bool = True) -> Any:
    """Inverse of `encode_envelope`; raises MessageError (only) on anything undecodable or invalid."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise MessageError(f"expected bytes, got {type(data).__name__}")
    raw = bytes(data)
    if legacy_json and raw[:1] == b"{":
        return m.decode(raw, expected)
    env = pb.Envelope()
    try:
        env.ParseFromString(raw)
    except Exception as exc:  # DecodeError, and anything else the parser raises on hostile bytes
        raise MessageError(f"not a scalerl.v1.Envelope ({len(raw)} bytes): {exc}") from exc
    if env.schema_version != SCHEMA_VERSION:
        raise MessageError(f"schema version {env.schema_version} != {SCHEMA_VERSION} "
                           "(a message from another producer version; cannot be read safely)")
    field = env.WhichOneof("message")
    if field is None:
        raise MessageError("the envelope holds no message")
    cls = _ENVELOPE_CLASSES[field]
    if expected is not None and cls is not expected:
        raise MessageError(f"expected {expected.__name__}, got {cls.__name__}")
    return from_proto(getattr(env, field))


# ---- status messages ---------------------------------------------------------------------------------

def fill_status(message: P, fields: Mapping[str, Any]) -> P:
    """Set `fields` (name -> value) on a status message; ValueError naming an unknown field or a
    value of the wrong type, with the allowed field names."""
    names = [f.name for f in message.DESCRIPTOR.fields]
    for key, value in fields.items():
        if key not in names:
            raise ValueError(f"{message.DESCRIPTOR.name}: unknown field {key!r} (allowed: {', '.join(names)})")
        try:
            setattr(message, key, value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{message.DESCRIPTOR.name}.{key}: {value!r} does not fit: {exc}") from exc
    return message


def status_dict(message: Message) -> dict[str, Any]:
    """Every field of a status message by name (unset ones at their default)."""
    return {f.name: getattr(message, f.name) for f in message.DESCRIPTOR.fields}
