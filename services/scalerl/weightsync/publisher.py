"""The learner's side: publish each policy version as a sharded snapshot or a delta against the last one.

`WeightPublisher.publish(version, state_dict)`:
1. casts the floating tensors to the publish dtype (`runtime.weight_sync.dtype`; "model" keeps each tensor's
   own) and keeps a tied tensor once (`untie`);
2. splits every tensor into chunks of at most `shard_bytes` and encodes them (`weightsync.codec`): raw for a
   snapshot, against the bits of the version it published last for a delta. The chunks are encoded and the
   shards uploaded `parallel` at a time; at most about 2 x `parallel` shards' bytes are held at once, cut
   into the memory the last version's shards took (`_ShardMemory`);
3. writes the manifest last (a version is complete once its manifest exists), then deletes what no reader
   needs any more (`retain`), and returns the `PolicyVersion` to announce.

A version is a snapshot when there is no previous one in this process (first publish, after a restart),
every `snapshot_every` versions, when the tensors' names, dtypes or shapes changed, or when a reader asked
for one (an object under ``policy/requests/``: `WeightReader.request_snapshot`); the requests are removed
once the snapshot is written.

With `before_upload` (the broadcast path, `weightsync.broadcast`), the caller is handed the version's
announcement and its objects as they are encoded (a snapshot's manifest first, since it is complete before
any shard is cut, then each shard; a delta's manifest last), to push them to the generators and announce the
version (`BroadcastHub.send_and_announce`: once the manifest is out); only then is the version uploaded (the
generators in the group need not wait for the store). The encoded version is held in memory until it is
uploaded. A marker ``policy/pending/v<version>`` written first keeps the number taken
(`reader.highest_version`) should the learner die before the manifest is written; it is deleted with the
version's clean-up.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from scalerl.messages import PolicyVersion
from scalerl.store.base import Store
from scalerl.weightsync.codec import Encoded, bits_digest, bits_of, digest, encode
from scalerl.weightsync.manifest import (
    PREFIX,
    REQUESTS,
    ChunkEntry,
    Listed,
    Manifest,
    ShardEntry,
    TensorEntry,
    parse_key,
    parse_pending,
    pending_key,
    shard_key,
)
from scalerl.weightsync.pool import INLINE_BYTES, in_pool

log = logging.getLogger(__name__)

DEFAULT_SHARD_BYTES = 32 * 1024**2

Blob = bytes | memoryview
Parts = Iterator[tuple[str, Blob]]
"""A version's objects as (key, bytes) as they are encoded: its shards in order, then its manifest."""
BeforeUpload = Callable[[PolicyVersion, Parts], None]


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


def chunk_ranges(numel: int, itemsize: int, shard_bytes: int) -> Iterator[tuple[int, int]]:
    """(start, count) element ranges of at most `shard_bytes` covering [0, numel) (one empty range for 0)."""
    step = max(1, shard_bytes // itemsize)
    yield from ((s, min(step, numel - s)) for s in range(0, max(numel, 1), step))


def _digest_chunks(pool: ThreadPoolExecutor, bits: list[torch.Tensor], chunks: list[ChunkEntry]) -> None:
    """Fill in every chunk's BLAKE3 (of its range of `bits`), hashed in `pool`."""
    def digest_of(c: ChunkEntry) -> str:
        return bits_digest(bits[c.tensor][c.start:c.start + c.count])

    for c, d in zip(chunks, in_pool(pool, digest_of, chunks, lambda c: c.count * bits[c.tensor].element_size()),
                    strict=True):
        c.blake3 = d


class _ShardMemory:
    """The memory shards are cut into, reused from one version to the next: fresh memory costs a page fault
    per 4 KiB, about as much as the copy into it. One thread cuts shards at a time."""

    def __init__(self) -> None:
        self._free: list[bytearray] = []
        self._used: list[bytearray] = []

    def join(self, parts: list[bytes | memoryview], size: int) -> memoryview:
        """`parts` (`size` bytes in all) one after the other in memory of this pool's."""
        fits = [i for i, b in enumerate(self._free) if len(b) >= size]
        buf = self._free.pop(min(fits, key=lambda i: len(self._free[i]))) if fits else bytearray(size)
        self._used.append(buf)
        out, at = memoryview(buf)[:size], 0
        for part in parts:
            out[at:at + len(part)] = part
            at += len(part)
        return out

    def recycle(self) -> None:
        """Nothing reads the shards cut so far any more: keep as much memory as they took for the next version
        (a snapshot's for a snapshot, a delta's few MB for a delta)."""
        budget = sum(len(b) for b in self._used)
        self._free = [b for b in sorted(self._free + self._used, key=len) if (budget := budget - len(b)) >= 0]
        self._used = []


class WeightPublisher:
    """Publishes versions into `store` (see the module docstring). `dtype`: the floating dtype versions are
    published in (None: each tensor's own). `delta` False: every version is a snapshot. `keep_last` 0: never
    delete a version."""

    def __init__(self, store: Store, dtype: torch.dtype | None = None, *, delta: bool = True,
                 snapshot_every: int = 10, shard_bytes: int = DEFAULT_SHARD_BYTES, parallel: int = 4,
                 keep_last: int = 3) -> None:
        if snapshot_every < 1 or shard_bytes < 1 or parallel < 1 or keep_last < 0:
            raise ValueError("snapshot_every, shard_bytes and parallel must be >= 1, keep_last >= 0")
        self.store = store
        self.dtype = dtype
        self.delta = delta
        self.snapshot_every = snapshot_every
        self.shard_bytes = shard_bytes
        self.parallel = parallel
        self.keep_last = keep_last
        self._prev: list[torch.Tensor] | None = None  # bits of the last version published (copies)
        self._prev_manifest: Manifest | None = None
        self._prev_tensors: dict[str, torch.Tensor] = {}  # the tensors `_prev` views
        self._spare: dict[str, torch.Tensor] = {}  # the version before last's buffers, reused by `_prepare`
        self._since_snapshot = 0
        self._memory = _ShardMemory()
        self.last: Manifest | None = None  # the manifest of the last version published

    # -- what goes out -----------------------------------------------------------------------------
    def _prepare(self, state_dict: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """CPU copies in the publish dtype (copies: the model's tensors change in place), written into the
        buffers of the version before last where they fit (no new memory to fault in every version)."""
        tensors, aliases = untie(state_dict)
        spare, self._spare = self._spare, {}
        out = {}
        with torch.no_grad():
            for name, t in tensors.items():
                dtype = self.dtype if self.dtype is not None and t.is_floating_point() else t.dtype
                buf = spare.get(name)
                if buf is None or buf.dtype != dtype or buf.shape != t.shape:
                    buf = torch.empty(t.shape, dtype=dtype)
                out[name] = buf.copy_(t.detach())
        return out, aliases

    def _want_snapshot(self, tensors: list[TensorEntry], requests: list[str]) -> str | None:
        """Why this version must be a snapshot (None: a delta will do)."""
        prev = self._prev_manifest
        if not self.delta:
            return "deltas are off"
        if prev is None:
            return "no previous version in this process"
        if self._since_snapshot + 1 >= self.snapshot_every:
            return f"every {self.snapshot_every} versions"
        if [(t.name, t.dtype, t.shape) for t in prev.tensors] != [(t.name, t.dtype, t.shape) for t in tensors]:
            return "the tensors' names, dtypes or shapes changed"
        if requests:
            return f"asked for by {', '.join(r.removeprefix(REQUESTS) for r in requests)}"
        return None

    def publish(self, version: int, state_dict: dict[str, torch.Tensor], *,
                before_upload: BeforeUpload | None = None) -> PolicyVersion:
        """Upload version `version` (see the module docstring); returns its announcement. `before_upload`:
        called with the announcement and the version's objects (`Parts`) once it is encoded, before the
        upload (the broadcast path)."""
        tensors, aliases = self._prepare(state_dict)
        bits = [bits_of(t) for t in tensors.values()]
        entries = [TensorEntry(n, str(t.dtype).removeprefix("torch."), list(t.shape)) for n, t in tensors.items()]
        chunks = [ChunkEntry(ti, start, count, "raw", 0, 0, 0, 0, "") for ti, b in enumerate(bits)
                  for start, count in chunk_ranges(b.numel(), b.element_size(), self.shard_bytes)]
        try:
            with ThreadPoolExecutor(self.parallel, thread_name_prefix="weights-publish") as pool:
                _digest_chunks(pool, bits, chunks)  # first: the version's key names every chunk's BLAKE3
                requests = self.store.list(REQUESTS)
                why = self._want_snapshot(entries, requests)
                kind = "delta" if why is None else "snapshot"
                manifest = Manifest(version, kind, entries, aliases, chunks=chunks)
                if kind == "delta" and self._prev_manifest is not None:
                    manifest.base, manifest.base_digest = self._prev_manifest.key, self._prev_manifest.digest
                announcement = PolicyVersion(version, self.store.uri(manifest.key), manifest.digest)
                prev = self._prev if kind == "delta" else None
                if kind == "snapshot":
                    self._lay_out(manifest, bits)
                if before_upload is None:
                    self._encode(pool, manifest, bits, prev)
                else:
                    self.store.put_bytes(pending_key(version), manifest.key.encode())
                    staged = self._stream(pool, manifest, bits, prev, announcement, before_upload)
                    list(pool.map(self._put, manifest.shards, staged))
        finally:  # (every thread that read the version's shards has ended)
            self._memory.recycle()
        self.store.put_bytes(manifest.key, manifest.to_json())
        # Published. From here nothing may fail the call: a caller that retries a failed publish must find
        # this publisher as it was before it (the state changes only now, and the clean-up is best effort).
        self._since_snapshot = 0 if kind == "snapshot" else self._since_snapshot + 1
        self._spare, self._prev_tensors = self._prev_tensors, tensors
        self._prev, self._prev_manifest, self.last = bits, manifest, manifest
        if kind == "snapshot":
            log.info("weights v%d: snapshot (%s), %.1f MB", version, why, manifest.stored_bytes / 1e6)
        try:
            for r in requests if kind == "snapshot" else []:
                self.store.delete(r)
            self.retain(version)
        except Exception as exc:  # what is left is deleted after a later version
            log.warning("weights v%d: clean-up of the store failed: %s", version, exc)
        return announcement

    def _put(self, entry: ShardEntry, data: Blob) -> None:
        """Upload one shard with its BLAKE3 (the store records it and checks it when the shard is read whole)."""
        self.store.put_bytes(entry.key, data, checksum=("blake3", digest(data)))

    def _lay_out(self, manifest: Manifest, bits: list[torch.Tensor]) -> None:
        """Place a snapshot's raw chunks in shards before any is encoded (their sizes are known; `_encode` cuts
        the same shards): its manifest is then final, and the broadcast path sends it first."""
        size, sizes = 0, []
        for c in manifest.chunks:
            n = c.count * bits[c.tensor].element_size()
            if not n:
                continue
            if self._starts_shard(size, n):
                sizes.append(size)
                size = 0
            c.encoding, c.changed, c.shard, c.offset, c.length = "raw", c.count, len(sizes), size, n
            size += n
        sizes += [size] if size else []
        key = manifest.key  # (it hashes the manifest: once)
        manifest.shards = [ShardEntry(shard_key(key, i), n) for i, n in enumerate(sizes)]

    def _starts_shard(self, filled: int, n: int) -> bool:
        """Whether a chunk of `n` bytes goes into a new shard after `filled` bytes of the current one."""
        return bool(filled) and filled + n > self.shard_bytes

    def _stream(self, pool: ThreadPoolExecutor, manifest: Manifest, bits: list[torch.Tensor],
                prev: list[torch.Tensor] | None, announcement: PolicyVersion,
                before_upload: BeforeUpload) -> list[Blob]:
        """Encode in a thread of its own while `before_upload` is handed each shard as it is cut, then the
        manifest; returns the shards' bytes (to upload). An encoding error reaches `before_upload` through the
        iterator (so that nothing is announced) and then the caller."""
        made: queue.SimpleQueue[tuple[str, Blob] | None] = queue.SimpleQueue()
        staged: list[Blob] = []
        failed: list[BaseException] = []

        def keep(key: str, data: Blob) -> None:
            staged.append(data)
            made.put((key, data))

        def produce() -> None:
            try:
                self._encode(pool, manifest, bits, prev, keep)
            except BaseException as exc:  # handed to the caller's thread
                failed.append(exc)
            finally:
                made.put(None)

        head = manifest.to_json() if manifest.shards else None  # a laid-out snapshot's: final, sent first

        def parts() -> Parts:
            if head is not None:
                yield manifest.key, head
            while (item := made.get()) is not None:
                yield item
            if failed:
                raise failed[0]
            if head is None:
                yield manifest.key, manifest.to_json()

        producer = threading.Thread(target=produce, name="weights-encode", daemon=True)
        producer.start()
        try:
            before_upload(announcement, parts())
        finally:
            producer.join()  # (it never waits on the caller: the queue is unbounded)
        if failed:
            raise failed[0]
        return staged

    def _encode(self, pool: ThreadPoolExecutor, manifest: Manifest, bits: list[torch.Tensor],
                prev: list[torch.Tensor] | None, keep: Callable[[str, Blob], None] | None = None) -> None:
        """Encode every chunk into shards, each uploaded in `pool`, `parallel` at a time (with `keep`: handed
        to it as (key, bytes) as soon as it is cut, instead of uploaded); fills in the chunks' encoding and
        place, and manifest.shards (a snapshot's are laid out already: the same are cut)."""
        jobs: deque[tuple[ChunkEntry, Future[Encoded]]] = deque()
        shipping: deque[Future[None]] = deque()
        laid_out = list(manifest.shards)
        key = manifest.key  # (it hashes the manifest: once)
        parts: list[bytes | memoryview] = []
        size = cut = 0

        def flush() -> None:
            nonlocal parts, size, cut
            if not parts:
                return
            data = self._memory.join(parts, size)
            if laid_out:
                entry = laid_out[cut]
                assert entry.bytes == len(data), f"shard {cut} was laid out as {entry.bytes} bytes, cut {len(data)}"
            else:
                entry = ShardEntry(shard_key(key, cut), len(data))
                manifest.shards.append(entry)
            cut += 1
            if keep is not None:
                keep(entry.key, data)
            else:
                while len(shipping) >= self.parallel:
                    shipping.popleft().result()
                shipping.append(pool.submit(self._put, entry, data))
            parts, size = [], 0

        def take(c: ChunkEntry, fut: Future[Encoded]) -> None:
            nonlocal size
            enc = fut.result()
            if self._starts_shard(size, len(enc.data)):
                flush()
            c.encoding, c.changed = enc.encoding, enc.changed
            if enc.data:  # (a 'same' chunk has no place: shard 0, offset 0, length 0)
                c.shard, c.offset, c.length = cut, size, len(enc.data)
                parts.append(enc.data)
                size += len(enc.data)

        for c in manifest.chunks:
            end = c.start + c.count
            old = prev[c.tensor][c.start:end] if prev is not None else None
            new = bits[c.tensor][c.start:end]
            if new.numel() * new.element_size() < INLINE_BYTES:  # a thread hand-off costs more than the work
                done: Future[Encoded] = Future()
                done.set_result(encode(new, old))
                jobs.append((c, done))
            else:
                jobs.append((c, pool.submit(encode, new, old)))
            if len(jobs) >= self.parallel:
                take(*jobs.popleft())
        while jobs:
            take(*jobs.popleft())
        flush()
        for s in shipping:
            s.result()

    # -- what may go -------------------------------------------------------------------------------
    def retain(self, newest: int) -> list[str]:
        """Delete the pending markers up to `newest` (its own, and any a dead learner left) and the versions no
        reader needs: everything older than the newest snapshot that can still rebuild each of the last
        `keep_last` versions (0: keep every version). Returns the deleted folders."""
        keys = self.store.list(PREFIX)
        for key in keys:
            if (marked := parse_pending(key)) is not None and marked <= newest:
                self.store.delete(key)
        if self.keep_last == 0:
            return []
        listed = sorted((v for k in keys if (v := parse_key(k))), key=lambda v: v.version)
        keep_from = newest - self.keep_last + 1
        anchors = [v for v in listed if v.kind == "snapshot" and v.version <= keep_from]
        if not anchors:
            return []
        anchor = anchors[-1]
        doomed = [v for v in listed if v.version < anchor.version]
        for v in doomed:
            self._delete_version(v)
        return [v.folder for v in doomed]

    def _delete_version(self, v: Listed) -> None:
        self.store.delete(v.key)  # the manifest first: a reader never finds a manifest without its shards
        for key in self.store.list(v.folder):
            self.store.delete(key)


def publish_weights(store: Store, version: int, state_dict: dict[str, torch.Tensor],
                    keep_last: int = 3) -> PolicyVersion:
    """Publish one version as a snapshot in each tensor's own dtype (a publisher of one version: tools and
    tests; the learner keeps a `WeightPublisher`, so its versions can be deltas)."""
    return WeightPublisher(store, keep_last=keep_last).publish(version, state_dict)

