"""Evaluation of a policy: held-out mean@k during training, and test-time scaling (`scalerl eval`).

Test-time scaling lives in `metrics` (pass@k, mean@k, maj@k, best-of-N, bootstrap CIs: re-exported
here), `strategies` (those metrics over n samples per problem, with their cost), `scorer` (the `Scorer`
interface and the learned outcome scorer), `unique_search` (Countdown tree search drawing chains
without replacement) and `tree_search` (Countdown beam search), both run by `tree_eval`, `frontier`
(train-time vs test-time compute), and `commands` (the CLI). Names are imported on first use
(`scalerl.lazy`), so the CLI's help does not load torch.
"""

from typing import TYPE_CHECKING

from scalerl.lazy import lazy_exports

if TYPE_CHECKING:
    from scalerl.evaluation.heldout import EvalResult, evaluate_mean_at_k
    from scalerl.evaluation.metrics import (
        best_of_n,
        bootstrap_ci,
        maj_at_k,
        majority_vote,
        mean_at_k,
        normalize_answer,
        oracle_best_of_n,
        paired_gain,
        pass_at_k,
        pass_at_k_curve,
    )
    from scalerl.evaluation.scorer import Scorer, Scores

_METRICS = ("best_of_n", "bootstrap_ci", "maj_at_k", "majority_vote", "mean_at_k", "normalize_answer",
            "oracle_best_of_n", "paired_gain", "pass_at_k", "pass_at_k_curve")
_EXPORTS = {"EvalResult": "heldout", "evaluate_mean_at_k": "heldout", "Scorer": "scorer", "Scores": "scorer",
            **dict.fromkeys(_METRICS, "metrics")}
__getattr__ = lazy_exports(__name__, _EXPORTS)

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
    "paired_gain",
    "pass_at_k",
    "pass_at_k_curve",
]
