"""Ranking runs by the paper's comparison rule (spec §1.4–§1.5). Pure; no I/O.

1. Fit every run on its own (same window and R0 rule for all).
2. If every pair of A values lies within the margin (±0.02; pairwise ⇔ max − min ≤ 0.02), the ceilings
   are indistinguishable: refit every run with A fixed to their mean and rank by B (larger B = more
   compute-efficient at the same ceiling; the paper's LOO comparison). C_mid is reported, not ranked.
3. Otherwise rank by A (the paper's priority: raise the ceiling first). Neighbours within the margin
   are flagged as ties in the reason.
4. A ranking is conclusive only when the bootstrap interval of the ranking parameter (A, or B at the
   shared A) of the first run does not overlap the second's; otherwise no winner is named (`caveat`),
   as `scalerl fit` warns for an A interval wider than the margin.

B intervals come from a bootstrap at the A used for ranking (own A, or the shared A).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from scalerl.scaling.bootstrap import LEVEL, N_RESAMPLES, bootstrap_sigmoid
from scalerl.scaling.curves import A_MARGIN, FitError, SigmoidFit
from scalerl.scaling.data import Curve, FitWindow, fit_window
from scalerl.scaling.fit import fit_sigmoid_window


@dataclass(frozen=True, slots=True, eq=False)
class RunComparison:
    """One row of the ranking table."""

    name: str
    rank: int
    """1 = best; runs with equal ranking keys share the rank (1, 1, 3: competition ranking)."""
    fit: SigmoidFit
    """The run's own fit."""
    shared_fit: SigmoidFit | None
    """The refit at the shared A (only when the rule is "shared_A")."""
    B_ci: tuple[float, float] | None
    """Bootstrap interval of B at the A used for ranking (None when n_bootstrap == 0)."""
    A_ci: tuple[float, float] | None
    """Bootstrap interval of the run's own A."""
    reason: str
    curve: Curve
    window: FitWindow
    tied: bool = False
    """Another run has the same ranking key (shown as "=rank")."""

    @property
    def ranked_fit(self) -> SigmoidFit:
        """The fit whose parameters the rank is based on."""
        return self.shared_fit or self.fit

    @property
    def ranked_ci(self) -> tuple[float, float] | None:
        """The interval of the ranking parameter: B at the shared A, else the run's own A."""
        return self.B_ci if self.shared_fit is not None else self.A_ci


@dataclass(frozen=True, slots=True, eq=False)
class Comparison:
    """The ranking. rows are ordered best first."""

    rows: tuple[RunComparison, ...]
    rule: str
    """"shared_A" (ranked by B at the shared A) or "A" (ranked by A)."""
    shared_a: float | None
    a_spread: float
    """max(A) − min(A) over the runs' own fits."""
    margin: float
    caveat: str | None = None
    """Why the ranking is not conclusive (the first two runs' intervals overlap), else None."""

    @property
    def conclusive(self) -> bool | None:
        """False when the first two runs' intervals overlap, None without intervals (no bootstrap)."""
        if self.caveat is not None:
            return False
        return None if any(r.ranked_ci is None for r in self.rows[:2]) else True

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "conclusive": self.conclusive,
            "caveat": self.caveat,
            "shared_A": self.shared_a,
            "a_spread": self.a_spread,
            "margin": self.margin,
            "runs": [
                {
                    "name": r.name,
                    "rank": r.rank,
                    "tied": r.tied,
                    "A": r.fit.A,
                    "B": r.fit.B,
                    "C_mid": r.fit.C_mid,
                    "R0": r.fit.R0,
                    "r2": r.fit.r2,
                    "n_points": r.fit.n_points,
                    "A_ci": None if r.A_ci is None else list(r.A_ci),
                    "shared_B": None if r.shared_fit is None else r.shared_fit.B,
                    "shared_C_mid": None if r.shared_fit is None else r.shared_fit.C_mid,
                    "B_ci": None if r.B_ci is None else list(r.B_ci),
                    "reason": r.reason,
                }
                for r in self.rows
            ],
        }


def compare_curves(
    runs: Sequence[tuple[str, Curve]],
    *,
    margin: float = A_MARGIN,
    r0: float | None = None,
    min_compute: float = 0.0,
    max_compute: float | None = None,
    n_bootstrap: int = N_RESAMPLES,
    seed: int = 0,
    level: float = LEVEL,
    min_compute_fraction: float = 0.0,
) -> Comparison:
    """Rank named curves by the paper's rule (module docstring); every run gets the same window rule
    (`fit_window`'s min_compute / min_compute_fraction / max_compute). Raises FitError naming the
    failing run."""
    if len(runs) < 2:
        raise FitError(f"a comparison needs at least two runs, got {len(runs)}.")
    wins: list[FitWindow] = []
    fits: list[SigmoidFit] = []
    for name, curve in runs:
        try:
            win = fit_window(curve, r0=r0, min_compute=min_compute, max_compute=max_compute,
                             min_compute_fraction=min_compute_fraction)
            wins.append(win)
            fits.append(fit_sigmoid_window(win))
        except FitError as e:
            raise FitError(f"run {name!r}: {e}") from None
    a = np.array([f.A for f in fits])
    spread = float(a.max() - a.min())
    shared = spread <= margin + 1e-12
    shared_a = float(a.mean()) if shared else None
    shared_fits: list[SigmoidFit | None] = [
        fit_sigmoid_window(w, fixed_a=shared_a) if shared_a is not None else None for w in wins
    ]
    a_cis: list[tuple[float, float] | None] = []
    b_cis: list[tuple[float, float] | None] = []
    for i, (win, curve) in enumerate(zip(wins, (c for _, c in runs), strict=True)):
        if not n_bootstrap:
            a_cis.append(None)
            b_cis.append(None)
            continue
        r0_rates = curve.starting_prompt_rates()
        own = bootstrap_sigmoid(win, fits[i], n_resamples=n_bootstrap, seed=seed, level=level, r0_prompt_rates=r0_rates)
        a_cis.append(own.interval("A"))
        sf = shared_fits[i]
        if sf is None:
            b_cis.append(own.interval("B"))
        else:
            b = bootstrap_sigmoid(
                win,
                sf,
                n_resamples=n_bootstrap,
                seed=seed,
                level=level,
                r0_prompt_rates=r0_rates,
                fixed_a=shared_a,
            )
            b_cis.append(b.interval("B"))
    key = [(sf.B if sf is not None else f.A) for f, sf in zip(fits, shared_fits, strict=True)]
    order = sorted(range(len(runs)), key=lambda i: -key[i])
    ranks = tie_ranks([key[i] for i in order])
    names = [n for n, _ in runs]
    rows = []
    for pos, i in enumerate(order):
        rank = ranks[pos]
        twins = [names[j] for p, j in enumerate(order) if ranks[p] == rank and j != i]
        reason = (f"tied with {', '.join(map(repr, twins))} (the same ranking key)"
                  if twins else _reason(pos + 1, i, order, fits, shared_fits, names, margin))
        rows.append(
            RunComparison(
                name=runs[i][0],
                rank=rank,
                tied=bool(twins),
                fit=fits[i],
                shared_fit=shared_fits[i],
                B_ci=b_cis[i],
                A_ci=a_cis[i],
                reason=reason,
                curve=runs[i][1],
                window=wins[i],
            )
        )
    caveat = overlap_caveat(rows, level)
    if caveat is not None:  # the first row leads on the point estimate only
        rows[0] = replace(rows[0], reason=f"{rows[0].reason} as a point estimate; its interval overlaps "
                          f"{rows[1].name!r}'s: not conclusive")
    return Comparison(
        rows=tuple(rows),
        rule="shared_A" if shared else "A",
        shared_a=shared_a,
        a_spread=spread,
        margin=margin,
        caveat=caveat,
    )


def overlap_caveat(rows: Sequence[RunComparison], level: float) -> str | None:
    """Why the first run cannot be called the winner: its interval of the ranking parameter overlaps the
    second run's (the data do not separate them). None when they are apart or there are no intervals."""
    if len(rows) < 2 or rows[0].tied:
        return None  # a tie already says so
    first, second = rows[0], rows[1]
    a, b = first.ranked_ci, second.ranked_ci
    if a is None or b is None or a[0] > b[1] or b[0] > a[1]:
        return None
    what = "B at the shared A" if first.shared_fit is not None else "A"
    return (f"not conclusive: the {level:.0%} intervals of {what} of {first.name!r} [{a[0]:.3f}, {a[1]:.3f}] and "
            f"{second.name!r} [{b[0]:.3f}, {b[1]:.3f}] overlap, so these runs do not show which is better; no "
            "winner is named (more held-out prompts, seeds or compute would narrow the intervals)")


def heldout_set_warning(runs: Sequence[tuple[str, Sequence[str]]]) -> str | None:
    """A warning when the runs were not all evaluated on one held-out set, else None.

    `runs`: (name, the distinct `heldout_set` fingerprints of its eval records) per run; an empty list
    means the records do not say (older runs, other frameworks). Warns when a run changed set mid-run,
    when two runs name different sets, or when some runs name a set and others do not.
    """
    mixed = [name for name, sets in runs if len(set(sets)) > 1]
    known = {name: next(iter(sets)) for name, sets in runs if len(set(sets)) == 1}
    unknown = [name for name, sets in runs if not sets]
    if mixed:
        return (f"{', '.join(mixed)} changed held-out set during the run (eval records name several "
                "`heldout_set` fingerprints): their points are not on one test set.")
    if len(set(known.values())) > 1:
        groups = ", ".join(f"{name} {fp}" for name, fp in known.items())
        return (f"the runs were evaluated on different held-out sets ({groups}): pass rates differ by test set "
                "as well as by policy; give them the same task section (task.data_seed, sizes, kind).")
    if known and unknown:
        return (f"{', '.join(unknown)} do not record their held-out set (no `heldout_set` in the eval records), "
                "so it cannot be checked that all runs were evaluated on the same prompts.")
    return None


def tie_ranks(sorted_keys: list[float], rel_tol: float = 1e-9) -> list[int]:
    """Competition ranks of keys sorted best first: equal keys (to `rel_tol`) share a rank, the next rank
    skips (keys [3, 3, 1] -> [1, 1, 3])."""
    ranks: list[int] = []
    for pos, k in enumerate(sorted_keys):
        same = pos > 0 and math.isclose(k, sorted_keys[pos - 1], rel_tol=rel_tol, abs_tol=1e-12)
        ranks.append(ranks[-1] if same else pos + 1)
    return ranks


def _reason(
    rank: int,
    i: int,
    order: list[int],
    fits: list[SigmoidFit],
    shared_fits: list[SigmoidFit | None],
    names: list[str],
    margin: float,
) -> str:
    best = order[0]
    sf, sb = shared_fits[i], shared_fits[best]
    if sf is not None and sb is not None:
        return "highest B at the shared A" if rank == 1 else f"B {sb.B - sf.B:.3f} lower at the shared A"
    f = fits[i]
    text = "highest A" if rank == 1 else f"A {fits[best].A - f.A:.3f} lower"
    if rank > 1:
        above = order[rank - 2]
        if abs(fits[above].A - f.A) <= margin:
            text += f"; within ±{margin:g} of {names[above]!r}: a tie on A, compare the two alone to rank by B"
    return text
