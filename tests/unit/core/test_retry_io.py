"""retry_io: nested retries share one outage limit (the inner OutageTooLong is not retried by the outer
call), and a stop ends the wait at once with RetryStopped."""

from __future__ import annotations

import threading

import pytest

from scalerl.runtime.roles import OutageTooLong, RetryStopped, retry_io


def test_nested_retries_do_not_multiply_the_limit():
    attempts = {"inner": 0, "outer": 0}

    def inner() -> None:
        attempts["inner"] += 1
        raise ConnectionError("broker down")

    def outer() -> None:
        attempts["outer"] += 1
        retry_io(inner, max_outage_s=0.0, what="inner")

    with pytest.raises(OutageTooLong, match="inner: the bus/store did not answer for 0 s"):
        retry_io(outer, max_outage_s=3600.0, what="outer")
    assert attempts["outer"] == 1  # the outer call did not start the inner wait over


def test_stop_ends_the_wait():
    stop = threading.Event()
    calls = []

    def failing() -> None:
        calls.append(1)
        if len(calls) == 2:
            stop.set()
        raise ConnectionError("broker down")

    with pytest.raises(RetryStopped):
        retry_io(failing, stop, max_outage_s=3600.0)
    assert len(calls) == 2


def test_success_after_failures_returns_the_value():
    results = iter([ConnectionError("down"), 7])

    def flaky() -> int:
        r = next(results)
        if isinstance(r, Exception):
            raise r
        return r

    assert retry_io(flaky, threading.Event(), max_outage_s=60.0) == 7
