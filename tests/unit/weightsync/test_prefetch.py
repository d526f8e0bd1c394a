"""The background build of the next version: never blocks the caller, never changes the copy being loaded."""

from __future__ import annotations

import threading
import time

import torch

from scalerl.store.local import LocalStore
from scalerl.weightsync.codec import bits_of
from scalerl.weightsync.manifest import parse_manifest
from scalerl.weightsync.prefetch import Prefetcher
from scalerl.weightsync.publisher import WeightPublisher
from scalerl.weightsync.reader import WeightReader


class GatedStore(LocalStore):
    """A store whose shard downloads wait for `gate` (a slow network, made deterministic)."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.gate = threading.Event()
        self.gate.set()

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        if "shard-" in key:
            assert self.gate.wait(30)
        super().read_into(key, offset, out)


def versions(store, n: int) -> tuple[list, list[dict[str, torch.Tensor]]]:
    pub = WeightPublisher(store, torch.bfloat16, shard_bytes=4096)
    g = torch.Generator().manual_seed(0)
    w = {"a": torch.randn(64, 64, generator=g), "b": torch.randn(300, generator=g)}
    pvs, refs = [], []
    for v in range(1, n + 1):
        w = {k: t + 0.01 * torch.randn(t.shape, generator=g) for k, t in w.items()}
        pvs.append(pub.publish(v, w))
        refs.append({k: t.to(torch.bfloat16) for k, t in w.items()})
    return pvs, refs


def _manifest(store, pv):
    key = store.key_of(pv.uri)
    return parse_manifest(store.get_bytes(key), key)


def equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(bits_of(got[k]), bits_of(want[k])) for k in want)


def test_the_caller_never_waits_and_the_lent_copy_never_changes(tmp_path) -> None:
    store = GatedStore(tmp_path)
    pvs, refs = versions(store, 3)
    pre = Prefetcher(WeightReader(store))
    try:
        store.gate.clear()  # downloads hang: the build is under way
        pre.offer(pvs[0])
        t0 = time.monotonic()
        assert pre.take() is None  # not built yet: the engine keeps generating
        assert time.monotonic() - t0 < 1.0
        store.gate.set()
        got = pre.take(wait_s=30)
        assert got is not None and got[0] == pvs[0] and equal(got[1], refs[0])
        pre.offer(pvs[1])  # offered while the caller still loads version 1 from the copy ...
        time.sleep(0.3)
        assert equal(got[1], refs[0])  # ... so the copy is left alone
        assert pre.take() is None
        pre.loaded()
        got = pre.take(wait_s=30)
        assert got is not None and got[0] == pvs[1] and equal(got[1], refs[1])
        pre.loaded()
        pre.offer(pvs[2])
        got = pre.take(wait_s=30)
        assert got is not None and got[0] == pvs[2] and equal(got[1], refs[2])
        assert pre.reader.unbuildable == 0 and pre.reader.last_seconds > 0
        # a snapshot and two deltas
        assert pre.reader.bytes_total == sum(s.bytes for pv in pvs for s in _manifest(store, pv).shards)
    finally:
        pre.close()


def test_a_version_that_cannot_be_built_is_dropped_and_the_next_one_builds(tmp_path) -> None:
    store = GatedStore(tmp_path)
    pvs, _ = versions(store, 2)
    for key in store.list(store.key_of(pvs[0].uri).rsplit("/", 1)[0]):
        if "shard-" in key:
            store.delete(key)
    pre = Prefetcher(WeightReader(store))
    try:
        pre.offer(pvs[0])
        assert pre.take(wait_s=30) is None and pre.reader.unbuildable == 1
        pre.offer(pvs[1])  # a delta on the lost snapshot: also unbuildable until a new snapshot comes
        assert pre.take(wait_s=30) is None and pre.reader.unbuildable == 2
        assert store.list("policy/requests/")
        w = {"a": torch.ones(64, 64), "b": torch.zeros(300)}
        pv3 = WeightPublisher(store, torch.bfloat16, shard_bytes=4096).publish(3, w)  # the snapshot asked for
        pre.offer(pv3)
        got = pre.take(wait_s=30)
        assert got is not None and got[0] == pv3 and equal(got[1], {k: t.to(torch.bfloat16) for k, t in w.items()})
    finally:
        pre.close()
