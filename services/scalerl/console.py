"""What the terminal shows besides our own lines: progress bars (tqdm: count, rate and ETA) that vanish when
progress is off, and third-party bars and notices kept off it. One place, so every long loop looks the same;
below `runtime` and `evaluation`, which both draw bars. Imports transformers only in `quiet_third_party_bars`."""

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


# Deprecation notices of transformers about arguments it passes itself (e.g. "`past_key_values` is
# deprecated and will be removed in version 5.40.0 for `LlamaModel.forward`. Use `cache` instead."),
# attributed by their stacklevel to torch's Module.__call__ or to transformers: nothing a user can act on.
THIRD_PARTY_DEPRECATIONS = r".*(is|are) deprecated.*"
THIRD_PARTY_MODULES = r"(transformers|torch\.nn\.modules\.module)(\..*)?$"


def quiet_third_party_bars() -> None:
    """Hide transformers' own bars ("Loading weights", "Writing model shards") and its notices: ours say
    what runs. Only FutureWarning/DeprecationWarning attributed to transformers or torch's Module call
    are dropped, and transformers' logger keeps its errors; every other warning (ours included) shows.
    transformers is not imported for this (a role that never loads a model starts seconds sooner): its
    settings go into the environment it reads at import, and are applied directly when it is loaded."""
    import os
    import warnings

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # "[transformers] `past_key_values`... deprecated"
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # its tqdm bars follow huggingface_hub's switch
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    for category in (FutureWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", message=THIRD_PARTY_DEPRECATIONS, category=category,
                                module=THIRD_PARTY_MODULES)


class Progress:
    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled

    def bar(self, desc: str, total: int, *, unit: str = "it", leave: bool = True, initial: int = 0) -> _Bar:
        if not self.enabled:
            return _Bar(None)
        return _Bar(tqdm(total=total, desc=desc, unit=unit, leave=leave, initial=initial, file=sys.stderr,
                         dynamic_ncols=True, mininterval=0.5, smoothing=0.1))
