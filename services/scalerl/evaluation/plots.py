"""PNG plots of `scalerl eval`: the test-time scaling curves and the iso-compute frontier.

Built on the Agg canvas through `report.plots` helpers (no pyplot, no display needed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from scalerl.report.plots import _figure, _png
from scalerl.scaling import sigmoid

if TYPE_CHECKING:
    from matplotlib.axes import Axes


def _fit_line(ax: Axes, fit: dict[str, Any] | None, xs: Sequence[float], color: str) -> None:
    if not fit or fit.get("A") is None or not xs:
        return
    grid = np.geomspace(min(xs), max(xs) * 1.5, 100)
    y = sigmoid(grid, A=fit["A"], B=fit["B"], C_mid=fit["x_mid"], R0=fit["R0"])
    ax.plot(grid, y, color=color, lw=1, ls="-" if fit["fits"] else ":", alpha=0.8)


def scaling_png(record: dict[str, Any], *, title: str = "") -> bytes:
    """Accuracy vs samples and vs generated tokens per strategy (fits drawn where they exist); a third
    panel of accuracy vs thinking tokens when the record has budget forcing."""
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    points = record.get("points", [])
    budget = record.get("budget_forcing") or []
    tree = record.get("tree") or []
    panels = 3 if budget else 2
    fig = _figure(5.0 * panels, 4.2)
    axes = fig.subplots(1, panels)
    names = list(dict.fromkeys(p["strategy"] for p in points))
    verified = record.get("verified_sampling") or []
    if verified:
        names.append("verified")
    for c, name in enumerate(names):
        pts = sorted((p for p in [*points, *verified] if p["strategy"] == name), key=lambda p: p["k"])
        color = f"C{c}"
        ks = [p["k"] for p in pts]
        acc = [p["accuracy"] for p in pts]
        style = "o" if len(ks) == 1 else ("--" if name == "random" else "o-")
        axes[0].plot(ks, acc, style, color=color, label=name, lw=1.2)
        _fit_line(axes[0], (record.get("fits") or {}).get(name), ks, color)
        axes[1].plot([p["gen_tokens_per_problem"] for p in pts], acc, style, color=color, label=name, lw=1.2)
    calc = record.get("verified_calc_sampling") or []
    if calc:
        axes[1].plot([p["gen_tokens_per_problem"] for p in calc], [p["accuracy"] for p in calc], "o:",
                     color="0.4", label="sample+calc", lw=1.2)
    for method, style in (("beam", "s--"), ("unique", "D-")):
        rows = [r for r in tree if r.get("method") == method]
        if rows:
            axes[1].plot([r["gen_tokens_per_problem"] for r in rows], [r["accuracy"] for r in rows], style,
                         color="k", label=f"tree ({method})", lw=1.2)
            if method == "unique":
                _fit_line(axes[1], record.get("tree_unique_fit"), [r["gen_tokens_per_problem"] for r in rows], "k")
    axes[0].set_xscale("log", base=2)
    axes[0].set_xlabel("samples per problem (k)")
    axes[1].set_xscale("log")
    axes[1].xaxis.set_minor_formatter(NullFormatter())
    axes[1].xaxis.set_major_formatter(ScalarFormatter())
    axes[1].set_xlabel("generated tokens per problem")
    for ax in axes[:2]:
        ax.set_ylabel("accuracy (fraction of problems)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if budget:
        forced = [r for r in budget if r["max_thinking"] is not None]
        x = [r["thinking_tokens_per_sample"] for r in forced]
        axes[2].plot(x, [r["accuracy"] for r in forced], "o-", color="C0", label="budget forcing (max)")
        _fit_line(axes[2], record.get("budget_fit"), x, "C0")
        free = [r for r in budget if r["max_thinking"] is None]
        if free:
            axes[2].plot([free[0]["thinking_tokens_per_sample"]], [free[0]["accuracy"]], "*", ms=12, color="C3",
                         label="no forcing")
        axes[2].set_xlabel("thinking tokens per sample")
        axes[2].set_ylabel("accuracy (mean@n)")
        axes[2].grid(alpha=0.3)
        axes[2].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    return _png(fig)


def frontier_png(frontier: dict[str, Any], *, title: str = "") -> bytes:
    """Accuracy vs total device-hours: one line per checkpoint across k, and the frontier."""
    fig = _figure(7.5, 4.6)
    ax = fig.add_subplot()
    from matplotlib import colormaps

    pts = frontier["points"]
    steps = sorted({p["step"] for p in pts})
    cmap = colormaps["viridis"]
    for c, step in enumerate(steps):
        mine = sorted((p for p in pts if p["step"] == step), key=lambda p: p["k"])
        ax.plot([p["total_device_hours"] for p in mine], [p["accuracy"] for p in mine], "o-", ms=4, lw=1,
                color=cmap(c / max(1, len(steps) - 1)), label=f"step {step}")
        for p in mine:
            ax.annotate(str(p["k"]), (p["total_device_hours"], p["accuracy"]), fontsize=6, xytext=(2, 2),
                        textcoords="offset points")
    front = frontier["frontier"]
    ax.step([p["total_device_hours"] for p in front], [p["accuracy"] for p in front], where="post", color="k",
            lw=2, alpha=0.5, label="frontier")
    ax.set_xscale("log")
    ax.set_xlabel(f"total compute (device-hours: RL + inference for {frontier['problems_served']} problems)")
    ax.set_ylabel("accuracy (fraction of problems)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(title or "train more or sample more? (labels: samples per problem)", fontsize=10)
    return _png(fig)
