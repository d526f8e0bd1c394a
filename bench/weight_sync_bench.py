"""`make bench`'s weight_sync section (`make bench-weight-sync` alone): a policy version from the learner to a
generator's engine, through MinIO as a full version and as a delta, by broadcast, beside the physical limit.

For each model (`tiny`: examples/quickstart.yaml; `smollm2`: examples/smollm2-addition.yaml's SmolLM2-135M),
in the generator's dtype (`--dtype`, bfloat16 by default: what a GPU generator runs), measured side by side
in one run, each a median over `--repeats`:

- full: `WeightPublisher(delta=False).publish` -> `WeightReader.fetch` -> `TorchEngine.load_weights`;
- delta: the same with deltas on, after one simulated learner step between versions. The step moves every
  fp32 master weight by the example's learning rate (`optim.lr`) times a random sign: Adam's largest
  per-step move (|m / sqrt(v)| <= 1), so the delta measured is an upper bound of a real step's;
- one_object: what weight sync was before (a whole safetensors object per version, SHA-256 over it,
  one PUT, one GET, `safetensors.load`), for the ratio the issue asks for;
- broadcast: the runtimes' broadcast path (`runtime.weight_sync.broadcast`, deltas on) in the learner's
  order: the version is encoded, pushed over gloo from a `BroadcastHub` to a `BroadcastReceiver` (loopback,
  one member) and announced (a snapshot once its manifest, sent first, is out; a delta at the end); the
  generator builds it from the pushed manifest and shards as they arrive and swaps, while the learner
  uploads it to MinIO (both on this machine's cores); broadcast_full: the same with every version a
  snapshot; broadcast_full_upload_after_swap: a diagnostic, not the runtimes' order: the learner's upload
  waits for the swap, so the swap does not share the 2 cores with the upload (and MinIO), as it would not
  with learner and generator on two machines;
- state_broadcast: the vLLM weight-transfer backend's raw state-dict broadcast (`scalerl.model.weight_broadcast`,
  a learner process, each tensor loaded as it arrives), no store;
- loopback_copy_s: the physical limit: one full version's bytes sent over a 127.0.0.1 TCP socket into a
  preallocated buffer; gloo_copy_s: the same bytes pushed by a `BroadcastHub` to one `BroadcastReceiver`
  as shards (the broadcast path's transport alone: no encoding, checks or build); checks_cpu_s: one
  core's seconds to BLAKE3 those bytes once (what the learner hashes for a full version's chunks, and each
  generator before it copies a pushed raw chunk); full_floor_s: both sides' checks
  and the copy spread perfectly over this machine's cores, the least any checked full version can take
  here; minio_object_copy_s: the same bytes as one MinIO object, one PUT then one GET (the store's own
  limit for one connection each way).

`bytes` is what crosses the network per version to a generator (stored shard bytes; the state's bytes for
state_broadcast).
`swap_peak_extra_mb`: the generator's peak resident memory during a fetch + swap above its resident memory
before it (Linux VmHWM after clear_refs), against the model's size in the published dtype.

Needs MinIO (S3_* from build/infra.env, which `make bench-weight-sync` starts).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from results_file import merge_sections
from scalerl.config import load_spec
from scalerl.console import quiet_third_party_bars
from scalerl.generator.torch_engine import TorchEngine
from scalerl.model.factory import load_model_and_tokenizer
from scalerl.model.weight_broadcast import (
    BroadcastEndpoint,
    join_group,
    open_store,
    receive_tensors,
    start_learner_process,
    update_info,
)
from scalerl.store.s3 import S3Store
from scalerl.weightsync.broadcast import BroadcastHub, BroadcastReceiver, BroadcastSettings
from scalerl.weightsync.codec import digest
from scalerl.weightsync.factory import UPLOAD_WAIT_TIMEOUTS
from scalerl.weightsync.inbox import Inbox
from scalerl.weightsync.publisher import WeightPublisher, untie
from scalerl.weightsync.reader import WeightReader

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def peak_extra_mb(fn: Callable[[], Any]) -> float:
    """MB of resident memory `fn` needed at its peak above what was resident before it."""
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    before = _rss_kb("VmRSS")
    fn()
    return (_rss_kb("VmHWM") - before) / 1024


def median_of(times: list[float]) -> float:
    return round(statistics.median(times), 4)


def loopback_copy_s(nbytes: int, repeats: int) -> float:
    """Seconds to send `nbytes` over a 127.0.0.1 TCP socket into a preallocated buffer (median)."""
    payload = memoryview(bytearray(os.urandom(1 << 20)) * max(1, nbytes >> 20))[:nbytes]
    sink = bytearray(len(payload))
    times = []
    for _ in range(repeats + 1):
        server = socket.create_server(("127.0.0.1", 0))
        port = server.getsockname()[1]

        def send(port: int = port) -> None:
            with socket.create_connection(("127.0.0.1", port)) as c:
                c.sendall(payload)

        t0 = time.perf_counter()
        sender = threading.Thread(target=send)
        sender.start()
        conn, _ = server.accept()
        view, got = memoryview(sink), 0
        while got < len(sink):
            n = conn.recv_into(view[got:], min(len(sink) - got, 1 << 22))
            if not n:
                break
            got += n
        sender.join()
        times.append(time.perf_counter() - t0)
        conn.close()
        server.close()
    return median_of(times[1:])


def gloo_copy_s(nbytes: int, repeats: int, shard_bytes: int = 32 * 1024**2) -> float:
    """Seconds to push `nbytes` from a hub to one receiver (loopback, gloo) as objects of `shard_bytes`, until
    the hub has every member's done (median)."""
    data = memoryview(os.urandom(shard_bytes))
    sizes = [min(shard_bytes, nbytes - i) for i in range(0, nbytes, shard_bytes)]
    hub = BroadcastHub(BroadcastSettings("127.0.0.1", 0, timeout_s=60))
    inbox = Inbox(versions=1)  # received as a generator does, into buffers it recycles
    receiver = BroadcastReceiver(BroadcastSettings("127.0.0.1", hub.port, timeout_s=60), "gloo-copy",
                                 inbox.put, inbox.end, inbox.buffer)
    try:
        deadline = time.monotonic() + 120
        while hub.members < 1:
            assert time.monotonic() < deadline, "the bench's receiver did not join the broadcast group"
            time.sleep(0.05)
        times = []
        for v in range(repeats + 1):
            objects = [(f"gloo/v{v}/{i}", data[:n]) for i, n in enumerate(sizes)]
            t0 = time.perf_counter()
            assert hub.send(v + 1, objects), "the push failed"
            times.append(time.perf_counter() - t0)
            got = [inbox.take(key) for key, _ in objects]
            assert sum(len(d) for d in got if d is not None) == nbytes
            for key, _ in objects:
                inbox.release(key)
    finally:
        receiver.close()
        hub.close()
    return median_of(times[1:])


def checks_cpu_s(nbytes: int, repeats: int) -> float:
    """Seconds of one core to check one full version's bytes as one side of the broadcast path does: one
    BLAKE3 pass over all of them (median)."""
    data = os.urandom(1 << 20) * max(1, nbytes >> 20)
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        digest(data)
        times.append(time.perf_counter() - t0)
    return median_of(times[1:])


def minio_object_copy_s(store: S3Store, nbytes: int, repeats: int) -> float:
    data = os.urandom(nbytes)
    sha = hashlib.sha256(data).hexdigest()
    times = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        store.put_bytes(f"loopback/{i}", data, checksum=("sha256", sha))
        store.get_bytes(f"loopback/{i}", verify=False)
        times.append(time.perf_counter() - t0)
        store.delete(f"loopback/{i}")
    return median_of(times[1:])


class Learner:
    """fp32 master weights of the model moved by one Adam-sized step per version (module docstring)."""

    def __init__(self, model: Any, lr: float) -> None:
        tensors, aliases = untie(dict(model.state_dict()))
        self.master = {k: v.detach().float().clone() if v.is_floating_point() else v.detach().clone()
                       for k, v in tensors.items()}
        self.master.update({alias: self.master[name] for alias, name in aliases.items()})  # still tied
        self.aliases = aliases
        self.lr = lr
        self.g = torch.Generator().manual_seed(0)

    def published(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The weights in `dtype`, each tied tensor once (as the publisher stores them)."""
        return {k: v.to(dtype) if v.is_floating_point() else v for k, v in self.master.items()
                if k not in self.aliases}

    def step(self) -> None:
        for t in {id(t): t for t in self.master.values()}.values():
            if t.is_floating_point():
                t.add_(torch.randint(0, 2, t.shape, generator=self.g).float().mul_(2).sub_(1), alpha=self.lr)


def bench_store_path(name: str, learner: Learner, engine: TorchEngine, store: S3Store, dtype: torch.dtype,
                     delta: bool, repeats: int, broadcast: bool = False,
                     upload_after_swap: bool = False) -> dict[str, Any]:
    publisher = WeightPublisher(store, dtype, delta=delta, snapshot_every=10_000, keep_last=2)
    # (as `weightsync.factory.make_reader` makes a broadcast member's: it waits for what is on its way)
    reader = WeightReader(store, manifest_wait_s=UPLOAD_WAIT_TIMEOUTS * 60 if broadcast else 0.0)
    hub = receiver = None
    if broadcast:
        hub = BroadcastHub(BroadcastSettings("127.0.0.1", 0, timeout_s=60))
        receiver = BroadcastReceiver(BroadcastSettings("127.0.0.1", hub.port, timeout_s=60), "bench",
                                     reader.offer_shards, reader.push_ended,
                                     reader.inbox.buffer)
        deadline = time.monotonic() + 120
        while hub.members < 1:
            assert time.monotonic() < deadline, "the bench's receiver did not join the broadcast group"
            time.sleep(0.05)
    downloaded: list[int] = []  # shard bytes a broadcast reader had to download (none expected)
    times, sizes, peaks = [], [], []
    for i in range(repeats + 1):
        learner.step()
        version = i + 1
        holder: dict[str, Any] = {}

        def swap(pv: Any, holder: dict[str, Any] = holder) -> None:
            engine.load_weights(reader.fetch(pv), pv.version)
            holder["t"] = time.perf_counter()

        def push_and_announce(pv: Any, parts: Any, holder: dict[str, Any] = holder) -> None:
            """The learner's order on the broadcast path: push, announce once the manifest is out (the
            generator builds and swaps), upload."""
            def announce() -> None:
                holder["t_pub"] = time.perf_counter()
                holder["swap"] = threading.Thread(target=swap, args=(pv,))
                holder["swap"].start()

            assert hub is not None and hub.send_and_announce(pv.version, parts, announce), "the broadcast failed"
            if upload_after_swap:  # (a diagnostic: the learner's upload does not share the cores with the swap)
                holder["swap"].join()

        t0 = time.perf_counter()
        if hub is None:
            pv = publisher.publish(version, learner.master)
            holder["t_pub"] = time.perf_counter()
            peak = peak_extra_mb(lambda pv=pv: swap(pv)) if i else 0.0
        else:  # the generator's swap overlaps the learner's upload: its memory is not the swap's alone
            publisher.publish(version, learner.master, before_upload=push_and_announce)
            holder["swap"].join()
            peak = float("nan")
        if i:  # the first version is the snapshot every reader starts from
            assert publisher.last is not None
            times.append(holder["t"] - t0)
            sizes.append(publisher.last.stored_bytes)
            peaks.append(peak)
            downloaded.append(reader.stats.bytes)
            how = f"{'delta' if delta else 'full'}{' broadcast' if broadcast else ''}"
            print(f"  {name} {how} v{version}: {publisher.last.kind}, "
                  f"{publisher.last.stored_bytes / 1e6:.1f} MB, {'announce' if hub else 'publish'} "
                  f"{holder['t_pub'] - t0:.2f} s, fetch+swap {holder['t'] - holder['t_pub']:.2f} s"
                  f"{'' if hub else f', peak +{peak:.0f} MB'}", file=sys.stderr)
    assert publisher.last is not None
    if hub is not None and receiver is not None:
        receiver.close()
        hub.close()
        assert not any(downloaded), f"shards were downloaded, not pushed: {downloaded} bytes"
    changed = sum(c.changed for c in publisher.last.chunks) / sum(t.numel for t in publisher.last.tensors)
    row = {"bytes": int(statistics.median(sizes)), "publish_to_swap_s": median_of(times),
           "changed_fraction": round(changed, 5) if delta else 1.0}
    if hub is None:
        row.update(swap_peak_extra_mb=round(statistics.median(peaks), 1), swap_peak_extra_mb_max=round(max(peaks), 1))
    return row


def bench_one_object(learner: Learner, engine: TorchEngine, store: S3Store, dtype: torch.dtype,
                     repeats: int) -> dict[str, Any]:
    """The path before weightsync: one safetensors object per version, SHA-256 over it, PUT, GET, load."""
    from safetensors.torch import load as st_load
    from safetensors.torch import save as st_save

    times = []
    size = 0
    for i in range(repeats + 1):
        learner.step()
        t0 = time.perf_counter()
        tensors = learner.published(dtype)
        data = st_save(tensors)
        sha = hashlib.sha256(data).hexdigest()
        store.put_bytes(f"one/v{i}", data, checksum=("sha256", sha))
        got = store.get_bytes(f"one/v{i}")
        assert hashlib.sha256(got).hexdigest() == sha
        loaded = st_load(got)
        loaded.update({a: loaded[n] for a, n in learner.aliases.items()})
        engine.load_weights(loaded, i + 1)
        times.append(time.perf_counter() - t0)
        size = len(data)
        store.delete(f"one/v{i}")
    return {"bytes": size, "publish_to_swap_s": median_of(times[1:])}


def bench_state_broadcast(learner: Learner, engine: TorchEngine, dtype: torch.dtype, repeats: int,
                    work: Path) -> dict[str, Any]:
    state = learner.published(dtype)
    path = work / "state.pt"
    torch.save(state, path)
    proc, port, _ = start_learner_process(sys.executable, [path], rounds=repeats + 1)
    try:
        endpoint = BroadcastEndpoint("127.0.0.1", port, world_size=2, rank=1, timeout_s=120)
        tcp = open_store(endpoint)
        group = join_group(endpoint, tcp)
        info, times = update_info(state), []
        params = dict(engine.model.named_parameters())
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            with torch.no_grad():
                for name, tensor in receive_tensors(group, info, "cpu"):
                    if name in params:
                        params[name].copy_(tensor)
            times.append(time.perf_counter() - t0)
        proc.wait(timeout=120)
    finally:
        proc.kill()
    return {"bytes": sum(t.numel() * t.element_size() for t in state.values()),
            "publish_to_swap_s": median_of(times[1:]),
            "note": "receive time from the learner's first send (the learner process holds the state in memory)"}


def bench_model(key: str, spec_path: str, dtype: torch.dtype, repeats: int, work: Path) -> dict[str, Any]:
    spec = load_spec(spec_path, [f"model.dtype={'bfloat16' if dtype == torch.bfloat16 else 'float32'}"])
    model, tok = load_model_and_tokenizer(spec.model, spec.seed)
    model.eval()
    engine = TorchEngine(model, tok, seed=0)
    learner = Learner(model, spec.optim.lr)
    store = S3Store.from_url(f"s3://bench-ws-{uuid.uuid4().hex[:8]}/{key}")
    row: dict[str, Any] = {"dtype": str(dtype).removeprefix("torch."), "lr": spec.optim.lr,
                           "params": sum(p.numel() for p in model.parameters())}
    print(f"bench weight_sync: {key} ({row['params'] / 1e6:.1f} M parameters, {row['dtype']})", file=sys.stderr)
    row["full"] = bench_store_path(key, learner, engine, store, dtype, False, repeats)
    row["delta"] = bench_store_path(key, learner, engine, store, dtype, True, repeats)
    row["one_object"] = bench_one_object(learner, engine, store, dtype, repeats)
    row["broadcast"] = bench_store_path(key, learner, engine, store, dtype, True, repeats, broadcast=True)
    row["broadcast_full"] = bench_store_path(key, learner, engine, store, dtype, False, repeats, broadcast=True)
    row["broadcast_full_upload_after_swap"] = bench_store_path(key, learner, engine, store, dtype, False, repeats,
                                                               broadcast=True, upload_after_swap=True)
    row["state_broadcast"] = bench_state_broadcast(learner, engine, dtype, repeats, work)
    full_bytes = row["full"]["bytes"]
    row["loopback_copy_s"] = loopback_copy_s(full_bytes, repeats)
    row["minio_object_copy_s"] = minio_object_copy_s(store, full_bytes, repeats)
    row["gloo_copy_s"] = gloo_copy_s(full_bytes, repeats)
    row["checks_cpu_s"] = checks_cpu_s(full_bytes, repeats)
    # both sides' checks and the copy itself (sender and receiver: two cores busy) on this machine's cores
    row["full_floor_s"] = round((2 * row["checks_cpu_s"] + 2 * row["loopback_copy_s"]) / (os.cpu_count() or 1), 4)
    row["model_mb"] = round(full_bytes / 1e6, 1)
    for key in store.list(""):  # the bench's bucket holds a few full versions: leave nothing behind
        store.delete(key)
    row["ratios"] = {
        "delta_bytes_over_full": round(row["delta"]["bytes"] / full_bytes, 4),
        "one_object_over_delta_s": round(row["one_object"]["publish_to_swap_s"] / row["delta"]["publish_to_swap_s"], 2),
        "full_over_loopback_copy": round(row["full"]["publish_to_swap_s"] / row["loopback_copy_s"], 2),
        "full_floor_over_loopback_copy": round(row["full_floor_s"] / row["loopback_copy_s"], 2),
        "gloo_copy_over_loopback_copy": round(row["gloo_copy_s"] / row["loopback_copy_s"], 2),
        "broadcast_full_upload_after_swap_over_loopback_copy": round(
            row["broadcast_full_upload_after_swap"]["publish_to_swap_s"] / row["loopback_copy_s"], 2),
        "broadcast_full_over_loopback_copy": round(row["broadcast_full"]["publish_to_swap_s"]
                                                   / row["loopback_copy_s"], 2),
        "full_over_minio_object_copy": round(row["full"]["publish_to_swap_s"] / row["minio_object_copy_s"], 2),
        "broadcast_over_delta_s": round(row["broadcast"]["publish_to_swap_s"] / row["delta"]["publish_to_swap_s"], 2),
        "broadcast_full_over_full_s": round(row["broadcast_full"]["publish_to_swap_s"]
                                            / row["full"]["publish_to_swap_s"], 2),
    }
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench/results.json")
    ap.add_argument("--models", default="tiny,smollm2", help="comma-separated: tiny, smollm2")
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if not all(os.environ.get(k) for k in ("S3_ENDPOINT", "S3_ACCESS_KEY", "S3_SECRET_KEY")):
        print("weight_sync_bench: S3_ENDPOINT/S3_ACCESS_KEY/S3_SECRET_KEY unset (source build/infra.env)",
              file=sys.stderr)
        return 2
    quiet_third_party_bars()
    specs = {"tiny": "examples/quickstart.yaml", "smollm2": "examples/smollm2-addition.yaml"}
    section: dict[str, Any] = {"units": {
        "bytes": "bytes crossing the network per version to each generator (stored shards; the state for "
                 "state_broadcast); broadcast and broadcast_full also write them to the store",
        "publish_to_swap_s": "seconds from the learner's publish call until the generator's engine holds the "
                             "version (median)",
        "loopback_copy_s": "seconds to copy one full version's bytes over a 127.0.0.1 TCP socket (median)",
        "minio_object_copy_s": "seconds to PUT then GET one MinIO object of one full version's bytes (median)",
        "checks_cpu_s": "seconds of one core to BLAKE3 one full version's bytes once, what each side of the "
                        "broadcast path hashes for a full version (median)",
        "gloo_copy_s": "seconds to push one full version's bytes as 32 MiB objects from a BroadcastHub to one "
                       "BroadcastReceiver over gloo on loopback, no checks or build (median)",
        "full_floor_s": "the least seconds a full version can take from learner to generator on this machine's "
                        "cores: (2 x checks_cpu_s + 2 x loopback_copy_s) / CPUs, the two sides' checks and the "
                        "copy's sender and receiver, perfectly parallel",
        "swap_peak_extra_mb": "MB of the generator's peak resident memory during fetch + swap above before it "
                              "(median over versions; _max: the largest, the first swap's allocator growth)",
    }, "machine": f"{os.cpu_count()} CPUs"}
    with tempfile.TemporaryDirectory(prefix="scalerl-ws-bench-") as work:
        for key in args.models.split(","):
            section[key] = bench_model(key, specs[key], DTYPES[args.dtype], args.repeats, Path(work))
            r = section[key]
            print(f"{key}: full {r['full']['publish_to_swap_s']} s ({r['model_mb']} MB), delta "
                  f"{r['delta']['publish_to_swap_s']} s ({r['delta']['bytes'] / 1e6:.1f} MB), one object "
                  f"{r['one_object']['publish_to_swap_s']} s, broadcast {r['broadcast']['publish_to_swap_s']} s (full "
                  f"{r['broadcast_full']['publish_to_swap_s']} s), "
                  f"loopback {r['loopback_copy_s']} s, gloo push {r['gloo_copy_s']} s, "
                  f"checked-copy floor {r['full_floor_s']} s, "
                  f"MinIO object {r['minio_object_copy_s']} s")
    print(f"wrote the weight_sync section of {merge_sections(args.out, {'weight_sync': section})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
