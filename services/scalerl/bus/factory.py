"""`open_bus`: a bus from its URL. Apart from the interface (`bus/base.py`) so that the transports, which
implement that interface, are never imported by it: base ← memory, kafka ← factory.
"""

from __future__ import annotations

from scalerl.bus.base import Bus


def open_bus(url: str, *, connect_timeout_s: float | None = None) -> Bus:
    """Open a bus from its URL: `memory://` or `kafka://host:port[,host:port]`. `connect_timeout_s`: how long
    one attempt waits for the first broker (Kafka; default its request timeout, 30 s)."""
    if url.startswith("memory://"):
        from scalerl.bus.memory import MemoryBus

        return MemoryBus()
    if url.startswith("kafka://"):
        from scalerl.bus.kafka import KafkaBus  # type: ignore[import-not-found,unused-ignore]

        return KafkaBus(url.removeprefix("kafka://"), connect_timeout_s=connect_timeout_s)
    raise ValueError(f"bus URL {url!r}: expected memory:// or kafka://HOST:PORT")
