"""The generator's side: build an announced version from the store into a resident copy, shard by shard.

`WeightReader.fetch(pv)` returns the weights of `pv` (a dict of CPU tensors in the published dtypes, tied
names sharing one tensor) built in the reader's resident copy (`shadow`):

- the version's manifest names its base; the reader walks the bases back to the version it holds (then
  it applies only the deltas after it) or to a snapshot (a new or restarted generator, one that fell
  behind or lost its copy): snapshot + deltas;
- each manifest's shards are taken one at a time, each downloaded as up to `parallel` ranged reads (of at
  least RANGE_MIN bytes) into one buffer, checked against the BLAKE3 its manifest gives (a corrupt or
  missing shard is an error naming it) and decoded in place into the copy by `parallel` threads: beside
  the copy, one shard's bytes (and the decode buffers of the chunks in flight) are in memory;
- every chunk's BLAKE3 is checked as it is decoded (the chunks cover every tensor): the copy is
  bit-identical to the learner's weights in the published dtype, or the fetch fails.

A version can also arrive by broadcast (`weightsync.broadcast`): `offer_shards` puts pushed objects in an
inbox as they come, each shard hashed (BLAKE3) in the background meanwhile. A fetch takes the version's manifest
from there when its digest is the announced one (`parse_manifest` checks the rest), and each shard when its
BLAKE3 is the manifest's (one that is not is downloaded instead). The learner announces a pushed version
before its upload ends, so a reader that was not pushed it waits for the manifest to appear in the store,
for at most `manifest_wait_s`.

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
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from scalerl.messages import PolicyVersion
from scalerl.store.base import Store, StoreError
from scalerl.weightsync.codec import CodecError, bits_digest, bits_of, decode_into, digest
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
        # key -> (bytes received by broadcast, their BLAKE3 being computed; None for a manifest) (`offer_shards`)
        self._inbox: dict[str, tuple[bytes | memoryview, Future[str] | None]] = {}
        self._inbox_versions: dict[int, list[str]] = {}  # version -> its keys, for the last INBOX_VERSIONS
        self._inbox_lock = threading.Lock()
        self._hasher: ThreadPoolExecutor | None = None  # started by the first offer

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
        """Objects of `version` (manifest, shards) received by broadcast, used by the fetch that needs them
        (kept for the last INBOX_VERSIONS versions offered); hashed in the background from now on."""
        with self._inbox_lock:
            if self._hasher is None:
                self._hasher = ThreadPoolExecutor(1, thread_name_prefix="weights-inbox-hash")
            for key, data in shards.items():  # (a manifest is checked by its state digest: not hashed)
                self._inbox[key] = (data, None if parse_key(key) else self._hasher.submit(digest, data))
                self._inbox_versions.setdefault(version, []).append(key)
            for old in sorted(self._inbox_versions)[:-INBOX_VERSIONS]:
                for key in self._inbox_versions.pop(old):
                    self._inbox.pop(key, None)

    def _pushed(self, key: str) -> tuple[bytes | memoryview, str] | None:
        """(bytes, BLAKE3; "" for a manifest) of `key` received by broadcast, taken out of the inbox (None: not
        pushed)."""
        with self._inbox_lock:
            got = self._inbox.pop(key, None)
        return None if got is None else (got[0], got[1].result() if got[1] is not None else "")

    def _shard_bytes(self, entry: ShardEntry, buf: memoryview, io: ThreadPoolExecutor) -> tuple[memoryview, bool]:
        """(bytes, from the inbox?) of one shard, checked against its manifest's BLAKE3: the broadcast's, else
        downloaded into `buf` as up to `parallel` ranged reads."""
        if (pushed := self._pushed(entry.key)) is not None:
            data, got = pushed
            if len(data) == entry.bytes and got == entry.blake3:
                return memoryview(data), True
            log.warning("shard %s received by broadcast does not match its manifest: downloading it", entry.key)
        out = buf[:entry.bytes]
        step = max(RANGE_MIN, -(-entry.bytes // self.parallel))
        list(io.map(lambda a: self.store.read_into(entry.key, a, out[a:a + step]), range(0, entry.bytes, step)))
        if (got := digest(out)) != entry.blake3:
            raise StoreError(f"shard {entry.key} is corrupt: blake3 {got[:16]}…, expected {entry.bytes} bytes, "
                             f"{entry.blake3[:16]}…")
        return out, False

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
        for up to `manifest_wait_s`)."""
        if (pushed := self._pushed(key)) is not None:
            try:
                return _announced(parse_manifest(bytes(pushed[0]), key), digest)
            except ManifestError as exc:
                log.warning("%s received by broadcast does not match its announcement (%s): reading it from the "
                            "store", key, exc)
        deadline = time.monotonic() + self.manifest_wait_s
        while self.manifest_wait_s and not self.store.exists(key) and time.monotonic() < deadline:
            time.sleep(WAIT_POLL_S)
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
        time, downloaded as `parallel` ranged reads; its chunks decoded and BLAKE3-checked in parallel."""
        if m.kind == "delta" and (self.held is None or self.held.key != m.base):
            raise ManifestError(f"{m.key}: its base {m.base} is not the version held")
        self.held = None  # from here until the end the copy is half-built
        if m.kind == "snapshot":
            self._allocate(m)
        views = [bits_of(self.shadow[t.name]) for t in m.tensors]
        by_shard: dict[int, list[int]] = {}
        for i, c in enumerate(m.chunks):
            by_shard.setdefault(-1 if c.encoding == "same" else c.shard, []).append(i)

        def chunk(i: int, data: memoryview) -> None:
            c = m.chunks[i]
            what = f"{m.key} chunk {i} ({m.tensors[c.tensor].name}[{c.start}:{c.start + c.count}])"
            view = views[c.tensor][c.start:c.start + c.count]
            decode_into(view, c.encoding, data[c.offset:c.offset + c.length], c.changed, what)
            if (got := bits_digest(view)) != c.blake3:
                raise CodecError(f"{what}: decodes to BLAKE3 {got[:16]}…, the learner's is {c.blake3[:16]}…")

        with ThreadPoolExecutor(self.parallel, thread_name_prefix="weights-decode") as cpu, \
                ThreadPoolExecutor(self.parallel, thread_name_prefix="weights-fetch") as io:
            buf = memoryview(bytearray(max((m.shards[si].bytes for si in by_shard if si >= 0), default=0)))
            for si in sorted(by_shard):  # one shard at a time: its bytes are all that is held beside the copy
                data, pushed = self._shard_bytes(m.shards[si], buf, io) if si >= 0 else (memoryview(b""), False)
                in_pool(cpu, functools.partial(chunk, data=data), by_shard[si],
                        lambda i: m.chunks[i].count * views[m.chunks[i].tensor].element_size())
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


def _announced(m: Manifest, digest: str) -> Manifest:
    """`m` when its state digest is the announced `digest` (the key names only its first 16 digits)."""
    if m.digest != digest:
        raise ManifestError(f"{m.key}: its tensors hash to {m.digest[:16]}…, the announcement says {digest[:16]}…")
    return m


def load_weights(store: Store, pv: PolicyVersion) -> dict[str, torch.Tensor]:
    """The weights of one announced version, built by a reader of its own (tools and tests)."""
    return WeightReader(store).fetch(pv)
