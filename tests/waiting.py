"""Waiting for asynchronous work in tests: poll with a deadline instead of sampling once or sleeping.

A server finishes some requests after it answered them (Kafka deletes a topic in the background; a
controller reconciles later), and on a loaded machine that takes longer. Tests poll the observable
state until it holds or a generous deadline passes, and then fail naming what they waited for.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

TOPIC_DELETION_TIMEOUT_S = 120.0
"""Seconds a broker may take to finish deleting topics (it answers before the deletion is done)."""


def wait_for(what: str, fn: Callable[[], T | None], timeout_s: float = 20.0, every_s: float = 0.1) -> T:
    """Poll `fn` until it returns something truthy; fail naming `what` (and the last value) on timeout."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        last = fn()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what} (last: {last!r})")
        time.sleep(every_s)


def delete_topics_and_wait(bus: Any, prefix: str, timeout_s: float = TOPIC_DELETION_TIMEOUT_S) -> None:
    """Delete every topic of `bus` (a `KafkaBus`) that starts with `prefix`, and wait until the broker
    lists none: the delete request returns while the deletion is still in progress."""
    bus.delete_topics(bus.list_topics(prefix=prefix))
    wait_for(f"topics {prefix}* deleted", lambda: bus.list_topics(prefix=prefix) == [] or None,
             timeout_s=timeout_s, every_s=0.5)
