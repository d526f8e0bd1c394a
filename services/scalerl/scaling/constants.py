"""Constants of the scaling fits that the CLI needs without importing numpy (see `scalerl.lazy`)."""

A_MARGIN = 0.02
"""Error margin on A (spec §1.4): three independent ScaleRL runs gave A within ±0.015, so the paper
treats two A values within 0.02 as equal and then compares B at a shared A."""

A_AT_BOUND = 0.999
"""A fitted ceiling at or above this sits at the fits' upper bound A ≤ 1.0: the points have not bent over
yet, so the ceiling is not identified (the value is the bound, not a measurement)."""
