"""Evaluation of a policy: held-out mean@k during training, and test-time scaling (`scalerl eval`).

Test-time scaling lives in `metrics` (pass@k, mean@k, maj@k, best-of-N, bootstrap CIs: re-exported
here), `strategies` (those metrics over n samples per problem, with their cost), `scorer` (the `Scorer`
interface and the learned outcome scorer), `unique_search` (Countdown tree search drawing chains
without replacement) and `tree_search` (Countdown beam search), both run by `tree_eval`, `frontier`
(train-time vs test-time compute), and `commands` (the CLI).
"""

from scalerl.evaluation import metrics
from scalerl.evaluation.heldout import EvalResult, evaluate_mean_at_k
from scalerl.evaluation.metrics import *  # noqa: F403  (its __all__, re-exported)
from scalerl.evaluation.scorer import Scorer, Scores

__all__ = ["EvalResult", "Scorer", "Scores", "evaluate_mean_at_k", *metrics.__all__]
