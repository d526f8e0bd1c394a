"""S3Store against a real MinIO: round trip, listing, integrity check, and policy weights."""

from __future__ import annotations

import hashlib
import io
import os

import pytest
import torch

from scalerl.store.base import StoreError
from scalerl.store.factory import open_store
from scalerl.weightsync.manifest import parse_key
from scalerl.weightsync.publisher import publish_weights
from scalerl.weightsync.reader import load_weights

pytestmark = pytest.mark.infra

if not os.environ.get("CI"):  # in CI a missing client is an error, never a skip
    pytest.importorskip("minio", reason="the minio client is not installed")
from minio import Minio  # noqa: E402

from scalerl.store.s3 import MULTIPART_PART, S3Store  # noqa: E402

BUCKET = "scalerl-it"


@pytest.fixture
def store(s3_env, unique: str) -> S3Store:
    s = open_store(f"s3://{BUCKET}/{unique}")
    assert isinstance(s, S3Store)
    return s


def _raw_client(infra) -> Minio:
    return Minio(infra.s3_endpoint.split("://", 1)[1], access_key=infra.s3_access_key,
                 secret_key=infra.s3_secret_key, secure=False, region=infra.s3_region)


def test_put_get_list_delete_round_trip(store: S3Store, unique: str) -> None:
    assert store.list() == []
    payloads = {"ckpt/step-2/model.bin": os.urandom(1000), "ckpt/step-10/model.bin": b"ten",
                "policy/v00000001.safetensors": b"\x00" * 17, "notes.txt": b""}
    for k, v in payloads.items():
        assert store.put_bytes(k, v) == f"s3://{BUCKET}/{unique}/{k}"
    for k, v in payloads.items():
        assert store.get_bytes(k) == v
        assert store.exists(k)
    assert store.list() == sorted(payloads)
    assert store.list("ckpt/") == ["ckpt/step-10/model.bin", "ckpt/step-2/model.bin"]
    assert store.list("nothing/") == []
    assert store.uri("a/b") == f"s3://{BUCKET}/{unique}/a/b"
    assert store.key_of(store.uri("ckpt/step-2/model.bin")) == "ckpt/step-2/model.bin"
    with pytest.raises(StoreError):
        store.key_of(f"s3://{BUCKET}/other-prefix/x")

    store.put_bytes("notes.txt", b"overwritten")  # overwrite replaces the whole object
    assert store.get_bytes("notes.txt") == b"overwritten"

    store.delete("ckpt/step-2/model.bin")
    store.delete("ckpt/step-2/model.bin")  # deleting again is fine
    assert not store.exists("ckpt/step-2/model.bin")
    with pytest.raises(StoreError, match="no object"):
        store.get_bytes("ckpt/step-2/model.bin")
    assert store.list("ckpt/") == ["ckpt/step-10/model.bin"]
    for bad in ("", "/abs", "a/../b", "a//b"):
        with pytest.raises(StoreError):
            store.put_bytes(bad, b"x")


def test_objects_of_other_prefixes_are_invisible(s3_env, unique: str) -> None:
    a = open_store(f"s3://{BUCKET}/{unique}-a")
    b = open_store(f"s3://{BUCKET}/{unique}-a2")
    a.put_bytes("k", b"A")
    b.put_bytes("k", b"B")
    assert a.list() == ["k"] and b.list() == ["k"]
    assert a.get_bytes("k") == b"A" and b.get_bytes("k") == b"B"


def test_bucket_is_created_and_sha256_is_stored(s3_env, unique: str) -> None:
    bucket = f"scalerl-{unique}"
    raw = _raw_client(s3_env)
    assert not raw.bucket_exists(bucket)
    s = open_store(f"s3://{bucket}/run/1")
    assert raw.bucket_exists(bucket)
    data = os.urandom(6 * 1024 * 1024 + 3)  # above S3's smallest part, below our multipart size: one PUT
    s.put_bytes("big.bin", data)
    stat = raw.stat_object(bucket, "run/1/big.bin")
    assert stat.size == len(data)
    assert stat.metadata["x-amz-meta-sha256"] == hashlib.sha256(data).hexdigest()
    assert "-" not in stat.etag, "expected a single PUT, not a multipart upload"
    assert s.get_bytes("big.bin") == data


def test_weights_of_a_real_model_size_go_up_in_parts_with_their_checksum(store: S3Store, s3_env, unique) -> None:
    """Above MULTIPART_PART (a real model's 270-540 MB) the object is a multipart upload (its ETag ends in
    -<parts>), carries the sha256 of the whole, and reads back equal."""
    data = os.urandom(2 * MULTIPART_PART + 12345)
    store.put_bytes("policy/v1/model.safetensors", data)
    stat = _raw_client(s3_env).stat_object(BUCKET, f"{unique}/policy/v1/model.safetensors")
    assert stat.size == len(data) and stat.etag.endswith("-3"), stat.etag
    assert stat.metadata["x-amz-meta-sha256"] == hashlib.sha256(data).hexdigest()
    assert store.get_bytes("policy/v1/model.safetensors") == data


def test_checksum_mismatch_is_detected(store: S3Store, s3_env, unique: str) -> None:
    good = b"the real weights" * 100
    store.put_bytes("policy/v1.bin", good)
    raw = _raw_client(s3_env)
    name = f"{unique}/policy/v1.bin"
    sha = raw.stat_object(BUCKET, name).metadata["x-amz-meta-sha256"]
    # tamper: different bytes under the same object name, keeping the stored checksum
    bad = b"corrupted bytes!" * 100
    raw.put_object(BUCKET, name, io.BytesIO(bad), len(bad), metadata={"sha256": sha})
    with pytest.raises(StoreError, match="checksum mismatch"):
        store.get_bytes("policy/v1.bin")
    store.put_bytes("policy/v1.bin", good)  # a proper rewrite heals it
    assert store.get_bytes("policy/v1.bin") == good


def test_a_callers_blake3_is_stored_in_place_of_the_sha256_and_checked(store: S3Store, s3_env, unique) -> None:
    """A caller's checksum (weight shards: BLAKE3) is recorded instead of a SHA-256 computed here, and a read
    checks it; an algorithm the store does not know is refused before anything is written."""
    import blake3

    data = os.urandom(1 << 20)
    digest = blake3.blake3(data).hexdigest()
    store.put_bytes("policy/shard", data, checksum=("blake3", digest))
    raw = _raw_client(s3_env)
    name = f"{unique}/policy/shard"
    meta = raw.stat_object(BUCKET, name).metadata
    assert meta["x-amz-meta-blake3"] == digest and "x-amz-meta-sha256" not in meta
    assert store.get_bytes("policy/shard") == data
    bad = bytes(reversed(data))
    raw.put_object(BUCKET, name, io.BytesIO(bad), len(bad), metadata={"blake3": digest})
    with pytest.raises(StoreError, match=r"checksum mismatch .*: blake3"):
        store.get_bytes("policy/shard")
    with pytest.raises(StoreError, match="checksum algorithm 'md5'"):
        store.put_bytes("policy/other", data, checksum=("md5", "0" * 32))
    assert not store.exists("policy/other")


def test_from_url_names_the_missing_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("S3_ENDPOINT", "http://127.0.0.1:1")
    monkeypatch.setenv("S3_ACCESS_KEY", "k")
    monkeypatch.delenv("S3_SECRET_KEY", raising=False)
    with pytest.raises(StoreError, match="S3_SECRET_KEY"):
        open_store("s3://bucket/prefix")
    with pytest.raises(ValueError, match="s3://bucket"):
        S3Store.from_url("s3:///no-bucket")


def test_policy_weights_round_trip_through_minio(store: S3Store, unique: str) -> None:
    torch.manual_seed(0)
    state = {"embed.weight": torch.randn(64, 16), "layers.0.mlp.weight": torch.randn(32, 16),
             "layers.0.mlp.bias": torch.zeros(32), "norm.weight": torch.ones(16, dtype=torch.bfloat16),
             "step": torch.tensor([7], dtype=torch.int64)}
    pvs = [publish_weights(store, v, {k: t + v if t.is_floating_point() else t for k, t in state.items()},
                           keep_last=2) for v in (1, 2, 3)]
    pv = pvs[-1]
    assert pv.version == 3
    assert pv.uri == f"s3://{BUCKET}/{unique}/policy/v00000003-{pv.checksum[:16]}-s/manifest.json"
    versions = sorted({v.version for k in store.list("policy/") if (v := parse_key(k))})
    assert versions == [2, 3]  # pruned v1
    loaded = load_weights(store, pv)
    assert set(loaded) == set(state)
    for k, t in state.items():
        expect = t + 3 if t.is_floating_point() else t
        assert loaded[k].dtype == t.dtype and loaded[k].shape == t.shape
        assert torch.equal(loaded[k], expect), k
    with pytest.raises(StoreError):
        load_weights(store, pvs[0])  # pruned
    forged = type(pv)(pv.version, pv.uri, "0" * 64)
    with pytest.raises(StoreError, match="uri"):  # the checksum names the manifest: another one is not ours
        load_weights(store, forged)
