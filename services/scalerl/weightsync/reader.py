"""The generator's side: build an announced version from the store into a resident copy, shard by shard.

`WeightReader.fetch(pv)` returns the weights of `pv` (a dict of CPU tensors in the published dtypes, tied
names sharing one tensor) built in the reader's resident copy (`shadow`):

- the version's manifest names its base; the reader walks the bases back to the version it holds (then
  it applies only the deltas after it) or to a snapshot (a new or restarted generator, one that fell
  behind or lost its copy): snapshot + deltas;
- each manifest's shards are taken one at a time, each downloaded as up to `parallel` ranged reads (of at
  least RANGE_MIN bytes) into one buffer, and its chunks checked and decoded in place into the copy by
  `parallel` threads (`_chunk`): beside the copy, one shard's bytes (and the decode buffers of the chunks in
  flight) are in memory;
- every chunk's BLAKE3 is checked, a raw chunk's before it is copied, any other's after it is decoded (the
  chunks cover every tensor and tile every shard): the copy is bit-identical to the learner's weights in
  the published dtype, or the fetch fails naming the shard and chunk, and a chunk that does not check
  leaves the copy as it was.

A version can also arrive by broadcast (`weightsync.broadcast`): `offer_shards` puts pushed objects in an
inbox (`weightsync.inbox`) as they come, and `push_ended` says that the push is over. A fetch takes the
version's manifest from there when its digest is the announced one (`parse_manifest` checks the rest), and
each shard as it arrives, waiting for those on their way (a snapshot's manifest comes first: it is built
while its shards stream in); a shard whose chunks do not check, or that the push did not bring, is
downloaded instead, once the upload has ended. The learner announces a pushed version before its upload
ends, so a reader that was not pushed it waits for the manifest to appear in the store; every such wait
lasts at most `manifest_wait_s`.

When the version cannot be built (a shard or manifest of its chain is gone or corrupt), `fetch` raises
`WeightsUnavailable` after asking the learner for a snapshot (`request_snapshot`), and the copy is marked
unusable; the caller keeps serving the weights it has and builds the next announcement, which will be
a snapshot. Only versions this job published are fetched (`foreign_weights`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from scalerl.messages import PolicyVersion
from scalerl.store.base import Store, StoreError
from scalerl.weightsync.codec import CodecError, bits_digest, bits_of, decode_into, digest
from scalerl.weightsync.inbox import Inbox
from scalerl.weightsync.manifest import (
    DTYPES,
    KINDS,
    PREFIX,
    REQUESTS,
    Manifest,
    ManifestError,
    ShardEntry,
    manifest_key,
    parse_key,
    parse_manifest,
    parse_pending,
)
from scalerl.weightsync.pool import in_pool

log = logging.getLogger(__name__)
INBOX_VERSIONS = 2
"""Versions whose broadcast shards a reader keeps until a fetch uses them (older ones are dropped)."""
WAIT_POLL_S = 0.1
"""How often a reader waiting for a manifest (`manifest_wait_s`) looks at the store (seconds)."""
RANGE_MIN = 4 * 1024**2
"""A shard is downloaded as ranged reads of at least this many bytes (a smaller one in one read)."""
_CHECKSUM_HEX = frozenset("0123456789abcdef")


class ForeignWeights(StoreError):
    """An announcement that does not name weights this job published (`foreign_weights`)."""


class WeightsUnavailable(StoreError):
    """The announced version cannot be built from the store now (a snapshot has been asked for)."""


def foreign_weights(store: Store, pv: PolicyVersion) -> str | None:
    """Why `pv` does not name weights this job published (None: it does). A version is published under
    exactly `manifest_key(version, checksum, kind)` in the job's store, so any other URI (another bucket or
    prefix, a path with `..`, another object of the store) is not an announcement of ours."""
    if len(pv.checksum) != 64 or not set(pv.checksum) <= _CHECKSUM_HEX:
        return f"checksum: expected 64 lowercase hex digits (sha256), got {pv.checksum[:80]!r}"
    allowed = [store.uri(manifest_key(pv.version, pv.checksum, kind)) for kind in KINDS]
    if pv.uri not in allowed:
        return f"uri: {pv.uri[:200]!r} is not where version {pv.version} with this checksum is published ({allowed[0]})"
    return None


def highest_version(store: Store) -> int | None:
    """The highest policy version whose manifest or pending marker was ever written (None: none). Either is
    written before a version is announced and the newest are never deleted, so this bounds every announced
    version."""
    keys = store.list(PREFIX)
    published = [v.version for k in keys if (v := parse_key(k))]
    return max(published + [n for k in keys if (n := parse_pending(k)) is not None], default=None)


@dataclass(slots=True)
class FetchStats:
    """What the last `fetch` did: versions applied (snapshots among them), bytes downloaded, bytes taken
    from the broadcast inbox instead, seconds."""

    applied: int = 0
    snapshots: int = 0
    bytes: int = 0
    pushed: int = 0
    seconds: float = 0.0


class WeightReader:
    """Builds announced versions from `store` into a resident copy (module docstring). `reader_id` names
    this reader in its snapshot requests (default: host and pid). `manifest_wait_s`: how long a fetch waits
    for an announced manifest to appear in the store (0: not at all; the broadcast path announces before
    its upload ends)."""

    def __init__(self, store: Store, *, parallel: int = 4, reader_id: str | None = None,
                 manifest_wait_s: float = 0.0) -> None:
        if parallel < 1 or manifest_wait_s < 0:
            raise ValueError("parallel must be >= 1 and manifest_wait_s >= 0")
        self.store = store
        self.parallel = parallel
        self.manifest_wait_s = manifest_wait_s
        self.reader_id = reader_id or f"{socket.gethostname()}-{os.getpid()}"
        self.shadow: dict[str, torch.Tensor] = {}  # the resident copy (stored names only)
        self.held: Manifest | None = None  # the version the copy holds (None: nothing usable)
        self.stats = FetchStats()
        self.bytes_total = 0  # shard bytes downloaded over every fetch
        self.unbuildable = 0  # announcements that could not be built
        self.last_seconds = 0.0  # the last successful build
        self.bytes_broadcast = 0  # shard bytes taken from the broadcast inbox instead of downloaded
        self.inbox = Inbox(INBOX_VERSIONS)  # what came by broadcast (`offer_shards`, `push_ended`)
        self._via_push: set[str] = set()  # manifests taken from the inbox whose upload may not have ended

    # -- public ------------------------------------------------------------------------------------
    def fetch(self, pv: PolicyVersion) -> dict[str, torch.Tensor]:
        """The weights of `pv` (see the module docstring); ForeignWeights before anything is fetched for an
        announcement that is not ours, WeightsUnavailable when it cannot be built now."""
        if (why := foreign_weights(self.store, pv)) is not None:
            raise ForeignWeights(f"not this job's weights: {why}")
        t0 = time.perf_counter()
        self.stats = FetchStats()
        if self.held is None or self.held.key != self.store.key_of(pv.uri):
            try:
                for m in self._chain(pv):
                    self._apply(m)
            except (StoreError, ManifestError, CodecError) as exc:
                self.held = None
                self.unbuildable += 1
                self.request_snapshot(f"cannot build version {pv.version}: {exc}")
                raise WeightsUnavailable(f"version {pv.version} cannot be built from the store: {exc}; "
                                         "asked the learner for a snapshot") from exc
            finally:
                self._via_push.clear()
        self.stats.seconds = self.last_seconds = time.perf_counter() - t0
        self.bytes_total += self.stats.bytes
        self.bytes_broadcast += self.stats.pushed
        return self.state_dict()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The held version's tensors, tied names included (the same tensor objects as the copy)."""
        if self.held is None:
            raise WeightsUnavailable("no version is held")
        out = {n: self.shadow[n] for n in (t.name for t in self.held.tensors)}
        out.update({alias: self.shadow[name] for alias, name in self.held.aliases.items()})
        return out

    def offer_shards(self, version: int, shards: dict[str, bytes | memoryview]) -> None:
        """Objects of `version` (manifest, shards) received by broadcast, used by the fetch that needs them: it
        waits for those still on their way until `push_ended(version)` (`weightsync.inbox`)."""
        self.inbox.put(version, shards)

    def push_ended(self, version: int) -> None:
        """The broadcast of `version` has ended (whole or not): what did not come is downloaded."""
        self.inbox.end(version)

    def _shard_bytes(self, m: Manifest, entry: ShardEntry, buf: _Scratch,
                     io: ThreadPoolExecutor) -> tuple[memoryview, bool]:
        """(bytes, from the inbox?) of one shard: the broadcast's (waited for while its push is under way),
        else downloaded into `buf`. Unchecked: its chunks are (`_apply`)."""
        if (pushed := self.inbox.take(entry.key, self.manifest_wait_s)) is not None:
            if len(pushed) == entry.bytes:
                return memoryview(pushed), True
            log.warning("shard %s received by broadcast has %d bytes, not %d: downloading it", entry.key,
                        len(pushed), entry.bytes)
        return self._download(m, entry, buf, io), False

    def _download(self, m: Manifest, entry: ShardEntry, buf: _Scratch, io: ThreadPoolExecutor) -> memoryview:
        """One shard read into `buf` as up to `parallel` ranged reads; for a version whose manifest came by
        broadcast, once its upload has ended (its manifest, written last, is in the store)."""
        if m.key in self._via_push:
            self._await_store(m.key, time.monotonic() + self.manifest_wait_s)
            self._via_push.discard(m.key)
        out = buf.get()[:entry.bytes]
        step = max(RANGE_MIN, -(-entry.bytes // self.parallel))
        list(io.map(lambda a: self.store.read_into(entry.key, a, out[a:a + step]), range(0, entry.bytes, step)))
        return out

    def _await_store(self, key: str, deadline: float) -> None:
        """Wait until `key` is in the store or `deadline` (monotonic) passes."""
        while self.manifest_wait_s and not self.store.exists(key) and time.monotonic() < deadline:
            time.sleep(WAIT_POLL_S)

    def request_snapshot(self, reason: str) -> None:
        """Ask the learner to publish its next version as a snapshot (an object under policy/requests/)."""
        body = json.dumps({"reader": self.reader_id, "reason": reason[:500], "time": time.time()})
        try:
            self.store.put_bytes(f"{REQUESTS}{self.reader_id}", body.encode())
        except StoreError as exc:  # the announcement after the next snapshot still comes
            log.warning("could not ask for a weights snapshot: %s", exc)

    # -- the chain ---------------------------------------------------------------------------------
    def _manifest(self, key: str, digest: str) -> Manifest:
        """The manifest `key` whose state digest is `digest`: pushed by broadcast, else from the store (waited
        for, in either, up to `manifest_wait_s`)."""
        deadline = time.monotonic() + self.manifest_wait_s
        while self.manifest_wait_s and not self.inbox.has(key) and time.monotonic() < deadline:
            if self.store.exists(key):
                break
            self.inbox.wait(key, WAIT_POLL_S)  # (wakes as soon as it is pushed)
        if (pushed := self.inbox.take(key)) is not None:
            try:
                m = _announced(parse_manifest(bytes(pushed), key), digest)
                self._via_push.add(key)
                return m
            except ManifestError as exc:
                log.warning("%s received by broadcast does not match its announcement (%s): reading it from the "
                            "store", key, exc)
                self._await_store(key, deadline)
        return _announced(parse_manifest(self.store.get_bytes(key), key), digest)

    def _chain(self, pv: PolicyVersion) -> list[Manifest]:
        """Manifests to apply, oldest first: back from `pv`'s to the held version (excluded) or a snapshot."""
        chain = [self._manifest(self.store.key_of(pv.uri), pv.checksum)]
        while chain[-1].kind == "delta":
            base, base_digest = chain[-1].base, chain[-1].base_digest
            assert base is not None and base_digest is not None  # parse_manifest checks it
            if self.held is not None and base == self.held.key:
                break
            chain.append(self._manifest(base, base_digest))
            if len(chain) > 10_000:
                raise ManifestError(f"{chain[0].key}: a chain of more than 10000 deltas")
        return chain[::-1]

    def _apply(self, m: Manifest) -> None:
        """Apply one version to the copy (a snapshot replaces it; a delta needs its base held). One shard at a
        time (pushed, else downloaded); its chunks decoded and BLAKE3-checked in parallel (`_chunk`). A pushed
        shard whose chunks do not check is downloaded for them; a downloaded one is corrupt (StoreError)."""
        key = m.key
        if m.kind == "delta" and (self.held is None or self.held.key != m.base):
            raise ManifestError(f"{key}: its base {m.base} is not the version held")
        self.held = None  # from here until the end the copy is half-built
        if m.kind == "snapshot":
            self._allocate(m)
        views = [bits_of(self.shadow[t.name]) for t in m.tensors]
        by_shard: dict[int, list[int]] = {}
        for i, c in enumerate(m.chunks):
            by_shard.setdefault(-1 if c.encoding == "same" else c.shard, []).append(i)

        with ThreadPoolExecutor(self.parallel, thread_name_prefix="weights-decode") as cpu, \
                ThreadPoolExecutor(self.parallel, thread_name_prefix="weights-fetch") as io:
            def apply(indices: list[int], data: memoryview) -> list[tuple[int, str]]:
                """(chunk, why) of the chunks that did not check (each left as it was)."""
                got = in_pool(cpu, functools.partial(_chunk, m, key, views, data=data), indices,
                              lambda i: m.chunks[i].count * views[m.chunks[i].tensor].element_size())
                return [(i, why) for i, why in zip(indices, got, strict=True) if why is not None]

            size = max((m.shards[si].bytes for si in by_shard if si >= 0), default=0)
            buf = _Scratch(size)
            for si in sorted(by_shard):  # one shard at a time: its bytes are all that is held beside the copy
                if si < 0:
                    if failed := apply(by_shard[si], memoryview(b"")):
                        raise CodecError(failed[0][1])
                    continue
                entry = m.shards[si]
                data, pushed = self._shard_bytes(m, entry, buf, io)
                try:
                    failed = apply(by_shard[si], data)
                finally:
                    if pushed:  # its buffer may take the next object the receiver gets
                        self.inbox.release(entry.key)
                if failed and pushed:
                    log.warning("shard %s received by broadcast does not match its manifest (%s): downloading it",
                                entry.key, failed[0][1])
                    data, pushed = self._download(m, entry, buf, io), False
                    failed = apply([i for i, _ in failed], data)
                if failed:
                    raise StoreError(f"shard {entry.key} is corrupt: {failed[0][1]}")
                self.stats.bytes += 0 if pushed else len(data)
                self.stats.pushed += len(data) if pushed else 0
        self.stats.applied += 1
        self.stats.snapshots += m.kind == "snapshot"
        self.held = m

    def _allocate(self, m: Manifest) -> None:
        """Tensors for a snapshot: the copy's own where name, dtype and shape match, new ones otherwise."""
        fresh = {}
        for t in m.tensors:
            have = self.shadow.get(t.name)
            if have is not None and have.dtype == DTYPES[t.dtype] and list(have.shape) == t.shape:
                fresh[t.name] = have
            else:
                fresh[t.name] = torch.empty(t.shape, dtype=DTYPES[t.dtype])
        self.shadow = fresh


class _Scratch:
    """The download buffer of one version's build (the size of its largest shard), made on first use: a
    version that came whole by broadcast needs none."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._buf: memoryview | None = None

    def get(self) -> memoryview:
        if self._buf is None:
            self._buf = memoryview(bytearray(self.size))
        return self._buf


def _chunk(m: Manifest, key: str, views: list[torch.Tensor], i: int, data: memoryview) -> str | None:
    """Apply chunk `i` of `m` (whose key is `key`: `m.key` hashes the manifest) from its shard's `data` to the
    copy (`views`: each tensor's bits) when it checks (None); else say why, with the copy's range as it was: a
    raw chunk is checked before it is copied, any other after it is decoded (an XOR delta that does not check
    is applied again, which undoes it)."""
    c = m.chunks[i]
    what = f"{key} chunk {i} ({m.tensors[c.tensor].name}[{c.start}:{c.start + c.count}])"
    view = views[c.tensor][c.start:c.start + c.count]
    piece = data[c.offset:c.offset + c.length]
    try:
        if c.encoding == "raw" and len(piece) == view.numel() * view.element_size():
            if (got := digest(piece)) != c.blake3:
                return f"{what}: BLAKE3 {got[:16]}…, the learner's is {c.blake3[:16]}…"
            decode_into(view, c.encoding, piece, c.changed, what)
            return None
        decode_into(view, c.encoding, piece, c.changed, what)  # (raises before it writes anything)
    except CodecError as exc:
        return str(exc)
    if (got := bits_digest(view)) != c.blake3:
        if c.encoding == "xor":
            decode_into(view, c.encoding, piece, c.changed, what)
        return f"{what}: decodes to BLAKE3 {got[:16]}…, the learner's is {c.blake3[:16]}…"
    return None


def _announced(m: Manifest, digest: str) -> Manifest:
    """`m` when its state digest is the announced `digest` (the key names only its first 16 digits)."""
    if m.digest != digest:
        raise ManifestError(f"{m.key}: its tensors hash to {m.digest[:16]}…, the announcement says {digest[:16]}…")
    return m


def load_weights(store: Store, pv: PolicyVersion) -> dict[str, torch.Tensor]:
    """The weights of one announced version, built by a reader of its own (tools and tests)."""
    return WeightReader(store).fetch(pv)
