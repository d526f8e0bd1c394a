"""What the parties of the broadcast path share (`weightsync.broadcast`): their settings, the rendezvous' keys,
read and waited for on one TCPStore connection (`Rendezvous`), the process group of a generation
(`member_group`), the framing of each object a send streams (a header of `META_BYTES`: `frame`, `unframe`)
before its bytes, and the background threads a `close` could not join (`stranded_threads`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
from torch._C._distributed_c10d import TCPStore

from scalerl.model.weight_broadcast import BroadcastEndpoint, join_group

POLL_S = 0.05
"""How often a waiting party looks at the rendezvous once it has waited a while (seconds; at first every
few milliseconds). Polling, not TCPStore.wait: its timeouts print c10d warnings on stderr."""
META_BYTES = 512
"""One object's header in a send: its size (int64, little-endian; -1: the version ends), the length of its
key (uint16) and the key (UTF-8)."""
MAX_OBJECT_BYTES = 1 << 34
"""The largest object a receiver accepts (16 GiB): a header asking for more is a broken or foreign send."""


CLOSE_WAIT_S = 2.0
"""How long `close` waits for a background thread (seconds)."""

class SourceFailed(Exception):
    """The version's objects could not be made (the publisher's error is the cause): not a member's fault."""


def pull(objects: Iterable[tuple[str, bytes | memoryview]]) -> Iterator[tuple[str, bytes | memoryview]]:
    """`objects`, with an error raised by them raised as SourceFailed (told apart from the transfer's)."""
    it = iter(objects)
    while True:
        try:
            item = next(it)
        except StopIteration:
            return
        except Exception as exc:
            raise SourceFailed(str(exc)) from exc
        yield item


def frame(size: int, key: str, device: torch.device) -> torch.Tensor:
    """The header of an object of `size` bytes under `key` (size -1: the end of a version) [META_BYTES]."""
    raw = key.encode()
    if len(raw) > META_BYTES - 10:
        raise ValueError(f"an object key of {len(raw)} bytes: at most {META_BYTES - 10}")
    head = size.to_bytes(8, "little", signed=True) + len(raw).to_bytes(2, "little") + raw
    return torch.frombuffer(bytearray(head.ljust(META_BYTES, b"\0")), dtype=torch.uint8).to(device)


def unframe(meta: torch.Tensor) -> tuple[int, str]:
    """(size, key) of a header; ValueError for one no learner of ours sends."""
    head = bytes(meta.cpu().numpy())
    size, n = int.from_bytes(head[:8], "little", signed=True), int.from_bytes(head[8:10], "little")
    if size > MAX_OBJECT_BYTES or size < -1 or n > META_BYTES - 10:
        raise ValueError(f"a broadcast header of size {size} and key length {n}: not a send of ours")
    return size, head[10:10 + n].decode()


class Rendezvous:
    """The keys of the protocol (`weightsync.broadcast`'s docstring) on one TCPStore connection."""

    def __init__(self, store: TCPStore) -> None:
        self.store = store

    def get(self, key: str) -> str:
        return bytes(self.store.get(key)).decode()

    def has(self, *keys: str) -> bool:
        return bool(self.store.check(list(keys)))

    def generation(self) -> int:
        return int(self.get("generation")) if self.has("generation") else 0

    def count(self, key: str) -> int:
        return int(self.store.add(key, 0))

    def wait_any(self, keys: list[str], timeout_s: float, stop: Callable[[], bool]) -> bool:
        """Wait until one of `keys` exists (True), `timeout_s` passes or `stop` holds (False)."""
        return self.wait_for(lambda: any(self.has(k) for k in keys), timeout_s, stop)

    def wait_for(self, ready: Callable[[], bool], timeout_s: float, stop: Callable[[], bool] = lambda: False) -> bool:
        """Poll `ready` until it holds (True), `timeout_s` passes or `stop` holds (False)."""
        deadline = time.monotonic() + timeout_s
        delay = 0.002  # the steps of a transfer follow each other within milliseconds: look often at first
        while not ready():
            if stop() or time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(POLL_S, delay * 1.5)
        return True


_STRANDED: list[threading.Thread] = []


def stranded_threads() -> list[str]:
    """Names of this module's background threads that `close` could not join: each is inside a native call
    (a gloo transfer, the group's rendezvous) bounded by `timeout_s`. While one is, the process must not
    run the interpreter's finalization: a daemon thread that returns from native code during it is ended
    by a forced unwind that aborts the process (SIGABRT, "terminate called without an active exception").
    The CLI ends such a process with `os._exit` once its own work is flushed."""
    return [t.name for t in _STRANDED if t.is_alive()]


def join_thread(thread: threading.Thread) -> None:
    thread.join(timeout=CLOSE_WAIT_S)
    if thread.is_alive():
        _STRANDED.append(thread)


@dataclass(frozen=True)
class BroadcastSettings:
    """Where the learner's rendezvous is and how long any one wait may take (`runtime.weight_sync.broadcast`)."""

    address: str
    port: int
    generators: int = 0
    timeout_s: float = 30.0
    backend: str = "gloo"

    def __post_init__(self) -> None:
        if not self.address:
            raise ValueError("address: the learner's host name or IP address")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: 0..65535 (0 only on the learner: the OS picks one), got {self.port}")
        if self.generators < 0 or self.timeout_s <= 0:
            raise ValueError("generators >= 0 and timeout_s > 0")
        if self.backend not in ("gloo", "nccl"):
            raise ValueError(f"backend: gloo (CPU) or nccl (GPU), got {self.backend!r}")


def member_group(store: TCPStore, generation: int, rank: int, world: int, settings: BroadcastSettings) -> object:
    """This process's member of generation `generation`'s group (blocks until all `world` ranks join)."""
    endpoint = BroadcastEndpoint(settings.address, store.port, world, rank, settings.backend, settings.timeout_s)
    return join_group(endpoint, store, prefix=f"scalerl-weights/g{generation}")


def device_for(backend: str) -> torch.device:
    return torch.device("cuda" if backend == "nccl" else "cpu")
