"""Evaluation of a policy on held-out prompts (mean@k; test-time scaling builds on it)."""

from scalerl.evaluation.heldout import EvalResult, evaluate_mean_at_k

__all__ = ["EvalResult", "evaluate_mean_at_k"]
