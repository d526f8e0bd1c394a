"""Swap without stopping: a generator builds the next version in the background while it keeps generating.

`Prefetcher(reader)`: `offer(pv)` hands it the newest announcement; a worker thread builds it into the
reader's resident copy (`WeightReader.fetch`: download, decode, checksums) while the engine generates with
the weights it holds; `take()` returns the built version once (or None while it is still being built),
and the caller swaps it into the engine between two decode steps. The copy is the one the engine loads
from, so the worker starts the next version only after the caller has loaded the one it took: the caller
says so with `loaded()` (the generator role calls it on its next poll, after the swap). An announcement
that cannot be built (`WeightsUnavailable`: a snapshot has been asked for) is logged and dropped; the
engine keeps its weights until a later one builds.
"""

from __future__ import annotations

import logging
import threading
import time

import torch

from scalerl.messages import PolicyVersion
from scalerl.weightsync.reader import WeightReader, WeightsUnavailable

log = logging.getLogger(__name__)


class Prefetcher:
    def __init__(self, reader: WeightReader, name: str = "weights-prefetch") -> None:
        self.reader = reader
        self.name = name
        self._cond = threading.Condition()
        self._want: PolicyVersion | None = None  # the newest announcement not yet started
        self._ready: tuple[PolicyVersion, dict[str, torch.Tensor]] | None = None  # built, not yet taken
        self._lent = False  # taken and maybe being loaded by the caller: the copy must not change
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self.failures = 0  # builds that raised something other than WeightsUnavailable (the reader counts those)

    def offer(self, pv: PolicyVersion) -> None:
        """Build `pv` next (replaces an offered version not started yet)."""
        with self._cond:
            self._want = pv
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=self.name, daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def take(self, wait_s: float = 0.0) -> tuple[PolicyVersion, dict[str, torch.Tensor]] | None:
        """The built version (once), waiting up to `wait_s` while one is offered or being built; None when
        there is none (or the one being built failed). Until `loaded()`, no other version is built."""
        deadline = time.monotonic() + wait_s
        with self._cond:
            while self._ready is None and (self._want is not None or self._busy):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            ready, self._ready = self._ready, None
            if ready is not None:
                self._lent = True
            return ready

    def loaded(self) -> None:
        """The caller has loaded what it took: the copy may change again."""
        with self._cond:
            if self._lent:
                self._lent = False
                self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (self._want is None or self._ready is not None or self._lent):
                    self._cond.wait()
                if self._closed:
                    return
                pv, self._want, self._busy = self._want, None, True
            assert pv is not None
            built: tuple[PolicyVersion, dict[str, torch.Tensor]] | None = None
            try:
                built = (pv, self.reader.fetch(pv))
            except WeightsUnavailable as exc:  # the engine keeps its weights; a snapshot has been asked for
                log.warning("%s: %s", self.name, exc)
            except Exception:  # a worker thread must not die silently: logged, then the next version
                self.failures += 1
                log.exception("%s: building version %d failed", self.name, pv.version)
            with self._cond:
                self._busy = False
                if built is not None:  # served even when a newer one is offered: it follows as a delta
                    self._ready = built
                self._cond.notify_all()
