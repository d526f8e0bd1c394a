"""Policy weights in the store: safetensors bytes + sha256, published as a `PolicyVersion`.

Write order makes publication atomic: the object is fully written before its version is announced,
and a reader verifies the checksum before swapping the weights in. The key carries the checksum as well
as the version, so a learner that restarts from a checkpoint and publishes a version number again never
overwrites an object a generator may be reading.

Tied weights (`lm_head.weight is model.embed_tokens.weight`): safetensors refuses two names for one
storage, so the tensor is stored once under its first name and the other names are listed in the
file's metadata (`scalerl.tied`: {alias: stored name}); `load_weights` gives every alias the very same
tensor back, so both keys are present and equal.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from scalerl.messages import PolicyVersion
from scalerl.store.base import Store, StoreError

_CHECKSUM = re.compile(r"[0-9a-f]{64}")
_KEY = re.compile(r"policy/v(\d{8})-[0-9a-f]+\.safetensors$")

TIED_KEY = "scalerl.tied"


def untie(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors with each shared storage kept once, {alias: kept name}) for tensors that are views of the
    same memory with the same shape (tied weights)."""
    kept: dict[tuple[int, int, tuple[int, ...]], str] = {}
    out: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    for name, t in tensors.items():
        key = (t.untyped_storage().data_ptr(), int(t.storage_offset()), tuple(t.shape))
        if t.numel() and key in kept:
            aliases[name] = kept[key]
        else:
            kept[key] = name
            out[name] = t
    return out, aliases


def tied_aliases(data: bytes) -> dict[str, str]:
    """The {alias: stored name} map of a safetensors blob written by `publish_weights` ({} if none)."""
    (size,) = struct.unpack("<Q", data[:8])
    meta = json.loads(data[8:8 + size]).get("__metadata__") or {}
    return dict(json.loads(meta[TIED_KEY])) if TIED_KEY in meta else {}


def weights_key(version: int, checksum: str) -> str:
    return f"policy/v{version:08d}-{checksum[:16]}.safetensors"


def publish_weights(store: Store, version: int, state_dict: dict[str, torch.Tensor],
                    keep_last: int = 3) -> PolicyVersion:
    """Upload the weights, then return the announcement; older versions beyond `keep_last` go."""
    tensors, aliases = untie({k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()})
    data = st_save(tensors, metadata={TIED_KEY: json.dumps(aliases)} if aliases else None)
    digest = hashlib.sha256(data).hexdigest()
    key = weights_key(version, digest)
    uri = store.put_bytes(key, data)
    if keep_last > 0:  # the newest `keep_last` by version (then name); never the one just written
        for old in [k for k in store.list("policy/") if k != key][:-(keep_last - 1) or None]:
            store.delete(old)
    return PolicyVersion(version=version, uri=uri, checksum=digest)


def highest_version(store: Store) -> int | None:
    """The highest policy version whose weights were ever uploaded (None: none). Weights are uploaded
    before they are announced and the newest are never deleted, so this bounds every announced version."""
    versions = [int(m.group(1)) for key in store.list("policy/") if (m := _KEY.search(key))]
    return max(versions, default=None)


def foreign_weights(store: Store, pv: PolicyVersion) -> str | None:
    """Why `pv` does not name weights this job published (None: it does). `publish_weights` writes the
    version under exactly `weights_key(version, checksum)` in the job's store, so any other URI (another
    bucket or prefix, a path with `..`, another object of the store) is not an announcement of ours."""
    if not _CHECKSUM.fullmatch(pv.checksum):
        return f"checksum: expected 64 lowercase hex digits (sha256), got {pv.checksum[:80]!r}"
    expected = store.uri(weights_key(pv.version, pv.checksum))
    if pv.uri != expected:
        return f"uri: {pv.uri[:200]!r} is not where version {pv.version} with this checksum is published ({expected})"
    return None


class ForeignWeights(StoreError):
    """An announcement that does not name weights this job published (`foreign_weights`)."""


def load_weights(store: Store, pv: PolicyVersion) -> dict[str, torch.Tensor]:
    """Fetch and verify the weights of an announced version (only from where this job publishes them:
    ForeignWeights before anything is fetched)."""
    if (why := foreign_weights(store, pv)) is not None:
        raise ForeignWeights(f"not this job's weights: {why}")
    data = store.get_bytes(store.key_of(pv.uri))
    digest = hashlib.sha256(data).hexdigest()
    if digest != pv.checksum:
        raise StoreError(f"checksum mismatch for {pv.uri}: {digest} != {pv.checksum}")
    tensors = st_load(data)
    for alias, name in tied_aliases(data).items():
        tensors[alias] = tensors[name]
    return tensors
