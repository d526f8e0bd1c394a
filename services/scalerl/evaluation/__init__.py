"""Evaluation of a policy: held-out mean@k during training, and test-time scaling (`scalerl eval`).

Test-time scaling lives in `strategies` (pass@k, maj@k, best-of-N, sampling with a verifier),
`scorer` (the `Scorer` interface and the learned outcome scorer), `tree_search` (Countdown beam search),
`frontier` (train-time vs test-time compute), and `commands` (the CLI).
"""

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
from scalerl.evaluation.scorer import Scorer, Scores

__all__ = [
    "EvalResult",
    "Scorer",
    "Scores",
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
