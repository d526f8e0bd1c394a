"""Group-centred advantages with prompt-, batch- or no normalisation (spec §2.5, §6.6).

Every prompt is sampled G times; the G completions form a *group* and the baseline of a completion
is the mean reward of its group (GRPO's leave-none-out baseline, no value network). What differs
between recipes is only the scale applied afterwards:

- ``"group"`` (GRPO, LOO variant ``loo-plan``): Â_i = (r_i − mean_g) / (std_g + ε).
- ``"batch"`` (Reinforce++ / Magistral; **ScaleRL's choice**): c_i = r_i − mean_g, then
  Â_i = c_i / (std over the whole batch of c + ε). One scale for the batch keeps the relative weight
  of easy and hard prompts, which per-group scaling erases.
- ``"none"`` (Dr. GRPO): Â_i = r_i − mean_g.

Departures from / choices not fixed by the paper:

1. Every std is the population std (``correction=0``): a group of G samples is the whole population
   of that prompt's draws, and a group of one sample then gets std 0 rather than NaN.
2. ε = 1e-6 is added to the std (not to the variance). A group whose rewards are all equal therefore
   gets advantage exactly 0 under ``"group"`` (0 / ε) instead of NaN.
3. The paper does not say whether the batch std is taken before or after zero-variance filtering
   (spec §2.5, §6.6). This function normalises over whatever it is given; the caller decides (and
   logs) whether to filter first.

Group ids are arbitrary integer labels (not necessarily contiguous or sorted); groups are found with
``torch.unique(return_inverse=True)`` and reduced with ``index_add_``: no Python loop over groups.

Shape legend: N = number of completions in the batch, U = number of distinct groups.
"""

from __future__ import annotations

import torch
from torch import Tensor

NORMALIZATIONS: tuple[str, ...] = ("group", "batch", "none")
"""Accepted values of ``group_advantages(normalization=...)``."""

_STD_EPS = 1e-6  # added to every std so that equal-reward groups give 0, not 0/0


def group_ids_to_index(group_ids: Tensor) -> tuple[Tensor, int]:
    """Map arbitrary integer labels to dense indices.

    Args:
        group_ids: ``[N]`` integer labels.

    Returns:
        ``(index [N] int64 in [0, U), U)`` where equal labels share an index.
    """
    labels_U, index_N = torch.unique(group_ids, return_inverse=True)
    return index_N.reshape(-1), labels_U.numel()


def _group_mean(values: Tensor, index: Tensor, num_groups: int) -> Tensor:
    """Mean of ``values [N]`` within each group (``index [N]`` in [0, U)), broadcast back to ``[N]``."""
    sums_U = values.new_zeros(num_groups).index_add_(0, index, values)
    counts_U = values.new_zeros(num_groups).index_add_(0, index, torch.ones_like(values))
    return (sums_U / counts_U)[index]  # (N,)  every group has count >= 1 by construction


def group_advantages(rewards: Tensor, group_ids: Tensor, normalization: str = "batch") -> Tensor:
    """Advantages of N completions, centred on their group's mean reward.

    Args:
        rewards: ``[N]`` float, one scalar reward per completion (±1 in ScaleRL).
        group_ids: ``[N]`` int, the prompt (group) each completion belongs to; any integer labels.
        normalization: ``"group"``, ``"batch"`` (ScaleRL default) or ``"none"`` (see module docstring).

    Returns:
        ``[N]`` advantages, same dtype as ``rewards`` (float32 if ``rewards`` is an integer tensor).

    Raises:
        ValueError: unknown ``normalization`` or mismatched shapes.
    """
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"unknown normalization {normalization!r}; allowed: {', '.join(NORMALIZATIONS)}")
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must both be [N]; got {tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        )
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.float32)
    if rewards.numel() == 0:
        return rewards.clone()

    index_N, num_groups = group_ids_to_index(group_ids)
    centred_N = rewards - _group_mean(rewards, index_N, num_groups)  # (N,)  Â_i = r_i − mean_g

    if normalization == "none":
        return centred_N
    if normalization == "batch":
        batch_std = centred_N.std(correction=0)  # ()  Â_std over the whole batch
        return centred_N / (batch_std + _STD_EPS)
    group_std_N = _group_mean(centred_N.square(), index_N, num_groups).sqrt()  # (N,) population std_g
    return centred_N / (group_std_N + _STD_EPS)
