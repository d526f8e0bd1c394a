"""What `scalerl eval` reports: saturating fits of the test-time curves, tables, the JSON record.

Fit: the training-compute curve of ScaleRL, R(x) = R0 + (A − R0) / (1 + (x_mid / x)^B), with x the
samples per problem (or thinking tokens, for budget forcing) in place of device-hours and R0 = 0
(no sample, no answer), through `scaling.fit_sigmoid`. A fit needs 4 points at 3 distinct x; when
it fails, explains less than `GOOD_FIT_R2` of the variance, or puts the ceiling A at its bound 1.0
(not identified), the record says so (`fits: false` with the reason).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from scalerl.evaluation.strategies import StrategyPoint
from scalerl.report.tables import render_text
from scalerl.scaling import MIN_POINTS, FitError, fit_sigmoid
from scalerl.scaling.constants import A_AT_BOUND

GOOD_FIT_R2 = 0.9
NOT_FITTED = ("greedy", "random", "oracle")  # one point, or flat by construction


def fit_curve(x: Sequence[float], accuracy: Sequence[float], *, x_name: str) -> dict[str, Any]:
    """The saturating fit of accuracy against `x`, or {"fits": False, "reason": ...}."""
    if len(set(x)) < 3 or len(x) < MIN_POINTS:
        return {"fits": False, "x": x_name, "reason": f"{len(x)} points at {len(set(x))} distinct {x_name}; the "
                f"3-parameter curve needs at least {MIN_POINTS} points at 3 distinct values"}
    try:
        f = fit_sigmoid(np.asarray(x, dtype=float), np.asarray(accuracy, dtype=float), r0=0.0)
    except FitError as exc:
        return {"fits": False, "reason": str(exc), "x": x_name}
    good = bool(np.isfinite(f.r2) and f.r2 >= GOOD_FIT_R2)
    at_bound = f.A >= A_AT_BOUND
    out: dict[str, Any] = {"fits": good and not at_bound, "x": x_name, "A": f.A, "B": f.B, "x_mid": f.C_mid,
                           "R0": f.R0, "r2": f.r2, "n_points": f.n_points}
    if not good:
        out["reason"] = f"R² = {f.r2:.3f} < {GOOD_FIT_R2}: the saturating curve does not describe these points"
    elif at_bound:
        out["reason"] = (f"A = {f.A:.3f} sits at its bound 1.0 (R² = {f.r2:.3f}): the points have not bent over, "
                         "so the ceiling is not identified")
    return out


def fit_strategies(points: Sequence[StrategyPoint]) -> dict[str, dict[str, Any]]:
    """One fit of accuracy vs samples per strategy with at least one point."""
    out = {}
    for name in dict.fromkeys(p.strategy for p in points if p.strategy not in NOT_FITTED):
        pts = sorted((p for p in points if p.strategy == name), key=lambda p: p.k)
        out[name] = fit_curve([p.k for p in pts], [p.accuracy for p in pts], x_name="samples per problem")
    return out


def _pct(v: float) -> str:
    return f"{100 * v:.1f}%"


def _tok(v: float) -> str:
    return f"{v:,.0f}"


def strategy_table(points: Sequence[StrategyPoint]) -> str:
    head = ["strategy", "k (samples)", "accuracy", "95% CI", "generated tokens/problem", "thinking tokens/problem",
            "scorer tokens/problem"]
    rows = [[p.strategy, str(p.k), _pct(p.accuracy), f"[{_pct(p.ci_low)}, {_pct(p.ci_high)}]", _tok(p.gen_tokens),
             _tok(p.thinking_tokens), _tok(p.scorer_tokens) if p.scorer_tokens else "-"] for p in points]
    return render_text((head, rows))


def budget_table(rows: Sequence[dict[str, Any]]) -> str:
    head = ["max thinking (tokens)", "min thinking (tokens)", "accuracy (mean@n)", "95% CI",
            "thinking tokens/sample", "generated tokens/sample", "waits/sample"]
    body = [[str(r["max_thinking"] if r["max_thinking"] is not None else "none"), str(r["min_thinking"]),
             _pct(r["accuracy"]), f"[{_pct(r['ci_low'])}, {_pct(r['ci_high'])}]",
             f"{r['thinking_tokens_per_sample']:.1f}", f"{r['gen_tokens_per_sample']:.1f}",
             f"{r['waits_per_sample']:.2f}"] for r in rows]
    return render_text((head, body))


def tree_table(rows: Sequence[dict[str, Any]]) -> str:
    head = ["search", "accuracy (95% CI)", "generated tokens/problem", "sampling+verifier at equal tokens",
            "sample+calc at equal tokens", "scorer tokens/problem", "prefill tokens/problem"]
    body = []
    for r in rows:
        beam = r["method"] == "beam"
        name = (f"beam {r['beam_width']} x {r['expansions']}" if beam
                else f"unique, <= {r['budget']} tokens" + ("" if r["prune_below"] is None
                                                          else f", prune < {r['prune_below']:g}")
                + (f", value^{r['value_weight']:g}" if r.get("value_weight") else ""))
        eqs = [r.get("verified_sampling_accuracy_at_equal_tokens"),
               r.get("verified_calc_sampling_accuracy_at_equal_tokens")]
        body.append([name, f"{_pct(r['accuracy'])} [{_pct(r['ci_low'])}, {_pct(r['ci_high'])}]",
                     _tok(r["gen_tokens_per_problem"]),
                     *(_pct(eq) if eq is not None else "outside the sampled range" for eq in eqs),
                     *((_tok(r["scorer_tokens_per_problem"]), _tok(r["prefill_tokens_per_problem"])) if beam
                       else ("(below)", "(below)"))])
    return render_text((head, body))


def unique_run_line(run: dict[str, Any]) -> str:
    outcomes = ", ".join(f"{k} {v:.1f}" for k, v in run["chain_outcomes_per_problem"].items())
    return (f"  unique search to {run['budget']} tokens: {run['chains_per_problem']:.1f} chains/problem ({outcomes}); "
            f"{_tok(run['forced_tokens_per_problem'])} of the generated tokens forced; prefill "
            f"{_tok(run['prefill_tokens_per_problem'])} and scorer {_tok(run['scorer_tokens_per_problem'])} "
            f"tokens/problem; {run['exhausted_problems']} problems' trees exhausted; {run['wall_s']:.1f} s wall")


def fit_lines(fits: dict[str, dict[str, Any]]) -> list[str]:
    lines = []
    for name, f in fits.items():
        if f.get("A") is not None:
            verdict = "fits" if f["fits"] else f"poor fit ({f['reason']})"
            lines.append(f"  {name}: A = {_pct(f['A'])} (ceiling), B = {f['B']:.2f}, x_mid = {f['x_mid']:.3g} "
                         f"{f['x']}, R² = {f['r2']:.3f}: {verdict}")
        else:
            lines.append(f"  {name}: no saturating fit: {f['reason']}")
    return lines


def frontier_lines(frontier: dict[str, Any]) -> list[str]:
    lines = [f"Iso-compute frontier ({frontier['problems_served']} problems served; device-hours = RL compute + "
             "inference):"]
    head = ["budget (device-hours)", "answer", "best: step", "k", "accuracy", "best sampling once: step", "accuracy"]
    rows = []
    for a in frontier["answers"]:
        b, once = a.get("best"), a.get("best_sampling_once")
        rows.append([f"{a['budget_device_hours']:.5f}", a["answer"], str(b["step"]) if b else "-",
                     str(b["k"]) if b else "-", _pct(b["accuracy"]) if b else "-",
                     str(once["step"]) if once else "-", _pct(once["accuracy"]) if once else "-"])
    lines.append(render_text((head, rows)))
    return lines
