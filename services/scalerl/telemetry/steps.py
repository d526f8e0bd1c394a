"""Durations of a role's units of work (a generation batch, a scoring batch, an optimizer step, a
curriculum round), handed from the role's loop to its metrics (`scalerl_<role>_step_seconds`).

The loop calls `observe(seconds)` for each unit that did work (an idle poll is not a step); the side
port's metrics take what came since the last scrape with `drain()` and put each into the histogram.
Pure standard library (the roles run without prometheus_client too); a bounded buffer, so a role that
is never scraped does not grow without limit (the oldest durations are dropped and counted in
`dropped`).
"""

from __future__ import annotations

import threading
from collections import deque

MAX_PENDING = 10_000


class StepTimes:
    def __init__(self, max_pending: int = MAX_PENDING) -> None:
        self._pending: deque[float] = deque(maxlen=max_pending)
        self._lock = threading.Lock()
        self.count = 0  # every duration observed
        self.dropped = 0  # observed but pushed out before a scrape took them

    def observe(self, seconds: float) -> None:
        with self._lock:
            if len(self._pending) == self._pending.maxlen:
                self.dropped += 1
            self._pending.append(max(0.0, float(seconds)))
            self.count += 1

    def drain(self) -> list[float]:
        """The durations observed since the last drain, oldest first."""
        with self._lock:
            out = list(self._pending)
            self._pending.clear()
        return out
