"""Speed guards that hold under load: a budget of this process's CPU time, not of wall time.

"Is fast" tests catch a blow-up (a quadratic loop, catastrophic backtracking). Wall time also counts
the time other processes hold the cores, so on a shared or loaded machine such a test fails with no
change in the code; the process's CPU time (`time.process_time`, all its threads) does not.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def cpu_budget(seconds: float, what: str = "the block") -> Iterator[None]:
    """Fail if the block used more than `seconds` of this process's CPU time."""
    start = time.process_time()
    yield
    used = time.process_time() - start
    assert used < seconds, f"{what} used {used:.2f} s of CPU time (budget {seconds} s)"
