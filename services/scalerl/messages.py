"""The messages the roles exchange over the bus (the contracts of architecture.md §3).

These dataclasses are the in-process form. On a real transport they travel as bytes through
`encode` / `decode` (a versioned JSON codec for now; the protobuf contracts of the distributed issue
replace the codec, not these shapes). Every message names its schema version so that a consumer can
reject, rather than misread, a message from a newer producer.

Per-token policy versions are stored run-length encoded on the wire (`versions_rle`): they change at
most a few times per sequence (one change per in-flight weight swap), so this keeps a rollout group
small (architecture.md §3, "Message size").
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Literal

SCHEMA_VERSION = 1

FinishReason = Literal["stop", "length", "interrupted"]


class MessageError(ValueError):
    """A message that cannot be decoded or fails validation (it goes to the dead-letter topic)."""


@dataclass(slots=True)
class PromptTask:
    """One prompt to be sampled G times. `answer` is the reference the verifier checks against."""

    prompt_id: str
    epoch: int
    prompt: str
    answer: str
    group_size: int
    task: str
    split: Literal["train", "eval"] = "train"
    seq: int = 0  # the curriculum's issue number, 1, 2, ... (0: not issued by one; scalerl.bus.dedup)

    @property
    def group_id(self) -> str:
        """Identity of its group: prompt id + epoch."""
        return f"{self.prompt_id}@{self.epoch}"


@dataclass(slots=True)
class Completion:
    """One sampled completion with everything the learner needs to form the IS ratio.

    token_ids, logprobs, versions, loss_mask: all length T (completion tokens only, no prompt).
    logprobs: log π_gen(token) recorded at sampling time with the FP32 head (ScaleRL §2.3).
    versions: the policy version whose weights produced each token (changes on in-flight swaps).
    loss_mask: False for tokens the policy did not choose (the injected interruption phrase).
    """

    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    loss_mask: list[bool]
    finish_reason: FinishReason
    text: str
    thinking_tokens: int = 0

    @property
    def min_version(self) -> int:
        return min(self.versions) if self.versions else 0

    @property
    def max_version(self) -> int:
        return max(self.versions) if self.versions else 0


@dataclass(slots=True)
class RolloutGroup:
    """The G completions of one prompt, as produced by a generator."""

    task: PromptTask
    prompt_token_ids: list[int]
    completions: list[Completion]
    generator_id: str = "generator-0"


@dataclass(slots=True)
class ScoredGroup:
    """A rollout group with one reward per completion (ScaleRL: +1 correct, −1 incorrect)."""

    rollout: RolloutGroup
    rewards: list[float]
    correct: list[bool]

    @property
    def group_id(self) -> str:
        """Identity of this group for duplicate detection: prompt id + epoch."""
        return self.rollout.task.group_id


@dataclass(slots=True)
class PolicyVersion:
    """Announcement of new policy weights in the object store."""

    version: int
    uri: str
    checksum: str


@dataclass(slots=True)
class MetricRecord:
    """A metric record (`kind` is "train" or "eval", ...; "environment" from a verifier serving tool calls);
    `values` holds unit-suffixed keys; `source`: the role process that wrote it ("" = the learner)."""

    kind: str
    step: int
    values: dict[str, float] = field(default_factory=dict)
    source: str = ""


STOP_REASON_CODES = {"ForecastPlateau": 1.0, "ForecastBelowTarget": 2.0}
"""Why a run stopped on its forecast (`JobSpec.stop_policy`), and the number a `done` MetricRecord carries
for it as `stop_reason` (records hold numbers only); the operator's RLJob reason is the name."""


def task_of(value: object) -> PromptTask | None:
    """The prompt task of a prompt task, rollout group or scored group (None for anything else: a dead
    letter's value may be any of them, or undecodable bytes)."""
    if isinstance(value, ScoredGroup):
        value = value.rollout
    if isinstance(value, RolloutGroup):
        value = value.task
    return value if isinstance(value, PromptTask) else None


MESSAGE_TYPES: dict[str, type] = {
    cls.__name__: cls
    for cls in (PromptTask, Completion, RolloutGroup, ScoredGroup, PolicyVersion, MetricRecord)
}


def rle_encode(values: list[int]) -> list[list[int]]:
    """[3,3,3,4,4] -> [[3,3],[4,2]] (value, run length)."""
    runs: list[list[int]] = []
    for v in values:
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([v, 1])
    return runs


def rle_decode(runs: list[list[int]]) -> list[int]:
    out: list[int] = []
    for value, count in runs:
        if count < 0:
            raise MessageError(f"negative run length {count} in versions_rle")
        out.extend([int(value)] * int(count))
    return out


def _to_jsonable(obj: Any) -> Any:
    if isinstance(obj, Completion):
        d = {f.name: _to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        d["versions_rle"] = rle_encode(d.pop("versions"))
        return d
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list):
        return [_to_jsonable(v) for v in obj]
    return obj


def encode(msg: Any) -> bytes:
    """Serialise a message to bytes: {"schema": 1, "type": <class>, "data": {...}}."""
    name = type(msg).__name__
    if name not in MESSAGE_TYPES:
        raise MessageError(f"not a scalerl message: {name}")
    return json.dumps({"schema": SCHEMA_VERSION, "type": name, "data": _to_jsonable(msg)},
                      separators=(",", ":")).encode()


def _build(cls: type, data: Any) -> Any:
    if not isinstance(data, dict):
        raise MessageError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
    data = dict(data)
    if cls is Completion and "versions_rle" in data:
        data["versions"] = rle_decode(data.pop("versions_rle"))
    if cls is RolloutGroup:
        data["task"] = _build(PromptTask, data.get("task"))
        data["completions"] = [_build(Completion, c) for c in data.get("completions", [])]
    if cls is ScoredGroup:
        data["rollout"] = _build(RolloutGroup, data.get("rollout"))
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise MessageError(f"{cls.__name__}: unknown fields {sorted(unknown)}")
    try:
        obj = cls(**data)
    except TypeError as exc:
        raise MessageError(f"{cls.__name__}: {exc}") from exc
    _validate(obj)
    return obj


def _validate(obj: Any) -> None:
    if isinstance(obj, Completion):
        n = len(obj.token_ids)
        if not (len(obj.logprobs) == len(obj.versions) == len(obj.loss_mask) == n):
            raise MessageError("Completion: token_ids, logprobs, versions and loss_mask differ in length")
        if obj.finish_reason not in ("stop", "length", "interrupted"):
            raise MessageError(f"Completion: finish_reason {obj.finish_reason!r} not stop|length|interrupted")
    if isinstance(obj, ScoredGroup) and len(obj.rewards) != len(obj.rollout.completions):
        raise MessageError("ScoredGroup: one reward per completion is required")
    if isinstance(obj, PromptTask) and obj.group_size < 1:
        raise MessageError("PromptTask: group_size must be >= 1")


def validate(msg: Any) -> None:
    """Apply `decode`'s validation rules to a message and the messages inside it (for other codecs,
    e.g. scalerl.rpc.convert's protobuf one); raises MessageError."""
    if isinstance(msg, ScoredGroup):
        validate(msg.rollout)
    if isinstance(msg, RolloutGroup):
        validate(msg.task)
        for c in msg.completions:
            validate(c)
    _validate(msg)


def decode(data: bytes, expected: type | None = None) -> Any:
    """Inverse of `encode`; raises MessageError (never anything else) on bad input."""
    try:
        envelope = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MessageError(f"not JSON: {exc}") from exc
    if not isinstance(envelope, dict):
        raise MessageError("envelope must be an object")
    if "schema" not in envelope or "type" not in envelope:
        raise MessageError(f"JSON object without the envelope fields 'schema' and 'type' (has "
                           f"{sorted(map(str, envelope))[:8]}): not a scalerl message")
    if envelope.get("schema") != SCHEMA_VERSION:
        raise MessageError(f"schema version {envelope.get('schema')!r} != {SCHEMA_VERSION}")
    cls = MESSAGE_TYPES.get(str(envelope.get("type")))
    if cls is None:
        raise MessageError(f"unknown message type {envelope.get('type')!r}")
    if expected is not None and cls is not expected:
        raise MessageError(f"expected {expected.__name__}, got {cls.__name__}")
    return _build(cls, envelope.get("data"))
