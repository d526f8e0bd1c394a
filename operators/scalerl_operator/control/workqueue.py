"""A bounded pool of workers over a delaying work queue: the operator's periodic passes, one shared
scheduler instead of one blocking kopf daemon (a thread) per RLJob.

Why: kopf runs sync handlers and daemons in one thread pool; a daemon per RLJob keeps a thread for
the RLJob's lifetime, so past `max_workers` RLJobs the create/update handlers of new ones wait for a
thread that never frees up. Here `workers` threads serve any number of RLJobs (client-go's
workqueue semantics):

- a key is queued at most once (a second `add` only moves its due time earlier) and never runs on
  two workers at once; an `add` while it runs marks it dirty and it runs again right after;
- a pass that returns True is rescheduled after `interval_s`; False (the object is gone) forgets the
  key; an exception reschedules it after `backoff_delay` (exponential from `backoff_base_s`, capped
  at `backoff_max_s`, full jitter in [½, 1] of that, so a broken API server or broker is not hammered
  in lock-step by every RLJob), and a success resets the count;
- `add(key, delay_s)` from a watch event (a child changed) runs a pass within `delay_s`, so status
  follows the children within a second or two instead of at the next period.
"""

from __future__ import annotations

import heapq
import logging
import random
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


def backoff_delay(failures: int, base_s: float, max_s: float, u: float) -> float:
    """Delay before retry number `failures` (1 = after the first failure), `u` uniform in [0, 1).
    Examples (base 1 s, cap 60 s): failures 1 → [0.5, 1) s, 4 → [4, 8) s, 10 → [30, 60) s."""
    if failures < 1:
        return 0.0
    full = min(max_s, base_s * 2.0 ** min(failures - 1, 30))
    return full * (0.5 + 0.5 * u)


@dataclass
class WorkQueue:
    """`run(key)` → True (keep, next pass after `interval_s`), False (forget); raising → backoff."""

    run: Callable[[Hashable], bool]
    workers: int = 4
    interval_s: float = 15.0
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0
    rng: random.Random = field(default_factory=random.Random)
    _heap: list[tuple[float, int, Hashable]] = field(default_factory=list)
    _due: dict[Hashable, float] = field(default_factory=dict)
    _running: set[Hashable] = field(default_factory=set)
    _dirty: set[Hashable] = field(default_factory=set)
    _failures: dict[Hashable, int] = field(default_factory=dict)
    _gone: set[Hashable] = field(default_factory=set)  # forgotten while running
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _seq: int = 0
    _stopped: bool = False
    _threads: list[threading.Thread] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers: must be >= 1, got {self.workers}")

    # ---- producers --------------------------------------------------------------------------------

    def add(self, key: Hashable, delay_s: float = 0.0) -> None:
        """Run `key` within `delay_s` (an earlier due time wins)."""
        with self._cond:
            if self._stopped:
                return
            if key in self._running:
                self._dirty.add(key)
                return
            self._schedule(key, time.monotonic() + max(0.0, delay_s))

    def forget(self, key: Hashable) -> None:
        with self._cond:
            self._due.pop(key, None)
            self._dirty.discard(key)
            if key in self._running:
                self._gone.add(key)
            self._failures.pop(key, None)

    def __len__(self) -> int:
        with self._cond:
            return len(self._due) + len(self._running)

    def failures(self, key: Hashable) -> int:
        with self._cond:
            return self._failures.get(key, 0)

    # ---- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        for i in range(self.workers):
            t = threading.Thread(target=self._work, name=f"rljob-worker-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, wait_s: float = 30.0) -> None:
        """No new passes; wait (bounded) for the ones in flight."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        deadline = time.monotonic() + wait_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    # ---- internals --------------------------------------------------------------------------------

    def _schedule(self, key: Hashable, at: float) -> None:  # under the lock
        if key in self._due and self._due[key] <= at:
            return
        self._due[key] = at
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, key))
        self._cond.notify()

    def _next(self) -> Hashable | None:
        """Block until a key is due (and not running); None when stopped."""
        with self._cond:
            while not self._stopped:
                now = time.monotonic()
                while self._heap and (self._heap[0][2] not in self._due or self._due[self._heap[0][2]] !=
                                      self._heap[0][0]):
                    heapq.heappop(self._heap)  # superseded or forgotten entries
                if self._heap and self._heap[0][0] <= now:
                    _, _, key = heapq.heappop(self._heap)
                    del self._due[key]
                    self._running.add(key)
                    return key
                self._cond.wait(None if not self._heap else self._heap[0][0] - now)
            return None

    def _work(self) -> None:
        while (key := self._next()) is not None:
            keep, failed = True, False
            try:
                keep = bool(self.run(key))
            except Exception as exc:  # one failed pass never stops the queue: back off and retry
                failed = True
                log.warning("%s: pass failed: %s", key, exc)
            with self._cond:
                self._running.discard(key)
                if self._stopped:
                    continue
                if not keep or key in self._gone:
                    self._gone.discard(key)
                    self._dirty.discard(key)
                    self._failures.pop(key, None)
                    continue
                if failed:
                    n = self._failures[key] = self._failures.get(key, 0) + 1
                    delay = backoff_delay(n, self.backoff_base_s, self.backoff_max_s, self.rng.random())
                else:
                    self._failures.pop(key, None)
                    delay = self.interval_s
                if key in self._dirty:  # changed while it ran: again now (after a failure: still back off)
                    self._dirty.discard(key)
                    delay = delay if failed else 0.0
                self._schedule(key, time.monotonic() + delay)
