"""Work split between a thread pool and the calling thread, by size."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

INLINE_BYTES = 1 << 20
"""Chunks smaller than this are encoded and checksummed in the calling thread (a model of many small tensors
spends more on thread hand-offs than on the work: 45 ms per version of the 3.5 MB tiny model)."""


def in_pool(pool: ThreadPoolExecutor, fn: Callable[[T], R], items: list[T], size: Callable[[T], int]) -> list[R]:
    """`[fn(x) for x in items]`, the items of at least INLINE_BYTES in `pool`, the others in this thread."""
    futures = {i: pool.submit(fn, x) for i, x in enumerate(items) if size(x) >= INLINE_BYTES}
    return [futures[i].result() if i in futures else fn(x) for i, x in enumerate(items)]
