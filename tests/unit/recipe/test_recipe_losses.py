"""policy_loss: hand-worked cases, a naive-loop reference for every loss × aggregation, gradients,
masking, micro-batch invariance and option errors (spec §2.2, §2.4, §2.8, §6.4, §6.7, §6.14)."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
import torch
from torch import Tensor
from torch.testing import assert_close

from scalerl.recipe import AGGREGATIONS, LOSS_TYPES, policy_loss

F64 = torch.float64
PAPER_CLIP = {"grpo": (0.2, 0.2), "dapo": (0.2, 0.28), "gspo": (3e-4, 4e-4)}

# --------------------------------------------------------------------------------------------------
# Naive reference: loops over sequences, tokens and groups, straight from the formulas in the brief.
# --------------------------------------------------------------------------------------------------


def _value(x: Tensor | float) -> float:
    return x.detach().item() if isinstance(x, Tensor) else x


def _ppo_term(ratio: Tensor, adv: float, low: float, high: float) -> Tensor | float:
    """min(ρ·A, clip(ρ, 1 − low, 1 + high)·A) with Python branches instead of clamp/minimum."""
    if ratio.item() < 1 - low:
        clipped_ratio: Tensor | float = 1 - low
    elif ratio.item() > 1 + high:
        clipped_ratio = 1 + high
    else:
        clipped_ratio = ratio
    unclipped = ratio * adv
    clipped = clipped_ratio * adv
    return clipped if _value(clipped) < _value(unclipped) else unclipped


def _valid_tokens(logp: Tensor, logp_gen: Tensor, mask: Tensor, i: int) -> list[int]:
    return [
        t
        for t in range(logp.shape[1])
        if bool(mask[i, t]) and math.isfinite(logp[i, t].item()) and math.isfinite(logp_gen[i, t].item())
    ]


def reference_loss(
    logp: Tensor,
    logp_gen: Tensor,
    adv: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    *,
    loss_type: str,
    aggregation: str,
    clip_low: float | None = None,
    clip_high: float | None = None,
    eps_max: float = 5.0,
) -> Tensor:
    if loss_type != "cispo":
        low = PAPER_CLIP[loss_type][0] if clip_low is None else clip_low
        high = PAPER_CLIP[loss_type][1] if clip_high is None else clip_high
    per_seq: list[list[Any]] = []
    for i in range(logp.shape[0]):
        a = adv[i].item()
        toks = _valid_tokens(logp, logp_gen, mask, i)
        terms: list[Any] = []
        if loss_type == "gspo" and toks:
            mean_log_ratio = sum(logp[i, t] - logp_gen[i, t] for t in toks) / len(toks)
            seq_term = _ppo_term(torch.exp(torch.as_tensor(mean_log_ratio)), a, low, high)
        for t in toks:
            if loss_type == "cispo":
                rho = math.exp(logp[i, t].item() - logp_gen[i, t].item())  # a float: no gradient through ρ
                terms.append(min(rho, eps_max) * a * logp[i, t])
            elif loss_type == "gspo":
                terms.append(seq_term)
            else:
                terms.append(_ppo_term(torch.exp(logp[i, t] - logp_gen[i, t]), a, low, high))
        per_seq.append(terms)

    if aggregation == "token":
        flat = [x for ts in per_seq for x in ts]
        units = [sum(flat) / len(flat)] if flat else []
    elif aggregation == "sample":
        units = [sum(ts) / len(ts) for ts in per_seq if ts]
    else:
        by_group: dict[int, list[Any]] = {}
        for g, ts in zip(group_ids.tolist(), per_seq, strict=True):
            by_group.setdefault(g, []).extend(ts)
        units = [sum(ts) / len(ts) for ts in by_group.values() if ts]
    objective = sum(units) / len(units) if units else 0.0
    return -torch.as_tensor(objective, dtype=logp.dtype)


def _grad(loss: Tensor, x: Tensor) -> Tensor:
    if not loss.requires_grad:
        return torch.zeros_like(x)
    (g,) = torch.autograd.grad(loss, x, allow_unused=True)
    return torch.zeros_like(x) if g is None else g


def make_batch(seed: int = 0, *, with_bad_values: bool = True) -> dict[str, Any]:
    """9 sequences × 6 tokens; groups interleaved and non-contiguous.

    Sequences 3 and 6 (all of group 9) and sequence 4 (one of group 2's three) are fully masked.
    Optionally a NaN logp_gen on a masked-in token and inf/NaN values on masked-out tokens.
    """
    gen = torch.Generator().manual_seed(seed)
    n, t = 9, 6
    group_ids = torch.tensor([5, 2, 5, 9, 2, 2, 9, 11, 11])
    logp = -torch.rand(n, t, generator=gen, dtype=F64) * 3 - 0.05
    log_ratio = torch.randn(n, t, generator=gen, dtype=F64) * 0.4
    log_ratio[0, 1] = math.log(12.0)  # above the CISPO cap and every PPO clip
    log_ratio[7, 2] = -2.0  # far below 1 − ε⁻
    logp_gen = logp - log_ratio
    mask = torch.rand(n, t, generator=gen) < 0.75
    mask[0, :2] = True
    mask[7, 2] = True
    mask[[3, 4, 6]] = False
    adv = torch.randn(n, generator=gen, dtype=F64)
    if with_bad_values:
        mask[1, 0] = True
        logp_gen[1, 0] = float("nan")  # masked-in but non-finite: must drop out
        mask[8, 5] = False
        logp[8, 5] = float("-inf")  # masked-out garbage
        logp_gen[2, 5] = float("nan")
        mask[2, 5] = False
    return {
        "logp": logp.requires_grad_(True),
        "logp_gen": logp_gen,
        "advantages": adv,
        "mask": mask,
        "group_ids": group_ids,
    }


CASES = [
    *[(lt, agg, None, None) for lt, agg in itertools.product(LOSS_TYPES, AGGREGATIONS)],
    # wide clips so GSPO's unclipped branch and PPO's asymmetric bounds are exercised too
    *[(lt, agg, 0.5, 0.6) for lt, agg in itertools.product(("grpo", "dapo", "gspo"), AGGREGATIONS)],
]


@pytest.mark.parametrize(("loss_type", "aggregation", "clip_low", "clip_high"), CASES)
def test_matches_naive_loop_reference(
    loss_type: str, aggregation: str, clip_low: float | None, clip_high: float | None
) -> None:
    b = make_batch()
    kwargs: dict[str, Any] = {"loss_type": loss_type, "aggregation": aggregation}
    if loss_type != "cispo":
        kwargs |= {"clip_low": clip_low, "clip_high": clip_high}
    loss, stats = policy_loss(b["logp"], b["logp_gen"], b["advantages"], b["mask"], b["group_ids"], **kwargs)
    ref = reference_loss(
        b["logp"],
        b["logp_gen"],
        b["advantages"],
        b["mask"],
        b["group_ids"],
        loss_type=loss_type,
        aggregation=aggregation,
        clip_low=clip_low,
        clip_high=clip_high,
    )
    assert_close(loss, ref)
    grad = _grad(loss, b["logp"])
    assert torch.isfinite(grad).all()
    assert_close(grad, _grad(ref, b["logp"]))
    # 4 non-empty groups minus group 9 -> 3; 9 sequences minus 3 empty -> 6
    assert stats["agg/units"] == {"prompt": 3.0, "sample": 6.0, "token": stats["loss/tokens"]}[aggregation]
    valid = b["mask"] & torch.isfinite(b["logp"]) & torch.isfinite(b["logp_gen"])
    assert stats["loss/tokens"] == float(valid.sum())


# --------------------------------------------------------------------------------------------------
# Hand-worked examples
# --------------------------------------------------------------------------------------------------


def _hand_batch(log_ratio: list[list[float]], advantages: list[float]) -> dict[str, Any]:
    # 3 sequences, T = 3; sequences 0 and 1 are group 7, sequence 2 is group 3.
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.0, -2.0], [-0.25, -1.0, -1.0]], dtype=F64)
    return {
        "logp": logp.clone().requires_grad_(True),
        "logp_gen": logp - torch.tensor(log_ratio, dtype=F64),
        "advantages": torch.tensor(advantages, dtype=F64),
        "mask": torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.bool),
        "group_ids": torch.tensor([7, 7, 3]),
    }


def test_hand_worked_cispo_prompt() -> None:
    ln2, ln10 = math.log(2), math.log(10)
    b = _hand_batch([[0.0, ln2, 0.0], [ln10, 0.0, -ln2], [0.0, 0.0, 0.0]], [1.0, -0.5, 2.0])
    # ε_max = 5; weights w = min(ρ, 5), term = w·A·logp
    # seq0 (A=1):    ρ=(1, 2)       -> 1·1·(−1) + 2·1·(−2)                    = −1 − 4      = −5
    # seq1 (A=−0.5): ρ=(10, 1, 0.5) -> 5·(−.5)·(−.5) + 1·(−.5)·(−1) + .5·(−.5)·(−2) = 1.25 + .5 + .5 = 2.25
    # group 7: (−5 + 2.25) / (2 + 3 tokens) = −0.55
    # seq2 (A=2):    ρ=(1)          -> 1·2·(−0.25) = −0.5; group 3: −0.5 / 1 = −0.5
    # objective = (−0.55 − 0.5) / 2 groups = −0.525  ->  loss = 0.525
    loss, stats = policy_loss(**b, loss_type="cispo", aggregation="prompt", cispo_eps_max=5.0)
    assert_close(loss, torch.tensor(0.525, dtype=F64))
    # ∂loss/∂logp = −(1/2 groups)·(1/T_g)·w·A
    # seq0: −(1/10)·1·1 = −0.1, −(1/10)·2·1 = −0.2;  seq1: −(1/10)·w·(−0.5) = 0.25, 0.05, 0.025
    # seq2: −(1/2)·1·2 = −1.0; masked tokens 0
    expected = torch.tensor([[-0.1, -0.2, 0.0], [0.25, 0.05, 0.025], [-1.0, 0.0, 0.0]], dtype=F64)
    assert_close(_grad(loss, b["logp"]), expected)
    assert stats["loss/clip_frac"] == pytest.approx(1 / 6)  # only ρ = 10 > 5
    assert stats["loss/tokens"] == 6.0
    assert stats["agg/units"] == 2.0
    assert stats["loss/ratio_max"] == pytest.approx(10.0)
    assert stats["loss/ratio_min"] == pytest.approx(0.5)
    assert stats["loss/ratio_mean"] == pytest.approx((1 + 2 + 10 + 1 + 0.5 + 1) / 6)
    assert stats["loss/log_ratio_abs_max"] == pytest.approx(ln10)


def test_hand_worked_dapo_token() -> None:
    ln = math.log
    b = _hand_batch([[0.0, ln(1.5), 0.0], [ln(0.5), 0.0, ln(2.0)], [ln(0.9), 0.0, 0.0]], [1.0, -1.0, 2.0])
    # DAPO defaults: clip(ρ, 0.8, 1.28); term = min(ρA, clip(ρ)A)
    # seq0 (A=1):  ρ=1   -> min(1, 1) = 1;        ρ=1.5 -> min(1.5, 1.28) = 1.28 (clipped, no grad)
    # seq1 (A=−1): ρ=0.5 -> min(−0.5, −0.8) = −0.8 (clipped, no grad); ρ=1 -> −1; ρ=2 -> min(−2, −1.28) = −2
    # seq2 (A=2):  ρ=0.9 -> min(1.8, 1.8) = 1.8
    # Σ = 1 + 1.28 − 0.8 − 1 − 2 + 1.8 = 0.28 over 6 tokens -> objective 0.28/6, loss −0.28/6
    loss, stats = policy_loss(**b, loss_type="dapo", aggregation="token")
    assert_close(loss, torch.tensor(-0.28 / 6, dtype=F64))
    # unclipped tokens: ∂loss/∂logp = −ρA/6; clipped: 0
    expected = torch.tensor([[-1 / 6, 0.0, 0.0], [0.0, 1 / 6, 2 / 6], [-1.8 / 6, 0.0, 0.0]], dtype=F64)
    assert_close(_grad(loss, b["logp"]), expected)
    assert stats["loss/clip_frac"] == pytest.approx(2 / 6)
    assert stats["agg/units"] == 6.0


# --------------------------------------------------------------------------------------------------
# Gradients
# --------------------------------------------------------------------------------------------------


def test_cispo_gradient_is_truncated_weight_times_advantage_and_never_zeroed() -> None:
    b = make_batch(3, with_bad_values=False)
    b["logp_gen"].requires_grad_(True)
    eps_max = 4.0
    loss, stats = policy_loss(**b, loss_type="cispo", aggregation="token", cispo_eps_max=eps_max)
    loss.backward()
    ratio = torch.exp(b["logp"].detach() - b["logp_gen"].detach())
    n_tokens = b["mask"].sum()
    expected = torch.where(b["mask"], -ratio.clamp(max=eps_max) * b["advantages"][:, None] / n_tokens, 0.0)
    assert_close(b["logp"].grad, expected)
    assert ratio[0, 1] > eps_max and b["mask"][0, 1]  # a capped token...
    assert b["logp"].grad[0, 1].abs() > 0  # ...still gets gradient (unlike PPO clipping)
    assert (b["logp"].grad[~b["mask"]] == 0).all()
    assert b["logp_gen"].grad is None or (b["logp_gen"].grad == 0).all()
    assert stats["loss/clip_frac"] == pytest.approx(float((ratio[b["mask"]] > eps_max).double().mean()))


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "gspo"])
def test_no_gradient_reaches_logp_gen_for_ppo_style_losses(loss_type: str) -> None:
    b = make_batch(4, with_bad_values=False)
    b["logp_gen"].requires_grad_(True)
    loss, _ = policy_loss(**b, loss_type=loss_type, aggregation="prompt", clip_low=0.5, clip_high=0.5)
    loss.backward()
    assert b["logp_gen"].grad is None or (b["logp_gen"].grad == 0).all()


def test_ppo_clipping_zeroes_gradient_of_clipped_tokens() -> None:
    # One sequence, token ratios 1.25 (A>0), and in a second sequence 0.7 and 1.5 with A<0.
    logp = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]], dtype=F64, requires_grad=True)
    log_ratio = torch.tensor([[math.log(1.25), 0.0], [math.log(0.7), math.log(1.5)]], dtype=F64)
    args = (
        logp,
        logp - log_ratio,
        torch.tensor([1.0, -1.0], dtype=F64),
        torch.ones(2, 2, dtype=torch.bool),
        torch.tensor([0, 1]),
    )
    grpo, grpo_stats = policy_loss(*args, loss_type="grpo", aggregation="token")
    g = _grad(grpo, logp)
    assert g[0, 0] == 0  # A>0, ρ=1.25 > 1.2: clipped branch selected, no gradient
    assert g[1, 0] == 0  # A<0, ρ=0.7 < 0.8: clipped branch selected, no gradient
    assert_close(g[1, 1], torch.tensor(1.5 / 4, dtype=F64))  # A<0, ρ=1.5: min keeps ρA -> −(ρA)/4
    assert_close(g[0, 1], torch.tensor(-1.0 / 4, dtype=F64))  # inside the clip range
    assert grpo_stats["loss/clip_frac"] == pytest.approx(2 / 4)
    dapo, dapo_stats = policy_loss(*args, loss_type="dapo", aggregation="token")
    assert_close(_grad(dapo, logp)[0, 0], torch.tensor(-1.25 / 4, dtype=F64))  # 1.25 < 1.28: not clipped
    assert dapo_stats["loss/clip_frac"] == pytest.approx(1 / 4)


def test_gspo_uses_the_length_normalised_sequence_ratio() -> None:
    # seq0: token log-ratios (+0.001, −0.001, masked) -> s = exp(0) = 1: unclipped although each token
    #       ratio alone lies outside [1 − 3e-4, 1 + 4e-4]. Term = s·A = 0.5 on both tokens.
    # seq1: token log-ratios (0.01, 0.01, 0.01), A = 1 -> s = e^0.01 > 1 + 4e-4: clipped to 1.0004,
    #       no gradient on any of its tokens.
    logp = torch.full((2, 3), -1.0, dtype=F64, requires_grad=True)
    log_ratio = torch.tensor([[0.001, -0.001, 0.7], [0.01, 0.01, 0.01]], dtype=F64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    adv = torch.tensor([0.5, 1.0], dtype=F64)
    loss, stats = policy_loss(
        logp, logp - log_ratio, adv, mask, torch.tensor([0, 1]), loss_type="gspo", aggregation="sample"
    )
    # sample mean: (0.5 + 1.0004) / 2
    assert_close(loss, torch.tensor(-(0.5 + 1.0004) / 2, dtype=F64))
    # seq0: ∂/∂logp_t of −(1/2)·s·A with ∂s/∂logp_t = s/|y| = 1/2  ->  −(1/2)·0.5·(1/2) = −0.125 on both
    expected = torch.tensor([[-0.125, -0.125, 0.0], [0.0, 0.0, 0.0]], dtype=F64)
    assert_close(_grad(loss, logp), expected)
    assert stats["loss/clip_frac"] == pytest.approx(3 / 5)  # seq1's 3 tokens of 5


def test_gspo_puts_the_sequence_term_on_every_token_for_prompt_average() -> None:
    # one group: seq0 has 1 token, seq1 has 3; both s = 1 (log-ratio 0), A = (2, −1)
    # prompt average: (1·2 + 3·(−1)) / 4 tokens = −0.25 -> loss 0.25
    logp = torch.full((2, 3), -1.0, dtype=F64, requires_grad=True)
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    loss, _ = policy_loss(
        logp,
        logp.detach(),
        torch.tensor([2.0, -1.0], dtype=F64),
        mask,
        torch.tensor([4, 4]),
        loss_type="gspo",
        aggregation="prompt",
    )
    assert_close(loss, torch.tensor(0.25, dtype=F64))


# --------------------------------------------------------------------------------------------------
# Masking, non-finite values, empty units
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_masked_out_tokens_do_not_matter(loss_type: str) -> None:
    b = make_batch(5, with_bad_values=False)
    loss, stats = policy_loss(**b, loss_type=loss_type, aggregation="prompt")
    noisy = {k: v.detach().clone() for k, v in b.items()}
    noisy["logp"][~b["mask"]] = 123.0
    noisy["logp_gen"][~b["mask"]] = float("nan")
    noisy["logp"].requires_grad_(True)
    loss2, stats2 = policy_loss(**noisy, loss_type=loss_type, aggregation="prompt")
    assert_close(loss2, loss)
    assert stats2 == stats
    assert_close(_grad(loss2, noisy["logp"]), _grad(loss, b["logp"]))


@pytest.mark.parametrize(("loss_type", "aggregation"), list(itertools.product(LOSS_TYPES, AGGREGATIONS)))
def test_non_finite_masked_in_token_is_excluded(loss_type: str, aggregation: str) -> None:
    b = make_batch(6, with_bad_values=False)
    bad = {k: v.detach().clone() for k, v in b.items()}
    bad["logp_gen"][0, 0] = float("nan")
    bad["logp_gen"][1, 1] = float("inf")
    bad["logp"][2, 0] = float("nan")
    bad["logp"].requires_grad_(True)
    masked = {k: v.detach().clone() for k, v in b.items()}
    masked["mask"][0, 0] = masked["mask"][1, 1] = masked["mask"][2, 0] = False
    masked["logp"].requires_grad_(True)
    loss_bad, stats_bad = policy_loss(**bad, loss_type=loss_type, aggregation=aggregation)
    loss_ref, stats_ref = policy_loss(**masked, loss_type=loss_type, aggregation=aggregation)
    assert torch.isfinite(loss_bad)
    assert_close(loss_bad, loss_ref)
    grad = _grad(loss_bad, bad["logp"])
    assert torch.isfinite(grad).all()
    assert_close(grad, _grad(loss_ref, masked["logp"]))
    assert stats_bad["loss/tokens"] == stats_ref["loss/tokens"]
    assert all(math.isfinite(v) for v in stats_bad.values())


def _without(b: dict[str, Any], rows: list[int]) -> dict[str, Any]:
    keep = [i for i in range(b["logp"].shape[0]) if i not in rows]
    out = {k: v.detach()[keep].clone() for k, v in b.items()}
    out["logp"].requires_grad_(True)
    return out


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_fully_masked_sequence_and_group_are_ignored(loss_type: str) -> None:
    b = make_batch(7, with_bad_values=False)  # seqs 3, 6 (group 9) and 4 (group 2) are fully masked
    for aggregation in AGGREGATIONS:
        full, _ = policy_loss(**b, loss_type=loss_type, aggregation=aggregation)
        trimmed, _ = policy_loss(**_without(b, [3, 4, 6]), loss_type=loss_type, aggregation=aggregation)
        assert_close(full, trimmed)


@pytest.mark.parametrize(("loss_type", "aggregation"), list(itertools.product(LOSS_TYPES, AGGREGATIONS)))
def test_all_empty_batch_gives_connected_zero_loss(loss_type: str, aggregation: str) -> None:
    b = make_batch(8, with_bad_values=False)
    b["mask"][:] = False
    loss, stats = policy_loss(**b, loss_type=loss_type, aggregation=aggregation)
    assert loss.item() == 0.0
    assert loss.grad_fn is not None
    loss.backward()
    assert (b["logp"].grad == 0).all()
    assert stats["loss/tokens"] == 0.0 and stats["agg/units"] == 0.0
    assert all(math.isfinite(v) for v in stats.values())


def test_log_ratio_guard_keeps_everything_finite() -> None:
    logp = torch.tensor([[-0.1, -0.2]], requires_grad=True)  # float32
    logp_gen = torch.tensor([[-150.0, -0.2]])  # log ρ = 149.9: exp() would be inf in fp32
    for loss_type in LOSS_TYPES:
        loss, stats = policy_loss(
            logp,
            logp_gen,
            torch.tensor([-1.0]),
            torch.ones(1, 2, dtype=torch.bool),
            torch.tensor([0]),
            loss_type=loss_type,
        )
        assert torch.isfinite(loss)
        assert torch.isfinite(_grad(loss, logp)).all()
        assert stats["loss/log_ratio_abs_max"] == pytest.approx(149.9, rel=1e-5)
        assert stats["loss/ratio_max"] == pytest.approx(math.exp(20.0), rel=1e-5)


# --------------------------------------------------------------------------------------------------
# Micro-batch invariance: whole-batch loss ≡ Σ_mb loss_mb · units_mb / Σ units
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("loss_type", "aggregation"), list(itertools.product(LOSS_TYPES, AGGREGATIONS)))
def test_microbatches_split_by_whole_groups_combine_exactly(loss_type: str, aggregation: str) -> None:
    b = make_batch(9, with_bad_values=True)
    logp = b["logp"]
    opts: dict[str, Any] = {"loss_type": loss_type, "aggregation": aggregation}
    if loss_type != "cispo":
        opts |= {"clip_low": 0.3, "clip_high": 0.3}
    whole, _ = policy_loss(**b, **opts)
    whole_grad = _grad(whole, logp)

    parts = []
    for groups in ([5, 9], [2, 11]):  # micro-batch A = groups {5, 9}, B = groups {2, 11}
        rows = torch.tensor([i for i, g in enumerate(b["group_ids"].tolist()) if g in groups])
        mb = {k: (logp[rows] if k == "logp" else v[rows]) for k, v in b.items()}  # logp slices keep the graph
        parts.append(policy_loss(**mb, **opts))
    total_units = sum(stats["agg/units"] for _, stats in parts)
    combined = sum(loss * stats["agg/units"] for loss, stats in parts) / total_units
    assert isinstance(combined, Tensor)
    assert_close(combined, whole)
    assert_close(_grad(combined, logp), whole_grad)


# --------------------------------------------------------------------------------------------------
# Option errors
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("opts", "message"),
    [
        ({"loss_type": "ppo"}, "cispo, grpo, dapo, gspo"),
        ({"aggregation": "sequence"}, "token, sample, prompt"),
        ({"loss_type": "cispo", "clip_high": 0.28}, "cispo_eps_max"),
        ({"loss_type": "cispo", "clip_low": 0.2}, "cispo_eps_max"),
        ({"cispo_eps_max": 0.0}, "cispo_eps_max"),
        ({"cispo_eps_max": -4.0}, "cispo_eps_max"),
        ({"loss_type": "dapo", "clip_low": 1.5}, "clip_low"),
        ({"loss_type": "grpo", "clip_high": -0.1}, "clip_high"),
    ],
)
def test_invalid_options_raise(opts: dict[str, Any], message: str) -> None:
    b = make_batch(10, with_bad_values=False)
    with pytest.raises(ValueError, match=message):
        policy_loss(**b, **opts)


def test_mismatched_shapes_raise() -> None:
    b = make_batch(11, with_bad_values=False)
    with pytest.raises(ValueError, match=r"\[N, T\]"):
        policy_loss(b["logp"], b["logp_gen"][:, :3], b["advantages"], b["mask"], b["group_ids"])
    with pytest.raises(ValueError, match=r"\[N=9\]"):
        policy_loss(b["logp"], b["logp_gen"], b["advantages"][:4], b["mask"], b["group_ids"])
