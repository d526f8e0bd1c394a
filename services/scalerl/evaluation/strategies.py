"""Test-time strategies over n sampled completions per problem: accuracy and cost at each k (pure).

Every strategy that selects from k samples is evaluated from the same n ≥ k samples per problem:

| strategy    | metric at k                                                        | needs                  |
|-------------|--------------------------------------------------------------------|------------------------|
| `sample`    | pass@k, unbiased (`metrics.pass_at_k`): the oracle best-of-k        | the rule verifier      |
| `majority`  | maj@k: the most frequent normalised answer of k samples is correct  | answer extraction      |
| `best-of-n` | the sample a scorer rates highest among k is correct                | a `Scorer` (no answer) |
| `random`    | a uniformly random sample of the k is correct (= mean@1)            | nothing (baseline)     |
| `verified`  | pass@k when samples are drawn one by one until the verifier accepts | a reference-free check |

maj@k and best-of-k are averaged over k-subsets of the n samples: all of them when there are at most
`subsets` (exact), else `subsets` random ones (seeded). `verified` is exact over random orders.

Cost is counted per problem, in tokens: `gen_tokens` is the expected number of completion tokens the
strategy generates (k × the problem's mean completion length; for `verified` the expected tokens until
the first accepted sample), `thinking_tokens` the thinking part of those, `scorer_tokens` the tokens
the scorer reads (prompt + completion per candidate). Forced tokens (interruption phrase, "Wait")
count as generated: each costs a decode step.

Legend: n = samples per problem, k = samples a strategy may use, S = subsets.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from scalerl.evaluation.metrics import bootstrap_ci, majority_vote, pass_at_k

DEFAULT_SUBSETS = 64


@dataclass(slots=True)
class ProblemSamples:
    """n completions of one problem with the rule verifier's verdicts; lists are all length n."""

    problem_id: str
    answers: list[str | None]
    """Final answers as extracted by the task (before normalisation); None when there is none."""
    correct: list[bool]
    tokens: list[int]
    """Completion tokens per sample (forced tokens included)."""
    thinking_tokens: list[int]
    scores: list[float] | None = None
    """A scorer's rating per sample (higher = more likely correct), when one was run."""
    scorer_tokens: list[int] | None = None
    prompt: str = ""
    reference: str = ""
    texts: list[str] = field(default_factory=list, repr=False)
    """The completions' text (what a scorer reads with the prompt)."""
    forced_tokens: list[int] = field(default_factory=list)
    """Tokens per sample the policy did not choose (interruption phrase, budget forcing)."""
    finish: list[str] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.correct)


@dataclass(slots=True)
class StrategyPoint:
    """One strategy at one k: accuracy (fraction of problems) with a bootstrap CI, and cost per problem."""

    strategy: str
    k: int
    accuracy: float
    ci_low: float
    ci_high: float
    gen_tokens: float
    """Expected generated tokens per problem."""
    thinking_tokens: float
    scorer_tokens: float = 0.0
    per_problem: list[float] = field(default_factory=list, repr=False)
    extra: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "k": self.k, "accuracy": self.accuracy, "ci_low": self.ci_low,
                "ci_high": self.ci_high, "gen_tokens_per_problem": self.gen_tokens,
                "thinking_tokens_per_problem": self.thinking_tokens,
                "scorer_tokens_per_problem": self.scorer_tokens, **self.extra}


def renamed(p: StrategyPoint, name: str) -> StrategyPoint:
    """The same point under another strategy name (greedy, oracle, verified-calc)."""
    p.strategy = name
    return p


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _point(strategy: str, k: int, per_problem: list[float], problems: Sequence[ProblemSamples], *,
           gen_tokens: float | None = None, scorer: bool = False, seed: int = 0) -> StrategyPoint:
    lo, hi = bootstrap_ci(per_problem, n_resamples=1000, seed=seed)
    gen = gen_tokens if gen_tokens is not None else _mean([k * _mean(p.tokens) for p in problems])
    return StrategyPoint(
        strategy=strategy, k=k, accuracy=_mean(per_problem), ci_low=lo, ci_high=hi, gen_tokens=gen,
        thinking_tokens=_mean([k * _mean(p.thinking_tokens) for p in problems]),
        scorer_tokens=_mean([k * _mean(p.scorer_tokens or [0]) for p in problems]) if scorer else 0.0,
        per_problem=per_problem)


def k_subsets(n: int, k: int, *, subsets: int, rng: random.Random) -> list[tuple[int, ...]]:
    """All k-subsets of range(n) (as sorted index tuples) when there are at most `subsets` of them,
    else `subsets` uniformly random ones. ValueError unless 1 <= k <= n."""
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, n={n}], got {k}")
    if math.comb(n, k) <= subsets:
        return list(itertools.combinations(range(n), k))
    return [tuple(sorted(rng.sample(range(n), k))) for _ in range(subsets)]


def _check(problems: Sequence[ProblemSamples], ks: Sequence[int]) -> None:
    if not problems:
        raise ValueError("no problems to evaluate")
    n_min = min(p.n for p in problems)
    if not ks or min(ks) < 1 or max(ks) > n_min:
        raise ValueError(f"every k must be in [1, {n_min}] (the fewest samples of a problem), got {list(ks)}")


def _over_subsets(problems: Sequence[ProblemSamples], k: int, pick: Callable[[ProblemSamples, tuple[int, ...]], float],
                  *, subsets: int, seed: int) -> list[float]:
    rng = random.Random(f"{seed}/{k}")
    return [_mean([pick(p, s) for s in k_subsets(p.n, k, subsets=subsets, rng=rng)]) for p in problems]


def sample_points(problems: Sequence[ProblemSamples], ks: Sequence[int], *, seed: int = 0) -> list[StrategyPoint]:
    """pass@k (unbiased): whether any of k samples is correct, i.e. best-of-k with a perfect verifier."""
    _check(problems, ks)
    return [_point("sample", k, [pass_at_k(p.n, sum(p.correct), k) for p in problems], problems, seed=seed)
            for k in ks]


def random_points(problems: Sequence[ProblemSamples], ks: Sequence[int], *, seed: int = 0) -> list[StrategyPoint]:
    """Random selection among k samples: its expected accuracy is the problem's mean@n at every k."""
    _check(problems, ks)
    return [_point("random", k, [sum(p.correct) / p.n for p in problems], problems, seed=seed) for k in ks]


def majority_points(problems: Sequence[ProblemSamples], ks: Sequence[int],
                    is_correct: Callable[[ProblemSamples, str], bool], *, subsets: int = DEFAULT_SUBSETS,
                    seed: int = 0) -> list[StrategyPoint]:
    """maj@k. `is_correct(problem, winner)` judges the winning normalised answer (the task's check on
    that answer text); no winner (no sample has an answer) counts as wrong."""
    _check(problems, ks)

    def pick(p: ProblemSamples, subset: tuple[int, ...]) -> float:
        winner = majority_vote([p.answers[i] for i in subset])
        return float(winner is not None and is_correct(p, winner))

    return [_point("majority", k, _over_subsets(problems, k, pick, subsets=subsets, seed=seed), problems, seed=seed)
            for k in ks]


def best_of_n_points(problems: Sequence[ProblemSamples], ks: Sequence[int], *, subsets: int = DEFAULT_SUBSETS,
                     seed: int = 0, name: str = "best-of-n") -> list[StrategyPoint]:
    """Best-of-k by the problems' `scores`: the highest-rated of k samples (ties: the earliest)."""
    _check(problems, ks)
    if any(p.scores is None for p in problems):
        raise ValueError("best-of-n needs a scorer's scores on every problem")

    def pick(p: ProblemSamples, subset: tuple[int, ...]) -> float:
        scores = p.scores or []
        best = max(subset, key=lambda i: (scores[i], -i))
        return float(p.correct[best])

    return [_point(name, k, _over_subsets(problems, k, pick, subsets=subsets, seed=seed), problems, scorer=True,
                   seed=seed) for k in ks]


def paid_probability(n: int, blockers: int, k: int) -> float:
    """P(a given sample is drawn) when n samples are drawn in random order until one of `blockers` other
    samples (the correct ones) has been drawn, or k have: its position p is uniform in 1..n and it is
    drawn iff p <= k and every blocker comes after it:  (1/n) * sum_{p=1..k} C(n-p, b) / C(n-1, b)."""
    return sum(math.comb(n - p, blockers) for p in range(1, k + 1)) / (n * math.comb(n - 1, blockers))


def verified_points(problems: Sequence[ProblemSamples], ks: Sequence[int], *, seed: int = 0) -> list[StrategyPoint]:
    """Sampling with a reference-free verifier (Countdown: the target is in the prompt), one sample at a
    time until one is accepted or k are spent. Accuracy is pass@k; the cost is the exact expected number
    of tokens generated before stopping, over random orders of the n samples (`paid_probability`)."""
    _check(problems, ks)
    out = []
    for k in ks:
        costs, thinking = [], []
        for p in problems:
            c = sum(p.correct)
            paid = [paid_probability(p.n, c - ok, k) for ok in p.correct]
            costs.append(sum(q * t for q, t in zip(paid, p.tokens, strict=True)))
            thinking.append(sum(q * t for q, t in zip(paid, p.thinking_tokens, strict=True)))
        pt = _point("verified", k, [pass_at_k(p.n, sum(p.correct), k) for p in problems], problems,
                    gen_tokens=_mean(costs), seed=seed)
        pt.thinking_tokens = _mean(thinking)
        out.append(pt)
    return out


def interpolate_accuracy(points: Sequence[StrategyPoint], gen_tokens: float) -> float | None:
    """Accuracy of a strategy's curve at `gen_tokens` per problem, linear in log(tokens) between the
    two points around it; None outside the measured range."""
    pts = sorted(points, key=lambda p: p.gen_tokens)
    for a, b in itertools.pairwise(pts):
        if a.gen_tokens <= gen_tokens <= b.gen_tokens:
            if b.gen_tokens == a.gen_tokens:
                return max(a.accuracy, b.accuracy)
            t = (math.log(gen_tokens) - math.log(a.gen_tokens)) / (math.log(b.gen_tokens) - math.log(a.gen_tokens))
            return a.accuracy + t * (b.accuracy - a.accuracy)
    if pts and math.isclose(pts[0].gen_tokens, gen_tokens):
        return pts[0].accuracy
    return None
