"""Policy weights in the store: safetensors bytes + sha256, published as a `PolicyVersion`.

Write order makes publication atomic: the object is fully written before its version is announced,
and a reader verifies the checksum before swapping the weights in. The key carries the checksum as well
as the version, so a learner that restarts from a checkpoint and publishes a version number again never
overwrites an object a generator may be reading.
"""

from __future__ import annotations

import hashlib
import re

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from scalerl.messages import PolicyVersion
from scalerl.store.base import Store, StoreError

_KEY = re.compile(r"policy/v(\d{8})-[0-9a-f]+\.safetensors$")


def weights_key(version: int, checksum: str) -> str:
    return f"policy/v{version:08d}-{checksum[:16]}.safetensors"


def publish_weights(store: Store, version: int, state_dict: dict[str, torch.Tensor],
                    keep_last: int = 3) -> PolicyVersion:
    """Upload the weights, then return the announcement; older versions beyond `keep_last` go."""
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()}
    data = st_save(tensors)
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


def load_weights(store: Store, pv: PolicyVersion) -> dict[str, torch.Tensor]:
    """Fetch and verify the weights of an announced version."""
    data = store.get_bytes(store.key_of(pv.uri))
    digest = hashlib.sha256(data).hexdigest()
    if digest != pv.checksum:
        raise StoreError(f"checksum mismatch for {pv.uri}: {digest} != {pv.checksum}")
    return st_load(data)
