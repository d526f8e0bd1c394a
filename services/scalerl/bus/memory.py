"""In-memory bus for embedded mode: one process, threads, no serialisation.

Each topic has a single partition (0). Records are kept until the bus is dropped; a consumer group
remembers its committed offset per topic, and a new consumer of the group starts there — the same
semantics the Kafka bus has, so role code cannot tell them apart.
"""

from __future__ import annotations

import threading
from typing import Any

from scalerl.bus.base import Bus, Consumer, Record


class MemoryBus(Bus):
    def __init__(self) -> None:
        self._logs: dict[str, list[Record]] = {}
        self._committed: dict[tuple[str, str], int] = {}  # (group, topic) -> next offset
        self._cond = threading.Condition()

    def publish(self, topic: str, value: Any, *, key: str | None = None,
                headers: dict[str, str] | None = None) -> None:
        with self._cond:
            log = self._logs.setdefault(topic, [])
            log.append(Record(topic, 0, len(log), key, value, dict(headers or {})))
            self._cond.notify_all()

    def consumer(self, topics: list[str], group: str, *, dead_letters: bool = True,
                 sole_owner: bool = False) -> Consumer:
        # (one process, no rebalances: every consumer keeps its positions)
        return _MemoryConsumer(self, list(topics), group)

    def size(self, topic: str) -> int:
        with self._cond:
            return len(self._logs.get(topic, []))

    def committed(self, group: str, topic: str) -> int:
        with self._cond:
            return self._committed.get((group, topic), 0)


class _MemoryConsumer(Consumer):
    def __init__(self, bus: MemoryBus, topics: list[str], group: str) -> None:
        self._bus = bus
        self._topics = topics
        self._group = group
        with bus._cond:
            self._pos = {t: bus._committed.get((group, t), 0) for t in topics}

    def _take(self, max_records: int) -> list[Record]:
        out: list[Record] = []
        for t in self._topics:
            log = self._bus._logs.get(t, [])
            while self._pos[t] < len(log) and len(out) < max_records:
                out.append(log[self._pos[t]])
                self._pos[t] += 1
        return out

    def poll(self, timeout_s: float = 0.0, max_records: int = 1000) -> list[Record]:
        with self._bus._cond:
            out = self._take(max_records)
            if not out and timeout_s > 0:
                self._bus._cond.wait(timeout_s)
                out = self._take(max_records)
            return out

    def commit(self, positions: dict[str, int] | None = None) -> None:
        with self._bus._cond:
            if positions is None:
                positions = self.positions()
            for key, off in positions.items():
                topic = key.rsplit(":", 1)[0]
                self._bus._committed[(self._group, topic)] = off

    def positions(self) -> dict[str, int]:
        return {f"{t}:0": p for t, p in self._pos.items()}

    def seek(self, positions: dict[str, int]) -> None:
        for key, off in positions.items():
            topic = key.rsplit(":", 1)[0]
            if topic in self._pos:
                self._pos[topic] = off
