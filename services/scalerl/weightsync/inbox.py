"""What a generator's reader received by broadcast: the objects of the versions being pushed to it, kept until
the fetch that builds them takes them.

The receiver (`weightsync.broadcast.BroadcastReceiver`) puts each object as it arrives (`put`) and says when
a version's push has ended, whole or not (`end`). A fetch takes an object (`take`); while its version's push
is still under way and the object has not come yet, it waits for it (bounded), so a generator builds a pushed
snapshot shard by shard as the shards stream in (its manifest comes first). Objects of the last `versions`
versions put are kept; older ones are dropped.

The receiver receives each large object into a buffer the inbox lends it (`buffer`), and the reader gives
a shard's buffer back once its chunks are in the copy (`release`): fresh memory costs a page fault per
4 KiB, which made a 269 MB push over loopback 0.21-0.24 s instead of 0.12 s on the machine of
docs/measurements/benchmarks.md. A buffer is reused only once released: one a fetch took and still reads is
never written.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import torch

from scalerl.weightsync.manifest import version_of

Blob = bytes | memoryview
POOL_MIN_BYTES = 1 << 20
"""Objects at least this large are received into recycled buffers (smaller ones fault in little memory)."""
POOL_BUFFERS = 8
"""Free buffers kept at most: a streamed build releases each shard once applied, so a few are in use."""


def _address(data: Blob) -> int:
    return int(np.frombuffer(data, np.uint8).ctypes.data) if len(data) else 0


class Inbox:
    def __init__(self, versions: int = 2) -> None:
        self.versions = versions
        self._objects: dict[str, Blob] = {}
        self._keys: dict[int, list[str]] = {}  # version -> the keys put, for the last `versions`
        self._open: set[int] = set()  # versions whose push has not ended
        self._free: list[torch.Tensor] = []  # buffers to lend again
        self._lent: dict[int, torch.Tensor] = {}  # address -> buffer lent to the receiver, not yet put
        self._held: dict[str, torch.Tensor] = {}  # key -> the buffer its object is in, until released
        self._cond = threading.Condition()

    def buffer(self, size: int) -> torch.Tensor:
        """A uint8 tensor of `size` bytes to receive an object into (a free buffer where one is large enough)."""
        if size < POOL_MIN_BYTES:
            return torch.empty(size, dtype=torch.uint8)
        with self._cond:
            fits = [i for i, b in enumerate(self._free) if b.numel() >= size]
            base = self._free.pop(min(fits, key=lambda i: self._free[i].numel())) if fits else None
        if base is None:
            base = torch.empty(size, dtype=torch.uint8)
        with self._cond:
            self._lent[base.data_ptr()] = base
        return base[:size]

    def release(self, key: str) -> None:
        """The object `key` (taken) is no longer read: its buffer may be lent again."""
        with self._cond:
            self._recycle(key)

    def _recycle(self, key: str) -> None:
        base = self._held.pop(key, None)
        if base is not None and len(self._free) < POOL_BUFFERS:
            self._free.append(base)

    def put(self, version: int, objects: dict[str, Blob]) -> None:
        """Objects of `version` that arrived (its push is under way until `end`)."""
        with self._cond:
            self._open.add(version)
            for key, data in objects.items():
                self._objects[key] = data
                self._keys.setdefault(version, []).append(key)
                if (base := self._lent.pop(_address(data), None)) is not None:
                    self._held[key] = base
            for old in sorted(self._keys)[:-self.versions]:
                self._open.discard(old)
                for key in self._keys.pop(old):
                    if self._objects.pop(key, None) is not None:
                        self._recycle(key)  # never taken: nobody reads it
                    else:
                        self._held.pop(key, None)  # taken and maybe still read: not lent again
            self._cond.notify_all()

    def end(self, version: int) -> None:
        """The push of `version` has ended (every object came, or the transfer failed): no more will come."""
        with self._cond:
            self._open.discard(version)
            self._lent.clear()  # (one lent for an object that never came)
            self._cond.notify_all()

    def has(self, key: str) -> bool:
        with self._cond:
            return key in self._objects

    def wait(self, key: str, timeout_s: float) -> None:
        """Return once `key` is here or `timeout_s` has passed."""
        with self._cond:
            self._cond.wait_for(lambda: key in self._objects, timeout_s)

    def take(self, key: str, wait_s: float = 0.0) -> Blob | None:
        """The object `key`, taken out (None: it was not pushed). While its version's push is under way, waits
        for it up to `wait_s`."""
        version = version_of(key)
        deadline = time.monotonic() + wait_s
        with self._cond:
            while key not in self._objects and version in self._open and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            return self._objects.pop(key, None)
