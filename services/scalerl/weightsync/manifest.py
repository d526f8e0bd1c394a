"""The manifest of one published policy version, and where its objects live in the store.

A version is a folder ``policy/v<version:08d>-<digest[:16]>-<s|d>/`` (s: snapshot, d: delta) holding
``manifest.json`` and shards ``shard-0000`` ... . The manifest lists:

- `tensors`: name, dtype and shape of every stored tensor;
  `aliases` maps a tied name to the stored one (the tied embedding/head is stored once);
- `shards`: key and size of each shard as stored;
- `chunks`: which element range of which tensor sits where in which shard, how it is encoded
  (`weightsync.codec`) and the BLAKE3 (`codec.digest`) of its bits in this version. The chunks cover every
  tensor and their bytes tile every shard, so checking each chunk checks every stored byte and every bit
  of the version: a raw chunk's bytes before they are copied, any other after decoding;
- `base`: for a delta, the version it applies to (its key and digest).

`digest` is the SHA-256 of the canonical JSON of the tensors, the aliases and each chunk's range and
BLAKE3: it names the *state*, not its encoding (a snapshot and a delta of the same weights cut the same
way have the same digest), and it is the checksum a `PolicyVersion` announces. The manifest is written
last, so a version whose manifest exists is complete; a snapshot's is complete before its first shard is
cut (raw chunks' sizes are known), so the broadcast path sends it first. Format 2 (a chunk's BLAKE3) replaced
format 1 (a shard's SHA-256 and a chunk's CRC-32); a reader refuses a format it does not know (it asks for
a snapshot, which comes in the learner's format).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from scalerl.weightsync.codec import BIT_VIEWS, ENCODINGS

FORMAT = 2
PREFIX = "policy/"
REQUESTS = "policy/requests/"
PENDING = "policy/pending/"
"""Markers of versions announced before their upload ended (the broadcast path): the number is taken."""
KINDS = {"snapshot": "s", "delta": "d"}
_PENDING = re.compile(r"^policy/pending/v(\d{8})$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_FOLDER = re.compile(r"^policy/v(\d{8})-([0-9a-f]{16})-([sd])/manifest\.json$")
_IN_FOLDER = re.compile(r"^policy/v(\d{8})-[0-9a-f]{16}-[sd]/")
DTYPES: dict[str, torch.dtype] = {str(d).removeprefix("torch."): d for d in BIT_VIEWS}


class ManifestError(ValueError):
    """A manifest that cannot be read (names the key and the field)."""


def manifest_key(version: int, digest: str, kind: str) -> str:
    return f"{PREFIX}v{version:08d}-{digest[:16]}-{KINDS[kind]}/manifest.json"


def pending_key(version: int) -> str:
    return f"{PENDING}v{version:08d}"


def parse_pending(key: str) -> int | None:
    """The version a pending marker names (None: not a marker key)."""
    m = _PENDING.match(key)
    return int(m.group(1)) if m else None


def version_of(key: str) -> int | None:
    """The version whose folder holds `key` (a manifest or a shard; None: not in a version's folder)."""
    m = _IN_FOLDER.match(key)
    return int(m.group(1)) if m else None


def shard_key(manifest: str, index: int) -> str:
    return f"{manifest.rsplit('/', 1)[0]}/shard-{index:04d}"


@dataclass(frozen=True, slots=True)
class Listed:
    """A version found by listing the store (no manifest read): version, digest prefix, kind, key."""

    version: int
    digest16: str
    kind: str
    key: str

    @property
    def folder(self) -> str:
        return self.key.rsplit("/", 1)[0] + "/"


def parse_key(key: str) -> Listed | None:
    """The version a manifest key names (None: not a manifest key)."""
    m = _FOLDER.match(key)
    if m is None:
        return None
    kind = "snapshot" if m.group(3) == "s" else "delta"
    return Listed(int(m.group(1)), m.group(2), kind, key)


@dataclass(slots=True)
class TensorEntry:
    name: str
    dtype: str  # a key of DTYPES
    shape: list[int]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclass(slots=True)
class ShardEntry:
    key: str
    bytes: int


@dataclass(slots=True)
class ChunkEntry:
    tensor: int  # index into `tensors`
    start: int  # first element
    count: int  # elements
    encoding: str
    shard: int  # index into `shards`
    offset: int  # bytes into the shard
    length: int  # bytes
    changed: int  # elements that differ from the base (count for a snapshot's raw chunks)
    blake3: str  # of the range's bits in this version (hex)


@dataclass(slots=True)
class Manifest:
    version: int
    kind: str
    tensors: list[TensorEntry]
    aliases: dict[str, str] = field(default_factory=dict)
    shards: list[ShardEntry] = field(default_factory=list)
    chunks: list[ChunkEntry] = field(default_factory=list)
    base: str | None = None  # the base version's manifest key (deltas)
    base_digest: str | None = None

    @property
    def digest(self) -> str:
        return state_digest(self.tensors, self.aliases, self.chunks)

    @property
    def key(self) -> str:
        return manifest_key(self.version, self.digest, self.kind)

    @property
    def stored_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def to_json(self) -> bytes:
        body = {"format": FORMAT, "digest": self.digest, **asdict(self)}
        return json.dumps(body, separators=(",", ":")).encode()


def state_digest(tensors: list[TensorEntry], aliases: dict[str, str], chunks: list[ChunkEntry]) -> str:
    ranges = sorted((c.tensor, c.start, c.count, c.blake3) for c in chunks)
    canon = json.dumps([[[t.name, t.dtype, t.shape] for t in tensors], sorted(aliases.items()), ranges],
                       separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()


def _need(obj: Any, name: str, kind: type | tuple[type, ...], key: str) -> Any:
    if not isinstance(obj, dict) or name not in obj:
        raise ManifestError(f"{key}: missing field {name!r}")
    value = obj[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise ManifestError(f"{key}: field {name!r} has type {type(value).__name__}")
    return value


def parse_manifest(data: bytes, key: str) -> Manifest:
    """Read and check a manifest (ManifestError naming `key` and the field when it is not one of ours)."""
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{key}: not JSON ({exc})") from None
    if _need(raw, "format", int, key) != FORMAT:
        raise ManifestError(f"{key}: format {raw['format']} (this reader knows {FORMAT})")
    kind = _need(raw, "kind", str, key)
    if kind not in KINDS:
        raise ManifestError(f"{key}: kind {kind!r} (expected one of {sorted(KINDS)})")
    try:
        tensors = [TensorEntry(str(t["name"]), str(t["dtype"]), [int(s) for s in t["shape"]])
                   for t in _need(raw, "tensors", list, key)]
        shards = [ShardEntry(str(s["key"]), int(s["bytes"])) for s in _need(raw, "shards", list, key)]
        chunks = [ChunkEntry(int(c["tensor"]), int(c["start"]), int(c["count"]), str(c["encoding"]),
                             int(c["shard"]), int(c["offset"]), int(c["length"]), int(c["changed"]),
                             str(c["blake3"]))
                  for c in _need(raw, "chunks", list, key)]
        aliases = {str(a): str(n) for a, n in _need(raw, "aliases", dict, key).items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise ManifestError(f"{key}: malformed tensors/shards/chunks ({exc!r})") from None
    if (odd := next((t for t in tensors if t.dtype not in DTYPES), None)) is not None:
        raise ManifestError(f"{key}: tensor {odd.name!r} has dtype {odd.dtype!r} (expected one of {sorted(DTYPES)})")
    if (bad := next((c.blake3 for c in chunks if not _HEX64.match(c.blake3)), None)) is not None:
        raise ManifestError(f"{key}: blake3 {bad[:80]!r} (expected 64 lowercase hex digits)")
    m = Manifest(_need(raw, "version", int, key), kind, tensors, aliases, shards, chunks,
                 raw.get("base"), raw.get("base_digest"))
    if kind == "delta" and not (isinstance(m.base, str) and isinstance(m.base_digest, str)):
        raise ManifestError(f"{key}: a delta without its base")
    if (digest := m.digest) != raw.get("digest") or manifest_key(m.version, digest, m.kind) != key:
        raise ManifestError(f"{key}: its tensors hash to {digest[:16]}, not the digest it names")
    _check_layout(m, key)
    return m


def _check_layout(m: Manifest, key: str) -> None:
    """Every chunk in range, the chunks covering each tensor and tiling each shard exactly (ManifestError)."""
    tensors, shards, chunks = m.tensors, m.shards, m.chunks
    for i, c in enumerate(chunks):
        placed = (c.length == 0 if c.encoding == "same" else 0 <= c.shard < len(shards) and c.offset >= 0
                  and c.length >= 0 and c.offset + c.length <= shards[c.shard].bytes)
        if (c.encoding not in ENCODINGS or not 0 <= c.tensor < len(tensors) or not placed
                or c.start < 0 or c.count <= 0 or c.start + c.count > tensors[c.tensor].numel):
            raise ManifestError(f"{key}: chunk {i} is out of range")
    covered = [0] * len(tensors)
    for c in sorted(chunks, key=lambda c: (c.tensor, c.start)):
        if c.start != covered[c.tensor]:
            raise ManifestError(f"{key}: tensor {tensors[c.tensor].name!r}: a gap or overlap at element {c.start}")
        covered[c.tensor] += c.count
    if (short := next((t.name for t, n in zip(tensors, covered, strict=True) if n != t.numel), None)) is not None:
        raise ManifestError(f"{key}: the chunks do not cover tensor {short!r}")
    filled = [0] * len(shards)  # every stored byte is a chunk's, so the chunks' checks check the shards
    for c in sorted((c for c in chunks if c.encoding != "same"), key=lambda c: (c.shard, c.offset)):
        if c.offset != filled[c.shard]:
            raise ManifestError(f"{key}: shard {c.shard}: a gap or overlap at byte {c.offset}")
        filled[c.shard] += c.length
    if (loose := next((i for i, s in enumerate(shards) if filled[i] != s.bytes), None)) is not None:
        raise ManifestError(f"{key}: shard {loose} holds {shards[loose].bytes} bytes, its chunks {filled[loose]}")
