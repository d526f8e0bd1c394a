"""Progress bars (tqdm: count, rate and ETA) that vanish when progress is off or output is not a TTY
and `force` is not set. One place, so every long loop looks the same."""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm


class _Bar:
    def __init__(self, bar: tqdm | None) -> None:
        self._bar = bar

    def update(self, n: int = 1, **postfix: Any) -> None:
        if self._bar is not None:
            if postfix:
                self._bar.set_postfix(postfix, refresh=False)
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def quiet_third_party_bars() -> None:
    """Hide transformers' own bars ("Loading weights", "Writing model shards"): ours say what runs."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


class Progress:
    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled

    def bar(self, desc: str, total: int, *, unit: str = "it", leave: bool = True, initial: int = 0) -> _Bar:
        if not self.enabled:
            return _Bar(None)
        return _Bar(tqdm(total=total, desc=desc, unit=unit, leave=leave, initial=initial, file=sys.stderr,
                         dynamic_ncols=True, mininterval=0.5, smoothing=0.1))
