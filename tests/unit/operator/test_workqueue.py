"""The operator's shared pool of periodic passes (scalerl_operator.control.workqueue): backoff arithmetic, and the
queue's guarantees with real threads (one run per key at a time, dirty re-runs, forgetting, backoff)."""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Hashable

import pytest

from scalerl_operator.control.workqueue import WorkQueue, backoff_delay
from waiting import wait_for


def test_backoff_delay_doubles_caps_and_jitters() -> None:
    assert backoff_delay(0, 1.0, 60.0, 0.3) == 0.0
    assert backoff_delay(1, 1.0, 60.0, 0.0) == 0.5 and backoff_delay(1, 1.0, 60.0, 0.999) < 1.0
    assert backoff_delay(4, 1.0, 60.0, 0.0) == 4.0  # 1 * 2**3 * 0.5
    assert backoff_delay(4, 1.0, 60.0, 1.0) == 8.0
    assert backoff_delay(10, 1.0, 60.0, 0.0) == 30.0 and backoff_delay(10, 1.0, 60.0, 1.0) == 60.0  # capped
    assert backoff_delay(10_000, 2.0, 60.0, 0.5) == 45.0  # no overflow


def test_workers_must_be_positive() -> None:
    with pytest.raises(ValueError, match="workers"):
        WorkQueue(lambda _k: True, workers=0)


def test_many_keys_few_workers_each_key_runs_alone() -> None:
    """50 keys on 3 workers: every key runs, never twice at once, and no more than 3 passes overlap."""
    active: set[Hashable] = set()
    runs: Counter[Hashable] = Counter()
    most = [0]
    lock = threading.Lock()

    def run(key: Hashable) -> bool:
        with lock:
            assert key not in active
            active.add(key)
            most[0] = max(most[0], len(active))
        time.sleep(0.005)
        with lock:
            active.discard(key)
            runs[key] += 1
        return True

    q = WorkQueue(run, workers=3, interval_s=0.05)
    q.start()
    try:
        for i in range(50):
            q.add(i)
            q.add(i)  # a second add of a queued key does not run it twice
        wait_for("every key ran at least twice", lambda: len(runs) == 50 and min(runs.values()) >= 2, timeout_s=30)
    finally:
        q.stop()
    assert most[0] <= 3


def test_add_while_running_runs_again_right_after() -> None:
    started, release = threading.Event(), threading.Event()
    runs: list[float] = []

    def run(_key: Hashable) -> bool:
        runs.append(time.monotonic())
        if len(runs) == 1:
            started.set()
            release.wait(10)
        return True

    q = WorkQueue(run, workers=2, interval_s=3600.0)
    q.start()
    try:
        q.add("a")
        assert started.wait(10)
        q.add("a")  # dirty: not a second concurrent run, but one more right after this one
        time.sleep(0.2)
        assert len(runs) == 1
        release.set()
        wait_for("the dirty re-run", lambda: len(runs) == 2, timeout_s=10)
    finally:
        q.stop()


def test_failures_back_off_and_success_resets() -> None:
    calls: list[float] = []

    def run(_key: Hashable) -> bool:
        calls.append(time.monotonic())
        if len(calls) <= 3:
            raise RuntimeError("API server unreachable")
        return True

    q = WorkQueue(run, workers=1, interval_s=3600.0, backoff_base_s=0.2, backoff_max_s=0.6)
    q.start()
    try:
        q.add("a")
        wait_for("three failures then a success", lambda: len(calls) == 4, timeout_s=20)
        assert q.failures("a") == 0
    finally:
        q.stop()
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    # retry n waits backoff_delay(n) in [0.5, 1] x min(0.6, 0.2 * 2**(n-1)): [0.1, 0.2], [0.2, 0.4], [0.3, 0.6]
    for gap, (lo, hi) in zip(gaps, [(0.1, 0.2), (0.2, 0.4), (0.3, 0.6)], strict=True):
        assert lo - 0.01 <= gap <= hi + 0.5, gaps  # + scheduling slack on a loaded machine


def test_false_and_forget_drop_the_key() -> None:
    runs: Counter[Hashable] = Counter()

    def run(key: Hashable) -> bool:
        runs[key] += 1
        return key != "gone"

    q = WorkQueue(run, workers=1, interval_s=0.05)
    q.start()
    try:
        q.add("gone")
        q.add("kept")
        wait_for("kept runs on", lambda: runs["kept"] >= 5, timeout_s=10)
        assert runs["gone"] == 1
        q.forget("kept")
        time.sleep(0.2)  # at most the pass in flight finishes
        after = runs["kept"]
        time.sleep(0.3)
        assert runs["kept"] == after and len(q) == 0
    finally:
        q.stop()
