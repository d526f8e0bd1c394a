"""Train-time vs test-time compute: the iso-compute frontier of a run's checkpoints (pure).

Jones 2021 ("Scaling Scaling Laws with Board Games") asks, for a fixed total compute, how to split it
between training and test-time search. Here, for checkpoint s and k samples per problem:

    total(s, k) = RL compute of s  +  inference device-hours per problem at k  ×  problems served

RL compute is the run's own clock (`compute` of metrics.jsonl, device-hours, evaluation excluded);
inference device-hours per problem are measured: the eval's generation wall time per generated token
(× devices; `scalerl eval` uses the median over the checkpoints, which share one architecture) × the
strategy's tokens per problem at k. The frontier is the best accuracy reachable at
each total; `train_or_sample` answers, for a budget, whether the best configuration within it samples
more than once (then "sample more": a less-trained checkpoint with k samples beats spending that
compute on training) or not ("train more").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ComputePoint:
    step: int
    k: int
    accuracy: float
    rl_device_hours: float
    inference_device_hours: float
    """For all `problems` served."""

    @property
    def total_device_hours(self) -> float:
        return self.rl_device_hours + self.inference_device_hours

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total_device_hours": self.total_device_hours}


@dataclass(frozen=True, slots=True)
class CheckpointCurve:
    """One checkpoint's accuracy at each k, with what it cost."""

    step: int
    rl_device_hours: float
    device_hours_per_token: float
    """Measured inference cost of one generated token (devices × wall hours / tokens)."""
    ks: tuple[int, ...]
    accuracy: tuple[float, ...]
    gen_tokens_per_problem: tuple[float, ...]


def compute_points(curves: Sequence[CheckpointCurve], *, problems: int) -> list[ComputePoint]:
    """Every (checkpoint, k) as a point of total compute (device-hours) and accuracy."""
    if problems < 1:
        raise ValueError(f"problems served must be >= 1, got {problems}")
    out = []
    for c in curves:
        for k, acc, tok in zip(c.ks, c.accuracy, c.gen_tokens_per_problem, strict=True):
            out.append(ComputePoint(step=c.step, k=k, accuracy=acc, rl_device_hours=c.rl_device_hours,
                                    inference_device_hours=tok * c.device_hours_per_token * problems))
    return out


def pareto_frontier(points: Sequence[ComputePoint]) -> list[ComputePoint]:
    """The points no other point beats with less or equal total compute, by increasing total."""
    frontier: list[ComputePoint] = []
    for p in sorted(points, key=lambda p: (p.total_device_hours, -p.accuracy)):
        if not frontier or p.accuracy > frontier[-1].accuracy:
            frontier.append(p)
    return frontier


def _slope(a: ComputePoint, b: ComputePoint | None) -> float | None:
    if b is None or b.total_device_hours <= a.total_device_hours:
        return None
    return (b.accuracy - a.accuracy) / (b.total_device_hours - a.total_device_hours)


def train_or_sample(points: Sequence[ComputePoint], budget_device_hours: float) -> dict[str, Any]:
    """The answer for one budget: the best configuration within it, the best that samples once, and
    the marginal gains (accuracy per device-hour) of the next checkpoint vs the next k from the best.

    `answer` is "sample more" when the best configuration uses more than the fewest samples, "train
    more" when it does not; "over budget" when nothing fits.
    """
    fits = [p for p in points if p.total_device_hours <= budget_device_hours]
    if not fits:
        return {"budget_device_hours": budget_device_hours, "answer": "over budget", "best": None}
    best = max(fits, key=lambda p: (p.accuracy, -p.total_device_hours))
    k_min = min(p.k for p in points)
    once = [p for p in fits if p.k == k_min]
    train_only = max(once, key=lambda p: (p.accuracy, -p.total_device_hours)) if once else None
    steps = sorted({p.step for p in points})
    ks = sorted({p.k for p in points})
    by_key = {(p.step, p.k): p for p in points}
    nxt_step = next((s for s in steps if s > best.step), None)
    nxt_k = next((k for k in ks if k > best.k), None)
    more_training = by_key.get((nxt_step, best.k)) if nxt_step is not None else None
    more_samples = by_key.get((best.step, nxt_k)) if nxt_k is not None else None
    answer = "sample more" if best.k > k_min else "train more"
    return {
        "budget_device_hours": budget_device_hours,
        "answer": answer,
        "best": best.to_dict(),
        "best_sampling_once": train_only.to_dict() if train_only else None,
        "gain_over_sampling_once": best.accuracy - train_only.accuracy if train_only else None,
        "marginal_accuracy_per_device_hour": {
            "next_checkpoint": _slope(best, more_training),
            "next_k": _slope(best, more_samples),
        },
    }


def frontier_report(curves: Sequence[CheckpointCurve], *, problems: int,
                    budgets: Sequence[float] | None = None) -> dict[str, Any]:
    """Points, frontier and answers. Default budgets: each checkpoint's total at the fewest samples."""
    points = compute_points(curves, problems=problems)
    k_min = min(p.k for p in points)
    if budgets is None:
        budgets = sorted({p.total_device_hours for p in points if p.k == k_min})
    return {
        "problems_served": problems,
        "points": [p.to_dict() for p in points],
        "frontier": [p.to_dict() for p in pareto_frontier(points)],
        "answers": [train_or_sample(points, b) for b in budgets],
    }
