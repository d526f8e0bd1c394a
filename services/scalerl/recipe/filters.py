"""Batch and curriculum filters: zero-variance filtering and No-Positive-Resampling (spec §2.6, §2.7).

Zero-variance filtering (§2.6, §6.5): a group whose G rewards are all equal has zero centred advantage
and hence zero gradient, yet under prompt averaging it would still count in the normaliser. ScaleRL
drops such groups from the loss and does **not** refill the batch (unlike DAPO dynamic sampling), so
the effective batch size varies from step to step.

No-Positive-Resampling (§2.7, §6.10, from Polaris): once a prompt's historical pass rate reaches 0.9 it
is permanently removed from later epochs; it costs generation compute and gives almost no signal.

Departures from / choices not fixed by the paper:

1. The paper writes the zero-variance condition as 0 < mean(r) < 1, which assumes 0/1 rewards. ScaleRL
   trains with ±1 rewards, so the test here is "not all rewards of the group are equal"
   (max − min > 1e-9), which is correct for any reward scale.
2. "Historical pass rate" is unspecified (last observation? cumulative? windowed?). ``PassRateHistory``
   uses the **cumulative** rate: Σ n_correct / Σ n_total over every observation of the prompt. It is
   order-independent and the most conservative choice (one lucky group cannot retire a prompt that has a
   poor record). The TRL re-implementation uses the latest group's rate instead.
3. Retirement timing is the caller's job: the curriculum must call ``npr_keep`` when it *builds the
   next epoch*, never mid-epoch, because the paper removes prompts "from later epochs" only.

Shape legend: N = completions in the batch, U = distinct groups.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from scalerl.recipe.advantages import group_ids_to_index

_EQUAL_REWARD_TOL = 1e-9  # rewards closer than this count as equal (exact for ±1 rewards)
NPR_THRESHOLD = 0.9
"""Pass rate at or above which a prompt is retired (ScaleRL §2.7, from Polaris)."""


def zero_variance_mask(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Which completions belong to a group whose rewards are not all equal.

    Args:
        rewards: ``[N]`` float rewards.
        group_ids: ``[N]`` int group labels (any integers).

    Returns:
        ``[N]`` bool, True where the sample's group has max − min > 1e-9 (keep it in the loss).
    """
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must both be [N]; got {tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        )
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=torch.bool, device=rewards.device)
    index_N, num_groups = group_ids_to_index(group_ids)
    values_N = rewards.to(torch.float64)
    max_U = values_N.new_zeros(num_groups).scatter_reduce(0, index_N, values_N, "amax", include_self=False)
    min_U = values_N.new_zeros(num_groups).scatter_reduce(0, index_N, values_N, "amin", include_self=False)
    return (max_U - min_U > _EQUAL_REWARD_TOL)[index_N]  # (N,)


def _check_threshold(threshold: float) -> None:
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1]; got {threshold}")


class PassRateHistory:
    """Cumulative per-prompt pass rates for No-Positive-Resampling (pure Python, checkpointable).

    Example::

        history = PassRateHistory()
        history.update("p1", n_correct=15, n_total=16)   # from one group of training rollouts
        history.pass_rate("p1")                          # 0.9375
        history.retired()                                # {"p1"}  (>= 0.9)
        # at the next epoch boundary only:
        prompts = npr_keep(prompts, history)
    """

    _STATE_VERSION = 1

    def __init__(self) -> None:
        self._counts: dict[str, tuple[int, int]] = {}  # prompt_id -> (Σ n_correct, Σ n_total)

    def __len__(self) -> int:
        return len(self._counts)

    def __contains__(self, prompt_id: object) -> bool:
        return prompt_id in self._counts

    def update(self, prompt_id: str, n_correct: int, n_total: int) -> None:
        """Add one observation: ``n_correct`` of ``n_total`` completions of ``prompt_id`` were correct."""
        if not 0 <= n_correct <= n_total:
            raise ValueError(f"need 0 <= n_correct <= n_total; got {n_correct}, {n_total} for {prompt_id!r}")
        correct, total = self._counts.get(prompt_id, (0, 0))
        self._counts[prompt_id] = (correct + n_correct, total + n_total)

    def pass_rate(self, prompt_id: str) -> float | None:
        """Cumulative Σ correct / Σ total, or None if the prompt has no completion recorded."""
        correct, total = self._counts.get(prompt_id, (0, 0))
        return correct / total if total > 0 else None

    def retired(self, *, threshold: float = NPR_THRESHOLD) -> set[str]:
        """Prompts whose cumulative pass rate is ≥ ``threshold``."""
        _check_threshold(threshold)
        return {
            pid
            for pid, (correct, total) in self._counts.items()
            if total > 0 and correct / total >= threshold
        }

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable snapshot: ``{"version": 1, "counts": {prompt_id: [correct, total]}}``."""
        return {
            "version": self._STATE_VERSION,
            "counts": {pid: [correct, total] for pid, (correct, total) in self._counts.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the history with a snapshot produced by ``state_dict``."""
        if state.get("version") != self._STATE_VERSION:
            raise ValueError(f"unsupported PassRateHistory state version {state.get('version')!r}")
        counts: dict[str, tuple[int, int]] = {}
        for pid, (correct, total) in state["counts"].items():
            if not 0 <= int(correct) <= int(total):
                raise ValueError(f"corrupt counts for {pid!r}: {correct}/{total}")
            counts[str(pid)] = (int(correct), int(total))
        self._counts = counts


def npr_keep(
    prompt_ids: list[str], history: PassRateHistory, *, threshold: float = NPR_THRESHOLD
) -> list[str]:
    """The prompts still eligible for sampling (order and duplicates kept); call at epoch boundaries only.

    A prompt never observed is kept.
    """
    retired = history.retired(threshold=threshold)
    return [pid for pid in prompt_ids if pid not in retired]
