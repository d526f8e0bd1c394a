"""Contracts round-trip; the in-memory bus has Kafka's offset semantics; the local store is atomic."""

from __future__ import annotations

import pytest
import torch

from scalerl.bus.memory import MemoryBus
from scalerl.messages import (
    Completion,
    MessageError,
    PolicyVersion,
    PromptTask,
    RolloutGroup,
    ScoredGroup,
    decode,
    encode,
    rle_decode,
    rle_encode,
)
from scalerl.store.base import StoreError
from scalerl.store.local import LocalStore
from scalerl.weightsync.manifest import parse_key
from scalerl.weightsync.publisher import publish_weights
from scalerl.weightsync.reader import load_weights


def _scored() -> ScoredGroup:
    task = PromptTask("p1", 0, "1+2=", "3", 2, "addition")
    c1 = Completion([4, 9, 2], [-0.1, -0.2, -0.3], [0, 0, 1], [True, True, True], "stop", "<think>x")
    c2 = Completion([4, 2], [-0.5, -0.6], [1, 1], [False, True], "interrupted", "y")
    return ScoredGroup(RolloutGroup(task, [1, 5, 6], [c1, c2]), [1.0, -1.0], [True, False])


def test_rle():
    assert rle_encode([3, 3, 3, 4, 4]) == [[3, 3], [4, 2]]
    assert rle_decode([[3, 3], [4, 2]]) == [3, 3, 3, 4, 4]
    assert rle_encode([]) == []


def test_codec_round_trip_and_rejections():
    g = _scored()
    assert decode(encode(g)) == g
    assert decode(encode(PolicyVersion(3, "file:///x", "ab")), PolicyVersion) == PolicyVersion(3, "file:///x", "ab")
    assert b"versions_rle" in encode(g)
    with pytest.raises(MessageError, match="not JSON"):
        decode(b"\xff\x00garbage")
    with pytest.raises(MessageError, match="unknown message type"):
        decode(b'{"schema":1,"type":"Nope","data":{}}')
    with pytest.raises(MessageError, match="schema version"):
        decode(b'{"schema":99,"type":"PolicyVersion","data":{}}')
    with pytest.raises(MessageError, match="expected PromptTask"):
        decode(encode(PolicyVersion(1, "u", "c")), PromptTask)
    bad = encode(g).replace(b'"rewards":[1.0,-1.0]', b'"rewards":[1.0]')
    with pytest.raises(MessageError, match="one reward per completion"):
        decode(bad)


def test_memory_bus_offsets_commit_and_seek():
    bus = MemoryBus()
    for i in range(5):
        bus.publish("j.prompts", i, key=str(i))
    c = bus.consumer(["j.prompts"], "g")
    assert [r.value for r in c.poll(max_records=3)] == [0, 1, 2]
    c.commit()
    assert c.positions() == {"j.prompts:0": 3}
    # A new member of the group starts at the committed offset: no loss, no re-delivery.
    c2 = bus.consumer(["j.prompts"], "g")
    assert [r.value for r in c2.poll()] == [3, 4]
    # Another group reads everything; seek re-reads from a saved position.
    other = bus.consumer(["j.prompts"], "h")
    assert len(other.poll()) == 5
    other.seek({"j.prompts:0": 1})
    assert [r.value for r in other.poll()] == [1, 2, 3, 4]
    assert other.poll(timeout_s=0.01) == []


def test_local_store_atomic_and_weights_checksum(tmp_path):
    store = LocalStore(tmp_path)
    uri = store.put_bytes("a/b.bin", b"hello")
    assert uri == f"file://{tmp_path.resolve().as_posix()}/a/b.bin"
    assert store.get_bytes("a/b.bin") == b"hello" and store.list("a/") == ["a/b.bin"]
    assert not any(p.name.endswith(".tmp") for p in (tmp_path / "a").iterdir())
    with pytest.raises(StoreError):
        store.get_bytes("missing")
    with pytest.raises(StoreError, match="escapes"):
        store.put_bytes("../evil", b"x")
    sd = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    pv = publish_weights(store, 1, sd)
    torch.testing.assert_close(load_weights(store, pv)["w"], sd["w"])
    store.put_bytes(store.key_of(pv.uri), b"tampered")
    with pytest.raises(StoreError, match="not JSON"):
        load_weights(store, pv)
    for v in range(2, 6):
        publish_weights(store, v, sd, keep_last=3)
    versions = sorted({v.version for k in store.list("policy/") if (v := parse_key(k))})
    assert versions == [3, 4, 5]
