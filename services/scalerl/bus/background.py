"""A consumer that reads in a background thread, so the caller's `poll(0)` costs no network I/O.

Why: a generator asks for new policy announcements between decode steps, thousands of times a
minute, with no time to wait; a Kafka client polled with a zero timeout may never finish joining its
group or fetching. The thread polls the wrapped consumer with a real timeout and queues what arrives;
`poll()` hands the queued records over (waiting up to `timeout_s` for the first one).

The wrapped consumer is only touched under a lock (Kafka clients are not thread-safe). `positions()`
are those of the records handed to the caller, so `commit()` never covers a record still queued.
"""

from __future__ import annotations

import logging
import queue
import threading

from scalerl.bus.base import Consumer, Record

log = logging.getLogger(__name__)


class BackgroundConsumer(Consumer):
    def __init__(self, inner: Consumer, *, poll_s: float = 0.2, name: str = "bus-reader") -> None:
        self.inner = inner
        self.poll_s = poll_s
        self._queue: queue.Queue[Record] = queue.Queue()
        self._lock = threading.Lock()
        self._handed: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self._lock:  # queued under the lock too, so a seek never sees a stale record arrive
                    for rec in self.inner.poll(timeout_s=self.poll_s):
                        self._queue.put(rec)
            except Exception as exc:  # a transport error: keep trying (the broker may be restarting)
                log.warning("background poll failed: %r", exc)
                self._stop.wait(1.0)

    def poll(self, timeout_s: float = 0.0, max_records: int = 1000) -> list[Record]:
        out: list[Record] = []
        try:
            out.append(self._queue.get(timeout=timeout_s) if timeout_s > 0 else self._queue.get_nowait())
            while len(out) < max_records:
                out.append(self._queue.get_nowait())
        except queue.Empty:
            pass
        for rec in out:
            self._handed[rec.position_key] = rec.offset + 1
        return out

    def commit(self, positions: dict[str, int] | None = None) -> None:
        with self._lock:
            self.inner.commit(dict(self._handed) if positions is None else positions)

    def positions(self) -> dict[str, int]:
        return dict(self._handed)

    def seek(self, positions: dict[str, int]) -> None:
        with self._lock:
            while not self._queue.empty():  # queued records are before or after the seek: drop them
                self._queue.get_nowait()
            self.inner.seek(positions)
            self._handed.update(positions)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        with self._lock:
            self.inner.close()
