"""Policy weights in the store: safetensors bytes + sha256, published as a `PolicyVersion`.

Write order makes publication atomic: the object is fully written before its version is announced,
and a reader verifies the checksum before swapping the weights in.
"""

from __future__ import annotations

import hashlib

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from scalerl.messages import PolicyVersion
from scalerl.store.base import Store, StoreError


def weights_key(version: int) -> str:
    return f"policy/v{version:08d}.safetensors"


def publish_weights(store: Store, version: int, state_dict: dict[str, torch.Tensor],
                    keep_last: int = 3) -> PolicyVersion:
    """Upload the weights, then return the announcement; older versions beyond `keep_last` go."""
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()}
    data = st_save(tensors)
    uri = store.put_bytes(weights_key(version), data)
    for old in store.list("policy/")[:-keep_last] if keep_last > 0 else []:
        store.delete(old)
    return PolicyVersion(version=version, uri=uri, checksum=hashlib.sha256(data).hexdigest())


def load_weights(store: Store, pv: PolicyVersion) -> dict[str, torch.Tensor]:
    """Fetch and verify the weights of an announced version."""
    data = store.get_bytes(store.key_of(pv.uri))
    digest = hashlib.sha256(data).hexdigest()
    if digest != pv.checksum:
        raise StoreError(f"checksum mismatch for {pv.uri}: {digest} != {pv.checksum}")
    return st_load(data)
