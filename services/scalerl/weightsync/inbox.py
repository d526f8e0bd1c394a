"""What a generator's reader received by broadcast: the objects of the versions being pushed to it, kept until
the fetch that builds them takes them.

The receiver (`weightsync.broadcast.BroadcastReceiver`) puts each object as it arrives (`put`) and says when
a version's push has ended, whole or not (`end`). A fetch takes an object (`take`); while its version's push
is still under way and the object has not come yet, it waits for it (bounded), so a generator builds a pushed
snapshot shard by shard as the shards stream in (its manifest comes first). Objects of the last `versions`
versions put are kept; older ones are dropped.
"""

from __future__ import annotations

import threading
import time

from scalerl.weightsync.manifest import version_of

Blob = bytes | memoryview


class Inbox:
    def __init__(self, versions: int = 2) -> None:
        self.versions = versions
        self._objects: dict[str, Blob] = {}
        self._keys: dict[int, list[str]] = {}  # version -> the keys put, for the last `versions`
        self._open: set[int] = set()  # versions whose push has not ended
        self._cond = threading.Condition()

    def put(self, version: int, objects: dict[str, Blob]) -> None:
        """Objects of `version` that arrived (its push is under way until `end`)."""
        with self._cond:
            self._open.add(version)
            for key, data in objects.items():
                self._objects[key] = data
                self._keys.setdefault(version, []).append(key)
            for old in sorted(self._keys)[:-self.versions]:
                self._open.discard(old)
                for key in self._keys.pop(old):
                    self._objects.pop(key, None)
            self._cond.notify_all()

    def end(self, version: int) -> None:
        """The push of `version` has ended (every object came, or the transfer failed): no more will come."""
        with self._cond:
            self._open.discard(version)
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
