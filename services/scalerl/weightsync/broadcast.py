"""The broadcast path: a version pushed from the learner to the generators over torch.distributed.

The learner encodes a version (`WeightPublisher.publish(before_upload=...)`), broadcasts its manifest and
shards (`BroadcastHub.send`) to the generators that have joined its group, announces it on the bus, and
only then uploads it to the store, which stays the fallback: the generators in the group need not wait
for it. Each generator's receiver (`BroadcastReceiver`) hands the objects to its `WeightReader` as they
arrive, which builds from them in place of downloads: the manifest when its digest is the one announced on
the bus, each shard's chunks when they hash (BLAKE3) to what the manifest names, so bytes that came by
broadcast are trusted no more than a download (a wrong or missing shard is fetched from the store). A
snapshot's manifest goes first and the learner announces the version once it is out
(`BroadcastHub.send_and_announce`), so the generators build it while its shards stream in. A generator
outside the group, new, slow or just restarted, pulls from the store, waiting for the upload in progress.

Never a hang (each wait is bounded by `timeout_s`, the group's gloo timeout included):

- The learner serves a rendezvous (`torch.distributed.TCPStore`) on `port`. A group has a generation g:
  generators join it (`g<g>/joined` gives each a rank 1..n, `g<g>/name/<rank>` its id); the learner's
  own thread freezes it (`g<g>/world`) once `generators` have joined, or, with `generators` 0, once no one
  has joined for `SETTLE_S`, and all build one gloo (CPU) or NCCL (GPU) group of 1 + n ranks. A
  generator that comes later waits for the next generation, which the learner starts between two sends.
- Each send: the learner posts the version's number (`g<g>/send/<seq>`), waits until every member says
  it is ready, says go, and streams the version's objects as the publisher makes them: each is a small
  broadcast of its size and key (`META_BYTES`) followed by its bytes, and a size of -1 ends the version;
  then it waits until every member says it is done.
  A member that misses a step within `timeout_s` is named (log, `stuck` counts by generator id, the
  learner's metrics), the generation is retired (`generation` moves on) and the version reaches everyone
  through the store; the members rejoin and the group is rebuilt from whoever comes.
- A receiver that loses its group (the learner restarted, a peer died, a timeout) drops it and joins
  again; what it missed, its reader builds from the store.

The rendezvous port is unauthenticated (torch's): bytes received are only used after the checks above
against the announcement (the bus authenticates the learner), and a party that joins and stalls costs one
timeout, then the store path.
Keep the port inside the job's network policy.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
from torch._C._distributed_c10d import TCPStore

from scalerl.weightsync.manifest import parse_key
from scalerl.weightsync.wire import CLOSE_WAIT_S as CLOSE_WAIT_S
from scalerl.weightsync.wire import (
    META_BYTES,
    POLL_S,
    Rendezvous,
    SourceFailed,
    device_for,
    frame,
    join_thread,
    member_group,
    pull,
    unframe,
)
from scalerl.weightsync.wire import BroadcastSettings as BroadcastSettings
from scalerl.weightsync.wire import stranded_threads as stranded_threads

log = logging.getLogger(__name__)

SETTLE_S = 1.0
"""With `generators` 0: a generation is frozen once no generator has joined it for this long (seconds)."""
CONNECT_SLICE_S = 0.5
"""A receiver tries to reach the learner's rendezvous for at most this long at a time (seconds), so that
`close` finds it between tries rather than inside torch's native connect loop."""

@dataclass
class _Formed:
    generation: int
    group: object
    names: dict[int, str]  # rank -> generator id
    seq: int = 0


class BroadcastHub:
    """The learner's end: serves the rendezvous, keeps a group of the generators that joined, and sends each
    version's shards to it (`send`). Counters for the metrics: `sent`, `skipped`, `failed`, `stuck`."""

    def __init__(self, settings: BroadcastSettings) -> None:
        self.settings = settings
        # (the server listens on every interface; `address` is where the generators reach it)
        self.server = TCPStore("127.0.0.1", settings.port, None, True,
                               datetime.timedelta(seconds=settings.timeout_s), wait_for_workers=False)
        self.rv = Rendezvous(self.server)  # used under `_lock` only (sends, retiring)
        self._lock = threading.Lock()  # held by a send, and by the former while it swaps groups
        self._formed: _Formed | None = None
        self._closed = threading.Event()
        self.sent = 0  # versions every member of the group received
        self.skipped = 0  # versions sent through the store only (no group formed yet)
        self.failed = 0  # sends a member did not finish in time (the generation was retired)
        self.stuck: Counter[str] = Counter()  # generator id -> sends it held up
        self.members = 0  # generators in the current group
        self._start(1)
        self._thread = threading.Thread(target=self._form, name="weights-broadcast-hub", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self.server.port)

    def _start(self, generation: int) -> None:
        self.server.set("generation", str(generation))

    # -- forming groups ------------------------------------------------------------------------------
    def _form(self) -> None:
        # the forming thread's own connection to the rendezvous (one per thread)
        rv = Rendezvous(TCPStore("127.0.0.1", self.port, None, False,
                                  datetime.timedelta(seconds=self.settings.timeout_s)))
        while not self._closed.is_set():
            try:
                self._form_once(rv)
            except Exception:  # the thread must go on: the next generation is another try
                log.exception("weights broadcast: forming a group failed")
                with self._lock:
                    self._retire("forming it failed")
                self._closed.wait(1.0)

    def _form_once(self, rv: Rendezvous) -> None:
        g = rv.generation()
        joined_key = f"g{g}/joined"
        if self._formed is not None:  # formed: start a new generation when someone waits outside it
            waiting = rv.count(joined_key) - len(self._formed.names)
            if waiting > 0:
                with self._lock:
                    if self._formed is not None and self._formed.generation == g:
                        self._retire(f"{waiting} generator(s) waiting to join", quiet=True)
            self._closed.wait(0.2)
            return
        n, last, since = 0, -1, time.monotonic()
        while not self._closed.is_set():
            n = rv.count(joined_key)
            if n != last:
                last, since = n, time.monotonic()
            want = self.settings.generators
            if n and ((want and n >= want) or (not want and time.monotonic() - since >= SETTLE_S)):
                break
            self._closed.wait(POLL_S)
        if self._closed.is_set():
            return
        rv.store.set(f"g{g}/world", str(n + 1))  # frozen: ranks 1..n are in; later joiners wait
        names = {r: rv.get(f"g{g}/name/{r}") if rv.has(f"g{g}/name/{r}") else f"rank {r}"
                 for r in range(1, n + 1)}
        try:
            group = member_group(rv.store, g, 0, n + 1, self.settings)
        except Exception as exc:  # a member did not come within the timeout
            log.warning("weights broadcast: generation %d (%s) did not form within %.0f s: %s", g,
                        ", ".join(names.values()), self.settings.timeout_s, exc)
            with self._lock:
                self._retire("it did not form")
            return
        with self._lock:
            self._formed = _Formed(g, group, names)
            self.members = n
        log.info("weights broadcast: generation %d formed with %d generator(s): %s", g, n, ", ".join(names.values()))

    def _retire(self, why: str, quiet: bool = False) -> None:
        """Give up the current generation (lock held): members drop their group and join the next."""
        g = self.rv.generation()
        (log.info if quiet else log.warning)("weights broadcast: generation %d retired (%s)", g, why)
        self._formed = None
        self.members = 0
        self._start(g + 1)

    # -- sending -------------------------------------------------------------------------------------
    def send(self, version: int, objects: Iterable[tuple[str, bytes | memoryview]]) -> bool:
        """Broadcast one version's objects (key, bytes), in order, as `objects` yields them, to the group; True
        when every member has them. Bounded: each of ready, transfer and done waits at most `timeout_s`. Never
        raises for a member's fault: it is named and counted, and the version goes through the store. An
        error raised by `objects` itself retires the group and is raised again."""
        try:
            return self._send(version, objects)
        except SourceFailed as exc:
            with self._lock:
                self._retire("the version's objects failed")
            assert exc.__cause__ is not None
            raise exc.__cause__ from None
        except Exception as exc:  # the rendezvous itself failed: the store path still serves every generator
            log.warning("weights broadcast: version %d not sent: %s", version, exc)
            with self._lock, contextlib.suppress(Exception):
                self.failed += 1
                self._retire(f"the send failed: {exc}")
            return False

    def send_and_announce(self, version: int, objects: Iterable[tuple[str, bytes | memoryview]],
                          announce: Callable[[], None]) -> bool:
        """`send`, calling `announce()` once: as soon as the version's manifest has gone to the group (a
        snapshot's goes first, so the generators build it while its shards stream in; a delta's last), or
        after the send when the manifest did not go (no group, a failed transfer). An error of `objects`
        before the manifest went is raised with nothing announced."""
        announced = False

        def watched() -> Iterator[tuple[str, bytes | memoryview]]:
            nonlocal announced
            for key, data in objects:
                yield key, data
                if not announced and parse_key(key) is not None:
                    announced = True
                    announce()

        sent = self.send(version, watched())
        if not announced:
            announce()
        return sent

    def _send(self, version: int, objects: Iterable[tuple[str, bytes | memoryview]]) -> bool:
        with self._lock:
            f = self._formed
            if f is None:
                self.skipped += 1
                return False
            f.seq += 1
            g, seq, ranks = f.generation, f.seq, sorted(f.names)
            t = self.settings.timeout_s
            self.server.set(f"g{g}/send/{seq}", json.dumps({"version": version}))

            def missing(step: str) -> list[int]:
                return [r for r in ranks if not self.rv.has(f"g{g}/{step}/{seq}/{r}")]

            if not self.rv.wait_for(lambda: not missing("ready"), t):
                self.server.set(f"g{g}/abort/{seq}", "1")
                return self._failed(f, missing("ready"), f"not ready for version {version} within {t:.0f} s")
            self.server.set(f"g{g}/go/{seq}", "1")
            device = device_for(self.settings.backend)
            try:
                with warnings.catch_warnings():  # a read-only buffer: the root only reads it
                    warnings.simplefilter("ignore", UserWarning)
                    for key, data in pull(objects):
                        f.group.broadcast(frame(len(data), key, device), 0).wait()  # type: ignore[attr-defined]
                        if len(data):
                            buf = torch.frombuffer(memoryview(data), dtype=torch.uint8).to(device)
                            f.group.broadcast(buf, 0).wait()  # type: ignore[attr-defined]
                    f.group.broadcast(frame(-1, "", device), 0).wait()  # type: ignore[attr-defined]
            except SourceFailed:
                raise
            except Exception as exc:  # gloo/NCCL timeout or a closed connection
                self.rv.wait_for(lambda: not missing("done"), 1.0)
                return self._failed(f, missing("done") or ranks, f"the transfer of version {version} failed: {exc}")
            if not self.rv.wait_for(lambda: not missing("done"), t):
                return self._failed(f, missing("done"), f"version {version} not received within {t:.0f} s")
            self.sent += 1
            return True

    def _failed(self, f: _Formed, ranks: list[int], what: str) -> bool:
        names = [f.names.get(r, f"rank {r}") for r in ranks]
        for name in names:
            self.stuck[name] += 1
        self.failed += 1
        log.warning("weights broadcast: %s: stuck: %s; the version goes through the store and the group is "
                    "rebuilt", what, ", ".join(names) or "(none named)")
        self._retire(f"stuck: {', '.join(names)}")
        return False

    def close(self) -> None:
        """Stop forming groups (a formation in progress is left to its daemon thread: never a wait of a
        whole timeout at shutdown) and drop the group."""
        self._closed.set()
        join_thread(self._thread)
        with self._lock:
            self._formed = None


class BroadcastReceiver:
    """A generator's end: joins the learner's group in a background thread and hands each version's objects
    to `deliver(version, {key: bytes})` (the reader's inbox) as they arrive, then calls `ended(version)` once
    the version's transfer is over, whole or not, before it says done. Each object is received into
    `buffer(size)` (a uint8 CPU tensor; the inbox lends recycled ones). Counters: `received` (versions),
    `bytes`, `failures` (groups lost: it joins again)."""

    def __init__(self, settings: BroadcastSettings, member_id: str,
                 deliver: Callable[[int, dict[str, bytes | memoryview]], None],
                 ended: Callable[[int], None] = lambda version: None,
                 buffer: Callable[[int], torch.Tensor] = lambda size: torch.empty(size, dtype=torch.uint8)) -> None:
        if settings.port == 0:
            raise ValueError("port: the learner's rendezvous port (1..65535), not 0")
        self.settings = settings
        self.member_id = member_id
        self.deliver = deliver
        self.ended = ended
        self.buffer = buffer
        self.received = 0
        self.bytes = 0
        self.failures = 0
        self.in_group = False
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{member_id}-broadcast", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop receiving. The thread is a daemon: one blocked in a transfer is not waited for past
        CLOSE_WAIT_S (a generator's SIGTERM drain stays short); nothing it holds needs saving."""
        self._closed.set()
        join_thread(self._thread)

    def _connect(self) -> TCPStore:
        """A client of the learner's rendezvous: reached within `CONNECT_SLICE_S` (else the caller tries
        again), then every wait on it bounded by `timeout_s`."""
        slice_s = min(self.settings.timeout_s, CONNECT_SLICE_S)
        store = TCPStore(self.settings.address, self.settings.port, None, False, datetime.timedelta(seconds=slice_s))
        store.set_timeout(datetime.timedelta(seconds=self.settings.timeout_s))
        return store

    def _run(self) -> None:
        store: TCPStore | None = None
        while not self._closed.is_set():
            if store is None:
                try:
                    store = self._connect()
                except Exception as exc:  # no learner (yet): not a failure; the store path serves meanwhile
                    log.info("%s: weights broadcast: the learner's rendezvous %s:%d is not up (%s); trying again",
                             self.member_id, self.settings.address, self.settings.port,
                             str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
                    self._closed.wait(1.0)
                    continue
            try:
                self._member(Rendezvous(store))
            except Exception as exc:  # the learner went away, a peer died, a timeout: join again
                self.failures += 1
                self.in_group = False
                store = None
                if not self._closed.is_set():
                    log.warning("%s: weights broadcast: %s; joining again (what is missed comes from the store)",
                                self.member_id, str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__)
                self._closed.wait(1.0)

    def _receive(self, group: object, version: int) -> None:
        """One version's objects, each delivered as it comes (the reader builds from them meanwhile)."""
        device = device_for(self.settings.backend)
        meta = torch.empty(META_BYTES, dtype=torch.uint8, device=device)
        while True:
            group.broadcast(meta, 0).wait()  # type: ignore[attr-defined]
            size, key = unframe(meta)
            if size < 0:
                return
            host = self.buffer(size)
            buf = host if device.type == "cpu" else torch.empty(size, dtype=torch.uint8, device=device)
            if size:
                group.broadcast(buf, 0).wait()  # type: ignore[attr-defined]
            if buf is not host:
                host.copy_(buf)
            self.deliver(version, {key: host.numpy().data})
            self.bytes += size

    def _member(self, rv: Rendezvous) -> None:
        """One generation: join, build the group, receive until the generation is retired."""
        stop = self._closed.is_set
        t = self.settings.timeout_s
        g = rv.generation()
        rank = int(rv.store.add(f"g{g}/joined", 1))
        rv.store.set(f"g{g}/name/{rank}", self.member_id)

        def moved_on() -> bool:
            return stop() or rv.generation() != g

        rv.wait_for(lambda: rv.has(f"g{g}/world"), float("inf"), moved_on)
        if moved_on():
            return
        world = int(rv.get(f"g{g}/world"))
        if rank >= world:  # came after the freeze: the learner starts the next generation for us
            rv.wait_for(lambda: False, float("inf"), moved_on)
            return
        group = member_group(rv.store, g, rank, world, self.settings)
        self.in_group = True
        try:
            seq = 0
            while True:
                seq += 1
                if not rv.wait_any([f"g{g}/send/{seq}"], float("inf"), moved_on):
                    return
                header = json.loads(rv.get(f"g{g}/send/{seq}"))
                rv.store.set(f"g{g}/ready/{seq}/{rank}", "1")
                rv.wait_any([f"g{g}/go/{seq}", f"g{g}/abort/{seq}"], t, moved_on)
                if not rv.has(f"g{g}/go/{seq}"):
                    return  # aborted or retired: the version comes through the store
                version = int(header["version"])
                try:
                    self._receive(group, version)
                finally:  # (a fetch waiting for what did not come downloads it)
                    self.ended(version)
                self.received += 1
                rv.store.set(f"g{g}/done/{seq}/{rank}", "1")
        finally:
            self.in_group = False
