"""Evaluation of a policy on held-out prompts (mean@k; test-time scaling builds on it)."""

from scalerl.evaluation.heldout import EvalResult, evaluate_mean_at_k
from scalerl.evaluation.metrics import (
    best_of_n,
    bootstrap_ci,
    maj_at_k,
    majority_vote,
    mean_at_k,
    normalize_answer,
    oracle_best_of_n,
    pass_at_k,
    pass_at_k_curve,
)

__all__ = [
    "EvalResult",
    "best_of_n",
    "bootstrap_ci",
    "evaluate_mean_at_k",
    "maj_at_k",
    "majority_vote",
    "mean_at_k",
    "normalize_answer",
    "oracle_best_of_n",
    "pass_at_k",
    "pass_at_k_curve",
]
