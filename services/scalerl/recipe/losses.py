"""Policy-gradient losses (CISPO, GRPO, DAPO, GSPO) and their aggregation (spec §2.2, §2.4, §2.8).

Why this file looks the way it does:

- One function per loss, dispatched through ``_LOSS_FNS`` (a dict, not a string ladder). Each returns
  the per-token *objective* terms ``[N, T]``; one aggregator, also dispatched by dict, turns them into a
  scalar. ``policy_loss`` returns ``−objective``.
- The knobs have distinct names on purpose: ``cispo_eps_max`` is an **absolute** cap on ρ (spec §6.7;
  ScaleRL tried 4, 5, 8), while ``clip_low``/``clip_high`` are PPO-style offsets around 1. Passing the
  PPO offsets to CISPO is an error rather than a silent reinterpretation.
- Normalisers are explicit in the aggregators; the caller gets ``agg/units`` (what was averaged over)
  so micro-batches split by whole groups combine exactly:
  ``loss = Σ_mb loss_mb · units_mb / Σ_mb units_mb``.

Formulas, with ρ_{i,t} = exp(logp − logp_gen) and Â_i the sequence's advantage:

- CISPO (Eq. 4): term = sg(min(ρ, ε_max)) · Â · logp. Gradient flows only through logp and no token's
  gradient is zeroed (unlike PPO clipping).
- GRPO / DAPO: term = min(ρ·Â, clip(ρ, 1 − ε⁻, 1 + ε⁺)·Â); defaults 0.2/0.2 (GRPO), 0.2/0.28 (DAPO).
- GSPO: s_i = exp(mean_t(logp − logp_gen)) over the sequence's valid tokens, term = min(s·Â,
  clip(s, 1 − ε⁻, 1 + ε⁺)·Â) placed on every valid token; defaults 3e-4/4e-4.
- Aggregation: ``"token"`` Σ terms / #tokens; ``"sample"`` mean over sequences of their token mean;
  ``"prompt"`` (ScaleRL) mean over groups of (Σ group terms / group token count) (spec §2.4, §6.4).

Departures from / choices not fixed by the paper:

1. GSPO uses the length-normalised (geometric-mean) sequence ratio of the GSPO paper, not the raw
   sequence ratio the ScaleRL paper writes (spec §6.14): clip values of order 1e-3 only make sense for
   it. The defaults are the GSPO paper's 3e-4/4e-4; ScaleRL reports 3e-3 / 4e-3–5e-3 worked better.
2. The log-ratio is clamped to ±``_MAX_LOG_RATIO`` before ``exp``. Beyond it the ratio saturates, so a
   PPO-style token with |log ρ| > 20 gets no gradient through ρ (CISPO is unaffected: its ρ is detached).
3. A token whose ``logp`` or ``logp_gen`` is NaN/±inf leaves both the sum and the normaliser, exactly as
   if it were masked out; its inputs are replaced by 0 before any arithmetic so no NaN reaches the grad.
4. Sequences/groups with no valid token are dropped from their average; an all-empty batch returns a
   zero loss that is still connected to ``logp`` (so ``backward()`` works and gives zero gradients).
5. ``loss/ratio_*`` report the token-level ρ for every loss (GSPO included): they diagnose the
   generator/trainer mismatch (spec §2.3), which is a per-token quantity. With no valid token they read
   1.0 and ``loss/clip_frac`` / ``loss/log_ratio_abs_max`` read 0.0, so averaged logs never see NaN.

Shape legend: N = sequences (completions) in the batch, T = padded completion length,
U = distinct groups (prompts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from scalerl.recipe.advantages import group_ids_to_index

_MAX_LOG_RATIO = 20.0  # exp() overflow guard in fp32: exp(20) ≈ 4.9e8, exp(89) = inf


@dataclass(frozen=True, slots=True)
class _Clip:
    """Options a loss function may read (only the ones of its own loss are meaningful)."""

    cispo_eps_max: float
    clip_low: float
    clip_high: float


# (logp_NT, log_ratio_NT, adv_N, valid_NT, clip) -> (objective term_NT, clip-active_NT bool)
LossFn = Callable[[Tensor, Tensor, Tensor, Tensor, _Clip], tuple[Tensor, Tensor]]
# (term_NT, valid_NT, group_ids_N) -> (objective (), units ())
AggFn = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


def _cispo(logp: Tensor, log_ratio: Tensor, adv: Tensor, valid: Tensor, clip: _Clip) -> tuple[Tensor, Tensor]:
    """CISPO (MiniMax-M1; ScaleRL Eq. 4): truncated-IS-weighted REINFORCE. ``[N, T]`` in, ``[N, T]`` out."""
    ratio_NT = torch.exp(log_ratio)
    weight_NT = ratio_NT.clamp(max=clip.cispo_eps_max).detach()  # sg(min(ρ, ε_max)), Eq. 4
    term_NT = weight_NT * adv[:, None] * logp  # gradient: sg(min(ρ, ε_max))·Â through logp only
    return term_NT, ratio_NT.detach() > clip.cispo_eps_max


def _clipped_surrogate(ratio: Tensor, adv: Tensor, clip: _Clip) -> tuple[Tensor, Tensor]:
    """min(ρ·Â, clip(ρ, 1 − ε⁻, 1 + ε⁺)·Â) and where the clipped branch wins and differs."""
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip.clip_low, 1.0 + clip.clip_high) * adv
    return torch.minimum(unclipped, clipped), (clipped < unclipped).detach()


def _ppo(logp: Tensor, log_ratio: Tensor, adv: Tensor, valid: Tensor, clip: _Clip) -> tuple[Tensor, Tensor]:
    """GRPO / DAPO token-level clipped surrogate (App. A.2, Eq. 8). ``[N, T]`` in, ``[N, T]`` out."""
    return _clipped_surrogate(torch.exp(log_ratio), adv[:, None], clip)  # (N, T) each


def _gspo(logp: Tensor, log_ratio: Tensor, adv: Tensor, valid: Tensor, clip: _Clip) -> tuple[Tensor, Tensor]:
    """GSPO: clipped surrogate on the geometric-mean sequence ratio, broadcast to ``[N, T]``."""
    n_valid_N = valid.sum(dim=1)  # (N,)
    mean_log_ratio_N = log_ratio.sum(dim=1) / n_valid_N.clamp(min=1)  # (N,)  invalid tokens are 0
    seq_term_N, seq_clipped_N = _clipped_surrogate(torch.exp(mean_log_ratio_N), adv, clip)
    term_NT = seq_term_N[:, None].expand_as(log_ratio)  # same value on every token of the sequence
    return term_NT, seq_clipped_N[:, None].expand_as(valid)


_LOSS_FNS: dict[str, LossFn] = {"cispo": _cispo, "grpo": _ppo, "dapo": _ppo, "gspo": _gspo}
_DEFAULT_CLIP: dict[str, tuple[float, float]] = {  # (clip_low, clip_high), each loss's paper default
    "grpo": (0.2, 0.2),
    "dapo": (0.2, 0.28),
    "gspo": (3e-4, 4e-4),
}
LOSS_TYPES: tuple[str, ...] = tuple(_LOSS_FNS)
"""Accepted values of ``policy_loss(loss_type=...)``."""


def _token_mean(term: Tensor, valid: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor]:
    n_tokens = valid.sum().to(term.dtype)  # ()
    return term.sum() / n_tokens.clamp(min=1.0), n_tokens


def _sample_mean(term: Tensor, valid: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor]:
    n_tokens_N = valid.sum(dim=1).to(term.dtype)  # (N,)
    seq_mean_N = term.sum(dim=1) / n_tokens_N.clamp(min=1.0)  # (N,)  1/|y_i| Σ_t
    n_seqs = (n_tokens_N > 0).sum().to(term.dtype)  # ()  empty sequences have seq_mean 0 and drop out
    return seq_mean_N.sum() / n_seqs.clamp(min=1.0), n_seqs


def _prompt_mean(term: Tensor, valid: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor]:
    index_N, num_groups = group_ids_to_index(group_ids)
    group_sum_U = term.new_zeros(num_groups).index_add(0, index_N, term.sum(dim=1))  # (U,)
    group_tokens_U = term.new_zeros(num_groups).index_add(0, index_N, valid.sum(dim=1).to(term.dtype))
    group_mean_U = group_sum_U / group_tokens_U.clamp(min=1.0)  # (U,)  1/Σ_{g}|y_g| Σ_i Σ_t
    n_groups = (group_tokens_U > 0).sum().to(term.dtype)  # ()
    return group_mean_U.sum() / n_groups.clamp(min=1.0), n_groups


_AGGREGATORS: dict[str, AggFn] = {"token": _token_mean, "sample": _sample_mean, "prompt": _prompt_mean}
AGGREGATIONS: tuple[str, ...] = tuple(_AGGREGATORS)
"""Accepted values of ``policy_loss(aggregation=...)``."""


def _resolve_clip(
    loss_type: str, aggregation: str, clip_low: float | None, clip_high: float | None, cispo_eps_max: float
) -> _Clip:
    """Validate the options and fill in each loss's paper-default clip range."""
    if loss_type not in _LOSS_FNS:
        raise ValueError(f"unknown loss_type {loss_type!r}; allowed: {', '.join(LOSS_TYPES)}")
    if aggregation not in _AGGREGATORS:
        raise ValueError(f"unknown aggregation {aggregation!r}; allowed: {', '.join(AGGREGATIONS)}")
    if not cispo_eps_max > 0:
        raise ValueError(f"cispo_eps_max must be > 0 (an absolute cap on the ratio); got {cispo_eps_max}")
    if loss_type == "cispo":
        if clip_low is not None or clip_high is not None:
            raise ValueError("clip_low/clip_high do not apply to cispo; its only knob is cispo_eps_max")
        return _Clip(cispo_eps_max=cispo_eps_max, clip_low=0.0, clip_high=0.0)
    default_low, default_high = _DEFAULT_CLIP[loss_type]
    low = default_low if clip_low is None else clip_low
    high = default_high if clip_high is None else clip_high
    if not (0.0 <= low <= 1.0 and high >= 0.0):
        raise ValueError(f"need 0 <= clip_low <= 1 and clip_high >= 0; got {low}, {high}")
    return _Clip(cispo_eps_max=cispo_eps_max, clip_low=low, clip_high=high)


def _check_shapes(
    logp: Tensor, logp_gen: Tensor, advantages: Tensor, mask: Tensor, group_ids: Tensor
) -> None:
    if logp.dim() != 2 or logp_gen.shape != logp.shape or mask.shape != logp.shape:
        raise ValueError(
            "logp, logp_gen and mask must all be [N, T]; got "
            f"{tuple(logp.shape)}, {tuple(logp_gen.shape)}, {tuple(mask.shape)}"
        )
    n = logp.shape[0]
    if advantages.shape != (n,) or group_ids.shape != (n,):
        raise ValueError(
            f"advantages and group_ids must be [N={n}]; "
            f"got {tuple(advantages.shape)}, {tuple(group_ids.shape)}"
        )


@torch.no_grad()
def _stats(
    raw_log_ratio: Tensor, log_ratio: Tensor, valid: Tensor, clip_active: Tensor, units: Tensor
) -> dict[str, float]:
    n_tokens = int(valid.sum().item())
    if n_tokens == 0:
        values = [0.0, 1.0, 1.0, 1.0, 0.0]
    else:
        ratio_V = torch.exp(log_ratio[valid])  # (V,)  V = valid tokens
        values = torch.stack(
            [
                clip_active[valid].to(ratio_V.dtype).mean(),
                ratio_V.mean(),
                ratio_V.max(),
                ratio_V.min(),
                raw_log_ratio[valid].abs().max().to(ratio_V.dtype),
            ]
        ).tolist()
    keys = ("loss/clip_frac", "loss/ratio_mean", "loss/ratio_max", "loss/ratio_min", "loss/log_ratio_abs_max")
    stats = dict(zip(keys, (float(v) for v in values), strict=True))
    stats["loss/tokens"] = float(n_tokens)
    stats["agg/units"] = float(units.item())
    return stats


def policy_loss(
    logp: Tensor,
    logp_gen: Tensor,
    advantages: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    *,
    loss_type: str = "cispo",
    aggregation: str = "prompt",
    clip_low: float | None = None,
    clip_high: float | None = None,
    cispo_eps_max: float = 5.0,
) -> tuple[Tensor, dict[str, float]]:
    """Policy-gradient loss of one (micro-)batch; ScaleRL's defaults are CISPO + prompt average.

    Args:
        logp: ``[N, T]`` float, trainer log π_train(y_t) of the sampled tokens (requires grad).
        logp_gen: ``[N, T]`` float, generator log π_gen(y_t) recorded at sampling time (never gets grad).
        advantages: ``[N]`` float, one advantage per sequence (see ``group_advantages``).
        mask: ``[N, T]`` bool, completion tokens that count (no prompt, padding or injected tokens).
        group_ids: ``[N]`` int, the prompt each sequence belongs to (used by ``"prompt"`` aggregation).
        loss_type: ``"cispo"`` | ``"grpo"`` | ``"dapo"`` | ``"gspo"``.
        aggregation: ``"prompt"`` | ``"sample"`` | ``"token"``.
        clip_low: ε⁻ for grpo/dapo/gspo (ratio clipped below at 1 − ε⁻); None = the loss's paper default.
        clip_high: ε⁺ for grpo/dapo/gspo (ratio clipped above at 1 + ε⁺); None = the loss's paper default.
        cispo_eps_max: absolute cap ε_max on ρ for cispo (ScaleRL §3 tried 4, 5, 8).

    Returns:
        ``(loss, stats)``: scalar loss = −objective, and float diagnostics ``loss/clip_frac``,
        ``loss/ratio_mean``, ``loss/ratio_max``, ``loss/ratio_min``, ``loss/log_ratio_abs_max``,
        ``loss/tokens`` (valid token count) and ``agg/units`` (groups, sequences or tokens averaged over).

    Raises:
        ValueError: unknown loss_type/aggregation, clip offsets given to cispo, cispo_eps_max <= 0,
            clip offsets out of range, or mismatched shapes.
    """
    clip = _resolve_clip(loss_type, aggregation, clip_low, clip_high, cispo_eps_max)
    _check_shapes(logp, logp_gen, advantages, mask, group_ids)

    logp_gen = logp_gen.detach()
    valid_NT = mask.bool() & torch.isfinite(logp) & torch.isfinite(logp_gen)  # non-finite tokens drop out
    logp_NT = torch.where(valid_NT, logp, 0.0)  # 0 where invalid: no NaN in forward or backward
    raw_log_ratio_NT = logp_NT - torch.where(valid_NT, logp_gen, 0.0)  # (N, T)  log ρ, 0 where invalid
    log_ratio_NT = raw_log_ratio_NT.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)

    term_NT, clip_active_NT = _LOSS_FNS[loss_type](logp_NT, log_ratio_NT, advantages.detach(), valid_NT, clip)
    term_NT = torch.where(valid_NT, term_NT, 0.0)  # (N, T)  objective terms, 0 off the valid tokens
    objective, units = _AGGREGATORS[aggregation](term_NT, valid_NT, group_ids)

    stats = _stats(raw_log_ratio_NT, log_ratio_NT, valid_NT, clip_active_NT, units)
    return -objective, stats
