"""Weight sync on the real MinIO (#30): a late generator builds the newest version from snapshot + deltas,
bit-identical; a lost delta shard ends in a snapshot; a corrupt shard is refused by name; a reader killed
mid-download leaves nothing behind that stops the next; a swap's peak memory stays within the bound.

Each version's reference is computed here, independently of the codec: the simulated learner's fp32
master weights cast to bf16."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from scalerl.messages import PolicyVersion
from scalerl.store.factory import open_store
from scalerl.weightsync.codec import bits_of
from scalerl.weightsync.manifest import REQUESTS, parse_key
from scalerl.weightsync.publisher import WeightPublisher
from scalerl.weightsync.reader import WeightReader, WeightsUnavailable

pytestmark = pytest.mark.infra

BUCKET = "scalerl-it"
LR = 1e-5  # examples/smollm2-addition.yaml's learning rate
ROOT = Path(__file__).resolve().parents[2]


def master_weights(seed: int, sizes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(s, generator=g) * 0.05 for k, s in sizes.items()}


def step(master: dict[str, torch.Tensor], g: torch.Generator) -> None:
    for t in master.values():  # Adam's largest move: lr in each value, random sign
        t.add_(torch.randint(0, 2, t.shape, generator=g).float().mul_(2).sub_(1), alpha=LR)


def bf16(master: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.to(torch.bfloat16) for k, v in master.items()}


def same_bits(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> bool:
    return sorted(got) == sorted(want) and all(
        torch.equal(bits_of(got[k].contiguous()), bits_of(want[k])) for k in want)


SIZES = {"embed.weight": (1024, 256), "layers.0.mlp.weight": (512, 256), "layers.0.norm.weight": (256,)}


def test_a_generator_joining_at_version_7_builds_version_12_bit_identical(s3_env, unique) -> None:
    store = open_store(f"s3://{BUCKET}/{unique}")
    pub = WeightPublisher(store, torch.bfloat16, snapshot_every=5, shard_bytes=64 * 1024, parallel=4,
                          keep_last=12)
    master, g = master_weights(0, SIZES), torch.Generator().manual_seed(1)
    pvs, refs, late = [], [], None
    for v in range(1, 13):
        if v > 1:
            step(master, g)
        pvs.append(pub.publish(v, master))
        refs.append(bf16(master))
        if v == 7:
            late = WeightReader(store, parallel=4)
            assert same_bits(late.fetch(pvs[-1]), refs[-1])  # snapshot 6 + delta 7
            assert (late.stats.applied, late.stats.snapshots) == (2, 1)
    assert late is not None
    assert same_bits(late.fetch(pvs[-1]), refs[-1])  # from 7: snapshot 11 + delta 12
    assert (late.stats.applied, late.stats.snapshots) == (2, 1)
    kinds = [parse_key(store.key_of(pv.uri)).kind for pv in pvs]  # type: ignore[union-attr]
    assert kinds.count("snapshot") == 3  # versions 1, 6, 11
    deltas = [pub.last.stored_bytes] if pub.last is not None else []
    full = sum(t.numel() * 2 for t in refs[-1].values())
    assert deltas and deltas[0] < 0.15 * full  # a bf16 delta at the example's learning rate
    for pv, ref in zip(pvs[:-1], refs[:-1], strict=True):  # every other version still builds exactly
        assert same_bits(WeightReader(store).fetch(pv), ref), pv.version


def test_a_lost_delta_shard_asks_for_a_snapshot_and_a_corrupt_one_is_refused_by_name(s3_env, unique) -> None:
    store = open_store(f"s3://{BUCKET}/{unique}")
    pub = WeightPublisher(store, torch.bfloat16, snapshot_every=100, shard_bytes=32 * 1024)
    master, g = master_weights(2, SIZES), torch.Generator().manual_seed(3)
    reader = WeightReader(store, reader_id="gen-7")
    pv = pub.publish(1, master)
    assert same_bits(reader.fetch(pv), bf16(master))
    step(master, g)
    pv2 = pub.publish(2, master)
    shards = [s.key for s in pub.last.shards] if pub.last is not None else []
    assert shards
    store.delete(shards[0])
    with pytest.raises(WeightsUnavailable, match=f"no object .*{shards[0]}"):
        reader.fetch(pv2)
    assert store.list(REQUESTS) == [f"{REQUESTS}gen-7"]
    step(master, g)
    pv3 = pub.publish(3, master)
    assert pub.last is not None and pub.last.kind == "snapshot" and store.list(REQUESTS) == []
    assert same_bits(reader.fetch(pv3), bf16(master))  # goes on from the snapshot

    step(master, g)
    pv4 = pub.publish(4, master)
    assert pub.last is not None and pub.last.kind == "delta"
    bad = pub.last.shards[-1].key
    data = bytearray(store.get_bytes(bad))
    data[-1] ^= 0x01
    store.put_bytes(bad, bytes(data))
    with pytest.raises(WeightsUnavailable, match=f"shard {bad} is corrupt"):
        reader.fetch(pv4)
    assert reader.held is None  # a half-applied copy is never served: the next version rebuilds it
    step(master, g)
    pv5 = pub.publish(5, master)
    assert pub.last is not None and pub.last.kind == "snapshot"
    assert same_bits(reader.fetch(pv5), bf16(master))


FETCHER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    import torch
    from scalerl.messages import PolicyVersion
    from scalerl.store.factory import open_store
    from scalerl.weightsync.codec import bits_digest, bits_of
    from scalerl.weightsync.reader import WeightReader

    url, pv_json, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    parallel, slow = int(sys.argv[4]), float(sys.argv[5])
    store = open_store(url)
    if slow:  # slow downloads, so the test can kill this process in the middle of one version
        read = store.read_into
        def slow_read(key, offset, buf):
            if "shard-" in key:
                Path(out.with_suffix(".progress")).write_text(key)
                time.sleep(slow)
            read(key, offset, buf)
        store.read_into = slow_read
    reader = WeightReader(store, parallel=parallel)
    pv = PolicyVersion(**json.loads(pv_json))
    def status():
        return {k: int(v) for k, v in (l.split()[:2] for l in Path("/proc/self/status").read_text().splitlines()
                                        if l.startswith(("VmRSS:", "VmHWM:")))}
    reader.fetch(pv)  # the resident copy exists: what a swap costs is measured above it
    Path("/proc/self/clear_refs").write_text("5")
    before = status()["VmRSS:"]
    reader.held = None  # the same version again, rebuilt from its snapshot into the copy in place
    weights = reader.fetch(pv)
    peak = status()["VmHWM:"] - before
    digests = {k: bits_digest(bits_of(v.contiguous())) for k, v in weights.items()}
    out.write_text(json.dumps({"peak_kb": peak, "digests": digests}))
""")


def _fetcher(tmp_path: Path, url: str, pv: PolicyVersion, parallel: int, slow: float) -> subprocess.Popen[str]:
    script = tmp_path / "fetch.py"
    script.write_text(FETCHER)
    body = json.dumps({"version": pv.version, "uri": pv.uri, "checksum": pv.checksum})
    return subprocess.Popen([sys.executable, str(script), url, body, str(tmp_path / "out.json"), str(parallel),
                             str(slow)], env=os.environ.copy(), text=True, stderr=subprocess.PIPE)


def test_a_reader_killed_mid_download_leaves_nothing_the_next_one_trips_on(s3_env, unique, tmp_path) -> None:
    url = f"s3://{BUCKET}/{unique}"
    store = open_store(url)
    pub = WeightPublisher(store, torch.bfloat16, shard_bytes=256 * 1024)
    master = master_weights(4, SIZES)
    pv = pub.publish(1, master)
    proc = _fetcher(tmp_path, url, pv, 1, slow=2.0)
    progress = tmp_path / "out.progress"
    deadline = time.monotonic() + 120
    while not progress.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert progress.exists(), proc.stderr.read() if proc.stderr else ""
    proc.send_signal(signal.SIGKILL)  # in the middle of its first shard
    proc.wait(timeout=30)
    assert store.list(REQUESTS) == []  # nothing left behind ...
    done = _fetcher(tmp_path, url, pv, 2, slow=0.0)  # ... so the restarted one simply builds the version
    assert done.wait(timeout=300) == 0, done.stderr.read() if done.stderr else ""
    got = json.loads((tmp_path / "out.json").read_text())["digests"]
    from scalerl.weightsync.codec import bits_digest

    assert got == {k: bits_digest(bits_of(v)) for k, v in bf16(master).items()}


def test_the_peak_memory_of_a_swap_is_one_shard_not_the_model(s3_env, unique, tmp_path) -> None:
    url = f"s3://{BUCKET}/{unique}"
    store = open_store(url)
    shard = 4 * 1024**2
    pub = WeightPublisher(store, torch.bfloat16, shard_bytes=shard)
    master = master_weights(5, {"a.weight": (8192, 4096), "b.weight": (8192, 2048)})  # 96 MiB in bf16
    model_kb = sum(t.numel() * 2 for t in master.values()) // 1024
    pv = pub.publish(1, master)
    parallel = 2
    proc = _fetcher(tmp_path, url, pv, parallel, slow=0.0)
    assert proc.wait(timeout=300) == 0, proc.stderr.read() if proc.stderr else ""
    peak_kb = json.loads((tmp_path / "out.json").read_text())["peak_kb"]
    # beside its resident copy, a reader holds one shard (its ranged reads go straight into one buffer, the
    # client copying 1 MiB at a time) and some slack for threads and the allocator; it held `parallel`
    # shards, about twice over, before (a bound of 3 x 2 shards here), and the whole model twice before that
    assert peak_kb < shard // 1024 + 8 * 1024, (peak_kb, model_kb)
    assert peak_kb < model_kb / 2
