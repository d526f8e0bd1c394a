"""The job spec's `runtime.weight_sync` -> the learner's publisher and a generator's reader."""

from __future__ import annotations

import torch

from scalerl.config import JobSpec
from scalerl.store.base import Store
from scalerl.weightsync.broadcast import BroadcastHub, BroadcastReceiver, BroadcastSettings
from scalerl.weightsync.publisher import WeightPublisher
from scalerl.weightsync.reader import WeightReader

UPLOAD_WAIT_TIMEOUTS = 4
"""With broadcast on, a reader waits this many broadcast timeouts for an announced version's upload."""
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def make_publisher(spec: JobSpec, store: Store) -> WeightPublisher:
    ws = spec.runtime.weight_sync
    return WeightPublisher(store, _DTYPES.get(ws.dtype), delta=ws.delta, snapshot_every=ws.snapshot_every,
                           shard_bytes=ws.shard_mb * 1024**2, parallel=ws.parallel, keep_last=ws.keep_last)


def make_reader(spec: JobSpec, store: Store, reader_id: str | None = None) -> WeightReader:
    """A generator's reader. With broadcast on, the learner announces a version before its upload ends: a
    reader outside the group waits for its upload (UPLOAD_WAIT_TIMEOUTS)."""
    ws = spec.runtime.weight_sync
    wait = UPLOAD_WAIT_TIMEOUTS * ws.broadcast.timeout_s if ws.broadcast.enabled else 0.0
    return WeightReader(store, parallel=ws.parallel, reader_id=reader_id, manifest_wait_s=wait)


def broadcast_settings(spec: JobSpec) -> BroadcastSettings | None:
    b = spec.runtime.weight_sync.broadcast
    return BroadcastSettings(b.address, b.port, b.generators, b.timeout_s, b.backend) if b.enabled else None


def make_hub(spec: JobSpec) -> BroadcastHub | None:
    """The learner's broadcast hub (None: broadcast is off)."""
    settings = broadcast_settings(spec)
    return BroadcastHub(settings) if settings is not None else None


def make_receiver(spec: JobSpec, member_id: str, reader: WeightReader) -> BroadcastReceiver | None:
    """A generator's broadcast receiver delivering into `reader`'s inbox (None: broadcast is off)."""
    settings = broadcast_settings(spec)
    if settings is None:
        return None
    return BroadcastReceiver(settings, member_id, reader.offer_shards, reader.push_ended, reader.inbox.buffer)
