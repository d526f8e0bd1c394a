"""The bus side of a fault plan (`scalerl.faults.plan`'s bus faults), around the real Kafka bus.

`wrap_bus(bus)` returns the bus unchanged when no plan is active. Otherwise a `FaultyBus` that delegates
everything and puts a `FaultyProducer` under a Kafka bus (failed sends never reach the broker and are
reported failed, as after an outage past the delivery timeout; failed flushes leave their records in
flight), so the bus's own retention of failed sends is what is exercised; and wraps every consumer in a
`FaultyConsumer` (membership dropped before a poll; announcements held back on a policy topic).
"""

from __future__ import annotations

import time
from typing import Any

from scalerl.bus.base import Bus, Consumer, Record
from scalerl.faults import points
from scalerl.faults.points import Injector


class _FailedSend:
    """A send's future that failed before reaching the broker (kafka-python's future interface)."""

    def __init__(self, exc: Exception) -> None:
        self.is_done = True
        self.exception = exc

    def succeeded(self) -> bool:
        return False

    def failed(self) -> bool:
        return True


class FaultyProducer:
    def __init__(self, real: Any, injector: Injector) -> None:
        self._real = real
        self._injector = injector

    def send(self, topic: str, value: Any = None, key: Any = None, headers: Any = None) -> Any:
        from kafka.errors import KafkaTimeoutError

        kind = "dlq_send" if topic.endswith(".dlq") else "send"
        if self._injector.hit(kind) is not None:
            return _FailedSend(KafkaTimeoutError(f"fault injection: {kind} to {topic} failed"))
        return self._real.send(topic, value=value, key=key, headers=headers)

    def flush(self, timeout: float | None = None) -> None:
        from kafka.errors import KafkaTimeoutError

        if self._injector.hit("flush") is not None:
            raise KafkaTimeoutError("fault injection: flush timed out")
        self._real.flush(timeout=timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class FaultyConsumer(Consumer):
    def __init__(self, inner: Consumer, injector: Injector, *, member: bool, policy: bool) -> None:
        self.inner = inner
        self._injector = injector
        self._member = member
        self._policy = policy
        self._held: list[Record] = []
        self._release_at = 0.0
        self._delay_s = 0.0

    def poll(self, timeout_s: float = 0.0, max_records: int = 1000) -> list[Record]:
        if self._member and hasattr(self.inner, "drop_membership") and self._injector.hit("membership"):
            self.inner.drop_membership()
        records = self.inner.poll(timeout_s=timeout_s, max_records=max_records)
        if not self._policy:
            return records
        for _ in records:
            fault = self._injector.hit("policy_delay")
            if fault is not None:
                self._release_at = time.monotonic() + fault.seconds
        if time.monotonic() < self._release_at:
            self._held += records
            return []
        out, self._held = [*self._held, *records], []
        return out

    def commit(self, positions: dict[str, int] | None = None) -> None:
        self.inner.commit(positions)

    def positions(self) -> dict[str, int]:
        return self.inner.positions()

    def seek(self, positions: dict[str, int]) -> None:
        self._held = []
        self.inner.seek(positions)

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class FaultyBus(Bus):
    def __init__(self, inner: Bus, injector: Injector) -> None:
        self.inner = inner
        self._injector = injector
        get_producer = getattr(inner, "_get_producer", None)
        if get_producer is not None:  # Kafka: inject under the bus's own delivery bookkeeping
            inner._producer = FaultyProducer(get_producer(), injector)  # type: ignore[attr-defined]

    def publish(self, topic: str, value: Any, *, key: str | None = None,
                headers: dict[str, str] | None = None) -> None:
        self.inner.publish(topic, value, key=key, headers=headers)

    def consumer(self, topics: list[str], group: str, *, dead_letters: bool = True,
                 sole_owner: bool = False) -> Consumer:
        inner = self.inner.consumer(topics, group, dead_letters=dead_letters, sole_owner=sole_owner)
        return FaultyConsumer(inner, self._injector, member=True, policy=_policy(topics))

    def reader(self, topics: list[str], *, dead_letters: bool = False, role: str = "reader") -> Consumer:
        inner = self.inner.reader(topics, dead_letters=dead_letters, role=role)
        return FaultyConsumer(inner, self._injector, member=False, policy=_policy(topics))

    def partitions(self, topic: str) -> list[int]:
        return self.inner.partitions(topic)

    def ensure_topics(self, topics: list[str], partitions: int = 1) -> None:
        self.inner.ensure_topics(topics, partitions)

    def flush(self, timeout_s: float | None = None) -> None:
        flush = self.inner.flush
        flush() if timeout_s is None else flush(timeout_s=timeout_s)  # type: ignore[call-arg]

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:  # lag, committed, read_raw, ... of the transport
        return getattr(self.inner, name)


def _policy(topics: list[str]) -> bool:
    return any(t.endswith(".policy") for t in topics)


def wrap_bus(bus: Bus) -> Bus:
    """`bus` under the active fault plan (unchanged when none is active)."""
    return bus if points.ACTIVE is None else FaultyBus(bus, points.ACTIVE)
