"""Test-time-scaling metrics (spec §7): pass@k, mean@k, majority vote (maj@k), best-of-N, bootstrap CIs.

All functions are pure: no I/O, no model, no torch. They take what the evaluation loop already has
per problem (the n samples' correctness, extracted answers, verifier scores) and return numbers.

Definitions, for one problem with n sampled completions of which c are correct:

- **mean@k** (`mean_at_k`): the fraction of the k samples that are correct, c / k. This is the
  ScaleRL held-out metric (spec §1.2) and the expected pass@1.
- **pass@k** (`pass_at_k`): the probability that at least one of k samples drawn without replacement
  from the n is correct, the unbiased estimator of Chen et al. 2021 (arXiv 2107.03374):
  ``1 - C(n-c, k) / C(n, k)``.
- **maj@k** (`maj_at_k`): whether the most frequent (normalised) final answer among k samples is
  correct: self-consistency (Wang et al. 2023, spec §7.1).
- **best-of-N** (`best_of_n`): the candidate a verifier scores highest (spec §7.2);
  `oracle_best_of_n` is its upper bound, a perfect verifier: correct if any candidate is.

Per-problem values are averaged over problems; `bootstrap_ci` gives a percentile-bootstrap confidence
interval for that average, resampling problems. `paired_gain` does the same for the change of a
per-problem metric between two evaluations of the same problems (a run's step 0 and its last eval).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from fractions import Fraction
from typing import TypeVar

import numpy as np

T = TypeVar("T")

__all__ = [
    "best_of_n",
    "bootstrap_ci",
    "maj_at_k",
    "majority_vote",
    "mean_at_k",
    "normalize_answer",
    "oracle_best_of_n",
    "paired_gain",
    "pass_at_k",
    "pass_at_k_curve",
]


# --------------------------------------------------------------------------------------------- pass@k


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from `n` samples of which `c` are correct (Chen et al. 2021).

    pass@k = 1 - C(n-c, k) / C(n, k), the probability that a uniformly random k-subset of the n
    samples contains at least one correct one. Computed without binomials as

        C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)

    (c factors, each in [0, 1)), so it is stable for n in the thousands. When n - c < k every
    k-subset holds a correct sample and the result is exactly 1.0; when c == 0 it is exactly 0.0.
    For k == 1 it equals c / n (mean@n).

    Raises ValueError unless 1 <= k <= n and 0 <= c <= n.
    """
    if k < 1:
        raise ValueError(f"pass@k needs k >= 1, got k={k}")
    if k > n:
        raise ValueError(f"pass@k needs at least k samples: k={k} > n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"the number of correct samples must be in [0, n={n}], got c={c}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def pass_at_k_curve(ns_and_cs: Iterable[tuple[int, int]], ks: Iterable[int]) -> dict[int, float]:
    """pass@k averaged over problems, for each k in `ks`: {k: mean_p pass_at_k(n_p, c_p, k)}.

    `ns_and_cs` holds one (n, c) pair per problem; problems may have different n, but every k must
    be <= every n (else `pass_at_k` raises ValueError). Raises ValueError when there are no problems.
    The dict keeps the order of `ks`.
    """
    problems = list(ns_and_cs)
    if not problems:
        raise ValueError("pass_at_k_curve needs at least one problem")
    return {k: sum(pass_at_k(n, c, k) for n, c in problems) / len(problems) for k in ks}


def mean_at_k(correct: Sequence[bool]) -> float:
    """mean@k: the fraction of the k samples that are correct (plain accuracy). ValueError if empty."""
    if len(correct) == 0:
        raise ValueError("mean@k needs at least one sample")
    return sum(bool(x) for x in correct) / len(correct)


# -------------------------------------------------------------------------------------- majority vote

_WS = re.compile(r"\s+")
_INT = r"\d{1,3}(?:,\d{3})+|\d+"  # 1,000,000 (valid thousands grouping only) or plain digits
_DECIMAL = re.compile(rf"([+-]?)((?:{_INT})(?:\.\d*)?|\.\d+)")
_FRACTION = re.compile(rf"([+-]?)({_INT})\s*/\s*({_INT})")
_LATEX_FRAC = re.compile(r"([+-]?)\\[dt]?frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}")


def _canonical_number(s: str) -> str | None:
    """The canonical spelling of `s` if it is a plain number, else None (see `normalize_answer`)."""
    if m := _DECIMAL.fullmatch(s):
        # by hand rather than via Decimal, whose context would round long numbers to 28 digits
        whole, _, frac = m.group(2).replace(",", "").partition(".")
        whole, frac = whole.lstrip("0") or "0", frac.rstrip("0")
        digits = f"{whole}.{frac}" if frac else whole
        return "0" if digits == "0" else ("-" if m.group(1) == "-" else "") + digits
    if m := _FRACTION.fullmatch(s) or _LATEX_FRAC.fullmatch(s):
        try:
            num, den = int(m.group(2).replace(",", "")), int(m.group(3).replace(",", ""))
            return None if den == 0 else str(Fraction(-num if m.group(1) == "-" else num, den))
        except ValueError:  # beyond Python's int <-> str digit limit: keep the text as it is
            return None
    return None


def normalize_answer(ans: str | None) -> str | None:
    r"""Canonical form of an extracted final answer, so that equal answers vote together.

    1. None, or a string empty after the steps below, gives None.
    2. Strip, collapse runs of whitespace to one space, drop trailing periods and surrounding `$`.
    3. If what is left is a plain number, write it canonically:
       - decimals: thousands commas and a `+` sign removed, trailing zeros and leading zeros dropped
         ("1,000" -> "1000", "0.50" -> "0.5", "+3" -> "3", "2.0" -> "2", ".5" -> "0.5", "-0" -> "0");
         commas count as thousands separators only in valid groups, so "1,2" (a pair) is kept;
       - fractions p/q of integers (also `\frac{p}{q}`, `\dfrac`, `\tfrac`) reduced to lowest terms:
         "1/2" stays "1/2", "2/4" -> "1/2", "-6/4" -> "-3/2", "4/2" -> "2"; "x/0" is left alone.
       Decimals and fractions keep their own form: "0.5" and "1/2" stay different answers.
    4. Anything else is returned as after step 2 (case and inner spacing kept): this is a textual
       canonicalisation, not a mathematical equivalence check (use the task's `is_correct` for that).
    """
    if ans is None:
        return None
    s = _WS.sub(" ", ans).strip()
    s = s.rstrip(".").strip()
    if len(s) >= 2 and s.startswith("$") and s.endswith("$"):
        s = s.strip("$").strip().rstrip(".").strip()
    if not s:
        return None
    number = _canonical_number(s)
    return number if number is not None else s


def majority_vote(answers: Sequence[str | None],
                  normalize: Callable[[str | None], str | None] = normalize_answer) -> str | None:
    """The most frequent answer after `normalize` (default `normalize_answer`), ignoring None.

    Returns the normalised winner, or None if no answer survives normalisation. Ties are broken
    deterministically in favour of the answer whose *first occurrence* comes earliest in `answers`
    (so the result does not depend on hashing or sort order): ["b", "a", "a", "b"] -> "b".
    """
    counts: dict[str, int] = {}  # insertion order == order of first occurrence
    for a in answers:
        key = normalize(a)
        if key is not None:
            counts[key] = counts.get(key, 0) + 1
    best: str | None = None
    best_count = 0
    for key, count in counts.items():
        if count > best_count:  # strict: an equal count later in the order never wins
            best, best_count = key, count
    return best


def maj_at_k(answers: Sequence[str | None], reference: str, is_correct: Callable[[str, str], bool]) -> bool:
    """maj@k: whether the majority answer of the k `answers` is correct.

    `is_correct(answer, reference)` decides correctness of the (normalised) winning answer, e.g.
    `scalerl.tasks.math_answer.math_equal`. If no answer was extracted at all the result is False.
    """
    winner = majority_vote(answers)
    return winner is not None and bool(is_correct(winner, reference))


# ---------------------------------------------------------------------------------------- best-of-N


def best_of_n(scores: Sequence[float], candidates: Sequence[T]) -> T:
    """The candidate with the highest verifier score; ties go to the earliest candidate.

    Raises ValueError if the lengths differ, there are no candidates, or a score is NaN.
    """
    if len(scores) != len(candidates):
        raise ValueError(f"{len(scores)} scores for {len(candidates)} candidates")
    if len(candidates) == 0:
        raise ValueError("best_of_n needs at least one candidate")
    if any(math.isnan(s) for s in scores):
        raise ValueError("best_of_n got a NaN score")
    best = 0
    for i in range(1, len(scores)):
        if scores[i] > scores[best]:  # strict: equal scores keep the earlier candidate
            best = i
    return candidates[best]


def oracle_best_of_n(correct: Sequence[bool]) -> bool:
    """Best-of-N with a perfect verifier: correct iff any of the N candidates is (the upper bound of
    `best_of_n`; averaged over problems it is the empirical pass@N). ValueError if empty."""
    if len(correct) == 0:
        raise ValueError("oracle_best_of_n needs at least one candidate")
    return any(correct)


# ---------------------------------------------------------------------------------------- bootstrap

_BOOTSTRAP_CHUNK = 1 << 20  # resampled values per batch, to bound memory for large problem sets


def bootstrap_ci(values: Sequence[float] | np.ndarray, n_resamples: int = 1000, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval for the mean of per-problem metric `values`.

    Draws `n_resamples` resamples of the problems with replacement (numpy Generator seeded with
    `seed`, so the result is deterministic), takes each resample's mean, and returns the
    (1 - level) / 2 and (1 + level) / 2 quantiles of those means. A single value gives (v, v).

    Raises ValueError if `values` is empty or non-finite, n_resamples < 1, or level is not in (0, 1).
    """
    arr = np.asarray(values, dtype=np.float64).ravel()
    if arr.size == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    if not np.all(np.isfinite(arr)):
        raise ValueError("bootstrap_ci got a NaN or infinite value")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    rng = np.random.default_rng(seed)
    n = arr.size
    per_chunk = max(1, _BOOTSTRAP_CHUNK // n)
    means = np.empty(n_resamples, dtype=np.float64)
    for start in range(0, n_resamples, per_chunk):
        stop = min(start + per_chunk, n_resamples)
        idx = rng.integers(0, n, size=(stop - start, n))
        means[start:stop] = arr[idx].mean(axis=1)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def paired_gain(before: Sequence[float], after: Sequence[float], n_resamples: int = 1000, seed: int = 0,
                level: float = 0.95) -> tuple[float, float, float]:
    """(mean gain, lo, hi): the mean over problems of after_i − before_i and its percentile-bootstrap
    interval, resampling problems with their pair of values (paired: the problem-to-problem spread that
    both evaluations share cancels). before, after: [n] per-problem values of the same problems, in the
    same order. Raises ValueError when the lengths differ (or as `bootstrap_ci` does)."""
    if len(before) != len(after):
        raise ValueError(f"paired_gain needs the same problems: {len(before)} values before, {len(after)} after")
    diff = np.asarray(after, dtype=np.float64) - np.asarray(before, dtype=np.float64)
    lo, hi = bootstrap_ci(diff, n_resamples=n_resamples, seed=seed, level=level)
    return float(diff.mean()), lo, hi
