"""What the parties of the broadcast path exchange (`weightsync.broadcast`): the rendezvous' keys, read and
waited for on one TCPStore connection (`Rendezvous`), and the framing of each object a send streams: a
header of `META_BYTES` (`frame`, `unframe`) before its bytes."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

import torch
from torch._C._distributed_c10d import TCPStore

POLL_S = 0.05
"""How often a waiting party looks at the rendezvous once it has waited a while (seconds; at first every
few milliseconds). Polling, not TCPStore.wait: its timeouts print c10d warnings on stderr."""
META_BYTES = 512
"""One object's header in a send: its size (int64, little-endian; -1: the version ends), the length of its
key (uint16) and the key (UTF-8)."""
MAX_OBJECT_BYTES = 1 << 34
"""The largest object a receiver accepts (16 GiB): a header asking for more is a broken or foreign send."""


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
