"""Weight sync through a store folder: snapshots and deltas, chains, lost and corrupt shards, retention.

The reference for every version is computed here, independently of the codec: the fp32 master weights
of a simulated learner cast to the published dtype; what a reader builds must equal it bit for bit."""

from __future__ import annotations

import json

import pytest
import torch

from scalerl.messages import PolicyVersion
from scalerl.store.local import LocalStore
from scalerl.weightsync.codec import bits_of, decode_into, encode
from scalerl.weightsync.manifest import REQUESTS, ManifestError, parse_key, parse_manifest
from scalerl.weightsync.publisher import WeightPublisher, publish_weights
from scalerl.weightsync.reader import ForeignWeights, WeightReader, WeightsUnavailable, highest_version, load_weights

LR = 1e-5  # the example's learning rate (examples/smollm2-addition.yaml)


class FakeLearner:
    """fp32 master weights moved by Adam-sized steps (about LR per value), an int buffer, a tied head."""

    def __init__(self, seed: int = 0, rows: int = 300, dim: int = 64) -> None:
        g = torch.Generator().manual_seed(seed)
        self.g = g
        emb = torch.randn(rows, dim, generator=g) * 0.05
        self.params = {"embed.weight": emb, "layer.weight": torch.randn(dim, dim, generator=g) * 0.05,
                       "layer.bias": torch.zeros(dim), "norm.weight": torch.ones(dim)}
        self.params["head.weight"] = emb  # tied
        self.buffer = torch.arange(7, dtype=torch.int64)

    def step(self) -> None:
        for name, p in self.params.items():
            if name != "head.weight":
                p += LR * torch.sign(torch.randn(p.shape, generator=self.g)) * torch.rand(p.shape, generator=self.g)

    def state(self) -> dict[str, torch.Tensor]:
        return {**self.params, "pos": self.buffer}

    def expected(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        return {k: v.to(dtype) if v.is_floating_point() else v.clone() for k, v in self.state().items()}


def assert_bits_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        assert got[k].dtype == w.dtype and got[k].shape == w.shape, k
        assert torch.equal(bits_of(got[k].contiguous()), bits_of(w.contiguous())), k


def run(tmp_path, versions: int, dtype=torch.bfloat16, **kw) -> tuple[LocalStore, WeightPublisher,
                                                                       list[PolicyVersion], list[dict]]:
    store = LocalStore(tmp_path / "store")
    pub = WeightPublisher(store, dtype, shard_bytes=kw.pop("shard_bytes", 8192), **kw)
    learner = FakeLearner()
    pvs, expected = [], []
    for v in range(1, versions + 1):
        if v > 1:
            learner.step()
        pvs.append(pub.publish(v, learner.state()))
        expected.append(learner.expected(dtype))
    return store, pub, pvs, expected


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_codec_round_trips_every_encoding(dtype) -> None:
    g = torch.Generator().manual_seed(1)
    old = (torch.randn(10_001, generator=g) * 0.05).to(dtype)
    new = old.clone()
    new[::97] = (new[::97].float() * 1.01).to(dtype)
    for before, after, encoding in [(None, new, "raw"), (old, new, "xor"), (old, old.clone(), "same")]:
        enc = encode(bits_of(after), None if before is None else bits_of(before))
        assert enc.encoding == encoding
        out = (before if before is not None else torch.zeros_like(after)).clone()
        decode_into(bits_of(out), enc.encoding, enc.data, enc.changed, "chunk")
        assert torch.equal(bits_of(out), bits_of(after))


def test_every_version_builds_bit_identical_through_snapshots_and_deltas(tmp_path) -> None:
    store, _, pvs, expected = run(tmp_path, 12, snapshot_every=5, keep_last=12)
    kinds = [parse_key(store.key_of(pv.uri)).kind for pv in pvs]  # type: ignore[union-attr]
    assert kinds == ["snapshot"] + ["delta"] * 4 + ["snapshot"] + ["delta"] * 4 + ["snapshot", "delta"]
    follower = WeightReader(store)
    for pv, want in zip(pvs, expected, strict=True):
        got = follower.fetch(pv)
        assert_bits_equal(got, want)
        assert got["head.weight"] is got["embed.weight"]  # tied: sent once, one tensor
        applied = follower.stats.applied
        assert applied == 1  # a follower applies one version per announcement
    late = WeightReader(store)  # a generator that joins at version 7: snapshot 6 + delta 7
    assert_bits_equal(late.fetch(pvs[6]), expected[6])
    assert (late.stats.applied, late.stats.snapshots) == (2, 1)
    assert_bits_equal(late.fetch(pvs[11]), expected[11])  # then on to 12: snapshot 11 + delta 12 (no base walk past it)
    assert (late.stats.applied, late.stats.snapshots) == (2, 1)
    assert highest_version(store) == 12


def test_bf16_deltas_are_small_at_the_example_learning_rate(tmp_path) -> None:
    _, pub, _, _ = run(tmp_path, 2, snapshot_every=10, shard_bytes=1 << 20)
    assert pub.last is not None and pub.last.kind == "delta"
    changed = sum(c.changed for c in pub.last.chunks) / sum(t.numel for t in pub.last.tensors)
    ratio = pub.last.stored_bytes / sum(t.numel * 2 for t in pub.last.tensors if t.dtype == "bfloat16")
    assert 0.001 < changed < 0.15  # most bf16 values do not move at this learning rate
    assert ratio < 0.15


def test_a_lost_delta_shard_asks_for_a_snapshot_and_the_next_version_builds(tmp_path) -> None:
    store, pub, pvs, expected = run(tmp_path, 3, snapshot_every=10, keep_last=10)
    reader = WeightReader(store, reader_id="gen-a")
    assert_bits_equal(reader.fetch(pvs[1]), expected[1])
    lost = next(k for k in store.list(store.key_of(pvs[2].uri).rsplit("/", 1)[0]) if "shard-" in k)
    store.delete(lost)
    with pytest.raises(WeightsUnavailable, match="no object"):
        reader.fetch(pvs[2])
    assert reader.held is None
    assert store.list(REQUESTS) == [f"{REQUESTS}gen-a"]
    learner = FakeLearner()
    for _ in range(3):
        learner.step()
    pv4 = pub.publish(4, learner.state())
    assert pub.last is not None and pub.last.kind == "snapshot"
    assert store.list(REQUESTS) == []  # the request is answered
    assert_bits_equal(reader.fetch(pv4), learner.expected(torch.bfloat16))


def test_a_corrupt_shard_is_refused_by_name_and_the_held_copy_is_not_trusted(tmp_path) -> None:
    store, _, pvs, expected = run(tmp_path, 2, snapshot_every=10)
    reader = WeightReader(store)
    reader.fetch(pvs[0])
    shard = next(k for k in store.list(store.key_of(pvs[1].uri).rsplit("/", 1)[0]) if "shard-" in k)
    data = bytearray(store.get_bytes(shard))
    data[len(data) // 2] ^= 0xFF
    store.put_bytes(shard, bytes(data))
    with pytest.raises(WeightsUnavailable, match=f"shard {shard} is corrupt"):
        reader.fetch(pvs[1])
    with pytest.raises(WeightsUnavailable):
        load_weights(store, pvs[1])  # a fresh reader walks back to the snapshot and meets the same shard
    assert_bits_equal(load_weights(store, pvs[0]), expected[0])


def test_a_tampered_manifest_or_a_foreign_announcement_is_refused(tmp_path) -> None:
    store, _, pvs, _ = run(tmp_path, 1)
    key = store.key_of(pvs[0].uri)
    raw = json.loads(store.get_bytes(key))
    first = raw["chunks"][0]["blake3"]
    raw["chunks"][0]["blake3"] = ("1" if first[0] == "0" else "0") + first[1:]  # one chunk's bits, another hash
    with pytest.raises(ManifestError, match="digest"):
        parse_manifest(json.dumps(raw).encode(), key)
    raw["chunks"][0]["blake3"] = first.upper()
    with pytest.raises(ManifestError, match=r"blake3 .* 64 lowercase hex digits"):
        parse_manifest(json.dumps(raw).encode(), key)
    raw["chunks"][0]["blake3"], raw["shards"][0]["bytes"] = first, raw["shards"][0]["bytes"] + 1
    with pytest.raises(ManifestError, match=r"shard 0 holds \d+ bytes, its chunks"):  # a byte no chunk checks
        parse_manifest(json.dumps(raw).encode(), key)
    raw["shards"][0]["bytes"] -= 1
    parse_manifest(json.dumps(raw).encode(), key)
    raw["format"] = 1  # a manifest of the SHA-256/CRC-32 format
    with pytest.raises(ManifestError, match=r"format 1 \(this reader knows 2\)"):
        parse_manifest(json.dumps(raw).encode(), key)
    with pytest.raises(ManifestError, match="not JSON"):
        parse_manifest(b"{", key)
    elsewhere = PolicyVersion(1, pvs[0].uri.replace("/policy/", "/other/"), pvs[0].checksum)
    with pytest.raises(ForeignWeights, match="uri"):
        load_weights(store, elsewhere)
    with pytest.raises(ForeignWeights, match="checksum"):
        load_weights(store, PolicyVersion(1, pvs[0].uri, "x" * 64))


def test_retention_keeps_what_rebuilds_the_last_versions(tmp_path) -> None:
    store, _, pvs, expected = run(tmp_path, 12, snapshot_every=4, keep_last=3)
    versions = sorted({v.version for k in store.list("policy/") if (v := parse_key(k))})
    assert versions == [9, 10, 11, 12]  # snapshot 9 rebuilds 10..12
    for pv, want in zip(pvs[-3:], expected[-3:], strict=True):
        assert_bits_equal(load_weights(store, pv), want)
    with pytest.raises(WeightsUnavailable):
        load_weights(store, pvs[7])


def test_publish_weights_keeps_each_tensor_dtype_and_can_be_read_back(tmp_path) -> None:
    store = LocalStore(tmp_path)
    sd = {"w": torch.randn(5, 3), "h": torch.randn(4).to(torch.bfloat16), "n": torch.tensor([1, 2])}
    pv = publish_weights(store, 3, sd)
    assert_bits_equal(load_weights(store, pv), sd)


class FlakyStore(LocalStore):
    """A store whose next `fail_puts` shard uploads fail and whose deletes always fail."""

    fail_puts = 0

    def put_bytes(self, key, data, *, checksum=None):  # type: ignore[no-untyped-def]
        if "shard-" in key and self.fail_puts:
            self.fail_puts -= 1
            raise OSError("connection reset")
        return super().put_bytes(key, data, checksum=checksum)

    def delete(self, key: str) -> None:
        raise OSError("delete refused")


def test_a_failed_publish_can_be_retried_and_a_failed_clean_up_does_not_fail_it(tmp_path) -> None:
    store = FlakyStore(tmp_path)
    pub = WeightPublisher(store, torch.bfloat16, shard_bytes=4096, keep_last=1, snapshot_every=2)
    learner = FakeLearner()
    reader = WeightReader(store)
    for v in range(1, 6):  # from snapshot 3 on, retention deletes: the deletes fail, the versions still publish
        learner.step()
        store.fail_puts = 1 if v == 3 else 0
        if v == 3:
            with pytest.raises(OSError, match="connection reset"):
                pub.publish(v, learner.state())
        pv = pub.publish(v, learner.state())  # the retry: the publisher is as it was before the failed call
        assert_bits_equal(reader.fetch(pv), learner.expected(torch.bfloat16))
        assert pub.last is not None and pub.last.kind == ("snapshot" if v % 2 else "delta")


def test_a_chunk_that_does_not_check_leaves_the_copy_as_it_was(tmp_path) -> None:
    """What lets a reader download a pushed shard that came wrong after applying part of it: a raw chunk is
    checked before it is copied, an XOR delta that decodes to other bits is undone."""
    from scalerl.weightsync.codec import bits_digest
    from scalerl.weightsync.manifest import ChunkEntry, Manifest, TensorEntry
    from scalerl.weightsync.reader import _chunk

    g = torch.Generator().manual_seed(0)
    base = torch.randn(4096, generator=g).to(torch.bfloat16)
    new, other = base.clone(), base.clone()
    new[::7] += 1
    other[::5] -= 1
    old, want, wrong = (bits_of(t) for t in (base, new, other))
    tensors = [TensorEntry("w", "bfloat16", [4096])]
    encodings = (encode(want, old), encode(want, None))
    assert [e.encoding for e in encodings] == ["xor", "raw"]
    for enc in encodings:
        bad = encode(wrong, old) if enc.encoding == "xor" else encode(wrong, None)
        c = ChunkEntry(0, 0, 4096, enc.encoding, 0, 0, len(bad.data), bad.changed, bits_digest(want))
        m = Manifest(1, "delta", tensors, chunks=[c])
        copy = old.clone()
        why = _chunk(m, "v1", [copy], 0, memoryview(bytes(bad.data)))
        assert why is not None and "BLAKE3" in why
        assert torch.equal(copy, old)  # as it was
        c.length, c.changed = len(enc.data), enc.changed
        assert _chunk(m, "v1", [copy], 0, memoryview(bytes(enc.data))) is None
        assert torch.equal(copy, want)


def test_the_publisher_cuts_each_version_into_the_memory_of_the_last(tmp_path) -> None:
    """Fresh memory costs a page fault per 4 KiB: a version's shards are cut into the last one's buffers, and
    the publisher keeps as much as the last version took (a delta's few bytes after a delta)."""
    learner = FakeLearner()
    pub = WeightPublisher(LocalStore(tmp_path), torch.bfloat16, shard_bytes=8192, snapshot_every=3)
    pub.publish(1, learner.state())
    first = {id(b) for b in pub._memory._free}
    assert sum(len(b) for b in pub._memory._free) == pub.last.stored_bytes  # type: ignore[union-attr]
    learner.step()
    pub.publish(2, learner.state())  # a delta: smaller, cut into memory of the snapshot's
    assert pub.last is not None and pub.last.kind == "delta"
    assert {id(b) for b in pub._memory._free} <= first
    assert sum(len(b) for b in pub._memory._free) <= 8192 * len(pub.last.shards)
