"""The generator's side: build an announced version from the store into a resident copy, shard by shard.

`WeightReader.fetch(pv)` returns the weights of `pv` (a dict of CPU tensors in the published dtypes, tied
names sharing one tensor) built in the reader's resident copy (`shadow`):

- the version's manifest names its base; the reader walks the bases back to the version it holds (then
  it applies only the deltas after it) or to a snapshot (a new or restarted generator, one that fell
  behind or lost its copy): snapshot + deltas;
- each manifest's shards are taken one at a time, each downloaded as up to `parallel` ranged reads (of at
  least RANGE_MIN bytes) into one buffer, checked against the SHA-256 its manifest gives (a corrupt or
  missing shard is an error naming it) and decoded in place into the copy by `parallel` threads: beside
  the copy, one shard's bytes (and the decode buffers of the chunks in flight) are in memory;
- every chunk's CRC-32 is checked as it is decoded (the chunks cover every tensor): the copy is
  bit-identical to the learner's weights in the published dtype, or the fetch fails.

Shards can also arrive by broadcast (`weightsync.broadcast`): `offer_shards` puts a version's shard bytes
in an inbox, and a fetch takes a shard from there instead of downloading it, after the same SHA-256 check
against the manifest read from the store (a shard that fails it is downloaded instead).

When the version cannot be built (a shard or manifest of its chain is gone or corrupt), `fetch` raises
`WeightsUnavailable` after asking the learner for a snapshot (`request_snapshot`), and the copy is marked
unusable; the caller keeps serving the weights it has and builds the next announcement, which will be
a snapshot. Only versions this job published are fetched (`foreign_weights`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import socket
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from scalerl.messages import PolicyVersion
from scalerl.store.base import Store, StoreError
from scalerl.weightsync.codec import CodecError, bits_of, crc32, decode_into
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
)
from scalerl.weightsync.pool import in_pool

log = logging.getLogger(__name__)
INBOX_VERSIONS = 2
"""Versions whose broadcast shards a reader keeps until a fetch uses them (older ones are dropped)."""
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
    """The highest policy version whose manifest was ever written (None: none). Weights are written before
    they are announced and the newest are never deleted, so this bounds every announced version."""
    return max((v.version for k in store.list(PREFIX) if (v := parse_key(k))), default=None)


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
    this reader in its snapshot requests (default: host and pid)."""

    def __init__(self, store: Store, *, parallel: int = 4, reader_id: str | None = None) -> None:
        if parallel < 1:
            raise ValueError("parallel must be >= 1")
        self.store = store
        self.parallel = parallel
        self.reader_id = reader_id or f"{socket.gethostname()}-{os.getpid()}"
        self.shadow: dict[str, torch.Tensor] = {}  # the resident copy (stored names only)
        self.held: Manifest | None = None  # the version the copy holds (None: nothing usable)
        self.stats = FetchStats()
        self.bytes_total = 0  # shard bytes downloaded over every fetch
        self.unbuildable = 0  # announcements that could not be built
        self.last_seconds = 0.0  # the last successful build
        self.bytes_broadcast = 0  # shard bytes taken from the broadcast inbox instead of downloaded
        self._inbox: dict[str, bytes] = {}  # shard key -> bytes received by broadcast (`offer_shards`)
        self._inbox_versions: deque[list[str]] = deque()  # the keys of the last INBOX_VERSIONS offers
        self._inbox_lock = threading.Lock()

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
                for m in self._chain(self.store.key_of(pv.uri)):
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

    def offer_shards(self, version: int, shards: dict[str, bytes]) -> None:
        """Shard bytes of `version` received by broadcast, used by the fetch that needs them (kept for the
        last INBOX_VERSIONS offers)."""
        with self._inbox_lock:
            self._inbox.update(shards)
            self._inbox_versions.append(list(shards))
            while len(self._inbox_versions) > INBOX_VERSIONS:
                for key in self._inbox_versions.popleft():
                    self._inbox.pop(key, None)

    def _shard_bytes(self, entry: ShardEntry, buf: memoryview, io: ThreadPoolExecutor) -> tuple[memoryview, bool]:
        """(bytes, from the inbox?) of one shard, checked against its manifest's SHA-256: the broadcast's, else
        downloaded into `buf` as up to `parallel` ranged reads."""
        with self._inbox_lock:
            pushed = self._inbox.pop(entry.key, None)
        if pushed is not None:
            if len(pushed) == entry.bytes and hashlib.sha256(pushed).hexdigest() == entry.sha256:
                return memoryview(pushed), True
            log.warning("shard %s received by broadcast does not match its manifest: downloading it", entry.key)
        out = buf[:entry.bytes]
        step = max(RANGE_MIN, -(-entry.bytes // self.parallel))
        list(io.map(lambda a: self.store.read_into(entry.key, a, out[a:a + step]), range(0, entry.bytes, step)))
        if (digest := hashlib.sha256(out).hexdigest()) != entry.sha256:
            raise StoreError(f"shard {entry.key} is corrupt: sha256 {digest[:16]}…, expected {entry.bytes} bytes, "
                             f"{entry.sha256[:16]}…")
        return out, False

    def request_snapshot(self, reason: str) -> None:
        """Ask the learner to publish its next version as a snapshot (an object under policy/requests/)."""
        body = json.dumps({"reader": self.reader_id, "reason": reason[:500], "time": time.time()})
        try:
            self.store.put_bytes(f"{REQUESTS}{self.reader_id}", body.encode())
        except StoreError as exc:  # the announcement after the next snapshot still comes
            log.warning("could not ask for a weights snapshot: %s", exc)

    # -- the chain ---------------------------------------------------------------------------------
    def _manifest(self, key: str) -> Manifest:
        return parse_manifest(self.store.get_bytes(key), key)

    def _chain(self, key: str) -> list[Manifest]:
        """Manifests to apply, oldest first: back from `key` to the held version (excluded) or a snapshot."""
        chain = [self._manifest(key)]
        while chain[-1].kind == "delta":
            base = chain[-1].base
            assert base is not None  # parse_manifest checks it
            if self.held is not None and base == self.held.key:
                break
            chain.append(self._manifest(base))
            if len(chain) > 10_000:
                raise ManifestError(f"{key}: a chain of more than 10000 deltas")
        return chain[::-1]

    def _apply(self, m: Manifest) -> None:
        """Apply one version to the copy (a snapshot replaces it; a delta needs its base held). One shard at a
        time, downloaded as `parallel` ranged reads; its chunks decoded and CRC-32-checked in parallel."""
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
            if crc32(view) != c.crc32:
                raise CodecError(f"{what}: decodes to CRC-32 {crc32(view):08x}, the learner's is {c.crc32:08x}")

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


def load_weights(store: Store, pv: PolicyVersion) -> dict[str, torch.Tensor]:
    """The weights of one announced version, built by a reader of its own (tools and tests)."""
    return WeightReader(store).fetch(pv)
