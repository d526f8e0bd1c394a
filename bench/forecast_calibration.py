"""`make bench` section "forecast_calibration": are the forecast intervals honest, on many runs with known curves?

Simulated RL runs (`scalerl.scaling.simulate`: a known sigmoid, held-out prompts of Beta-distributed
difficulty, a policy wobble shared by every prompt of an eval and AR(1)-correlated over evals, binomial
sampling) in three regimes — the curve bent by half the run ("bent"), bending around half ("near"), not yet
bent at half ("not-yet") — are fitted from 25%, 50% and 75% of their compute through the function
`scalerl fit` calls (`analyse_curve`, with the CLI's window: the early regime is the evals below 10% of the
run's total compute), and the final measured eval is compared with two forecasts of it:

- "ours" — the prediction interval of a measured eval (`scaling.predict`), with no point when the forecast
  is not identified;
- "today" — what shipped before issue #31: the fitted curve's value and the prompt bootstrap's percentile
  band of the curve (`analysis.bootstrap_band_forecast`), never refused. Same fit, same window.

Per regime and fraction: coverage = how often the final eval lies in the interval, over every interval
shown: a point's prediction interval, or the range a refused forecast gives instead of a point (so the
range must cover too); the same over the identified forecasts alone (`coverage_identified`) and over the
refused ranges alone (`range_coverage`); refused = the fraction not identified; the median interval width
and the mean |point − final eval| over the identified forecasts. Runs whose window cannot support a fit
(fewer than 4 points) count as refused for both methods and are reported as `no_fit`.

    PYTHONPATH=services python bench/forecast_calibration.py --runs 200 --out bench/results.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from results_file import merge_sections

FRACTIONS = (0.25, 0.5, 0.75)
REGIMES = ("bent", "near", "not-yet")
PROMPTS = (128, 32)
"""Held-out prompts per eval (× 8 samples): the issue's setting, and fewer prompts as in the SmolLM2 example."""
EARLY_FRACTION = 0.1
"""The early regime left out: the JobSpec's `fit.min_compute_fraction` default, of the run's total compute."""
LEVEL = 0.95
WOBBLE_AR = 0.7
"""The simulated wobble's correlation from one eval to the next (`--wobble-ar` varies it; the method's prior
stays 0.7, `scaling.noise.WOBBLE_AR`)."""
METHODS = ("ours", "today")
TARGETS = {
    "0.5": {"coverage_min": 0.92, "coverage_max_bent": 0.995, "bent_refused_max": 0.05, "bent_width_max": 0.12,
            "bent_mae_max": 0.03, "not-yet_refused_min": 0.30},
    "0.25": {"refused_min": 0.80},
    "0.75": {"coverage_min": 0.90},
}
"""Issue #31's targets at nominal 95% for the 128-prompt setting (`check_targets`)."""

Row = dict[str, Any]


def forecast_row(regime: str, seed: int, fraction: float, *, n_prompts: int, n_bootstrap: int,
                 wobble_ar: float = WOBBLE_AR) -> Row:
    """Simulate run `seed` of `regime`, fit its first `fraction` of compute, forecast its final eval both ways
    (today's interval is None with n_bootstrap = 0)."""
    from scalerl.scaling import FitError, analyse_curve, curve_from_records
    from scalerl.scaling.analysis import bootstrap_band_forecast
    from scalerl.scaling.simulate import SimSettings, simulate_run

    sim = simulate_run(regime, seed, SimSettings(n_prompts=n_prompts, wobble_ar=wobble_ar))
    end = sim.records[-1]["compute"]
    final = sim.records[-1]["pass_rate"]
    prefix = [r for r in sim.records if r["compute"] <= fraction * end * (1 + 1e-12)]
    row: Row = {"regime": regime, "seed": seed, "fraction": fraction, "n_prompts": n_prompts, "final": final}
    t0 = time.perf_counter()
    try:  # the window `scalerl fit RUN --max-compute-fraction F` fits (early regime: below 10% of the run)
        a = analyse_curve(curve_from_records(prefix), min_compute_fraction=EARLY_FRACTION, total_compute=end,
                          predict=[end], n_bootstrap=n_bootstrap, seed=seed, level=LEVEL)
    except FitError:
        return {**row, "no_fit": True, "ours": None, "today": None}
    ours = a.forecasts[0]
    today = bootstrap_band_forecast(a.fit, a.bootstrap, [end])[0]
    return {**row, "no_fit": False, "wall_s": time.perf_counter() - t0,
            "ours": {**asdict(ours), "covered": _covers(ours.lo, ours.hi, final),
                     "id_width": a.prediction.predictions[0].id_width if a.prediction is not None else None},
            "today": {**asdict(today), "covered": _covers(today.lo, today.hi, final)}}


def _covers(lo: float | None, hi: float | None, x: float) -> bool | None:
    return None if lo is None or hi is None else lo <= x <= hi


def _row_task(args: tuple[str, int, float, int, int, float]) -> Row:
    regime, seed, fraction, n_prompts, n_bootstrap, wobble_ar = args
    return forecast_row(regime, seed, fraction, n_prompts=n_prompts, n_bootstrap=n_bootstrap, wobble_ar=wobble_ar)


def summarise(rows: Sequence[Row], method: str) -> dict[str, Any]:
    """One regime and fraction for `method` ("ours" or "today"): coverage of the final eval by the interval
    shown (a point's prediction interval, or a refused forecast's range), the same over the identified
    forecasts and over the refused ones' ranges apart, the refused fraction (no fit counts as refused), and
    the median interval width and mean |point − final eval| of the identified forecasts."""
    fitted = [r for r in rows if not r["no_fit"]]
    shown = [r for r in fitted if r[method]["pass_rate"] is not None]
    refused = [r[method] for r in fitted if r[method]["pass_rate"] is None]
    with_interval = [r[method] for r in fitted if r[method]["lo"] is not None]
    identified = [r[method] for r in shown if r[method]["lo"] is not None]
    return {
        "runs": len(rows),
        "no_fit": len(rows) - len(fitted),
        "coverage": _mean(f["covered"] for f in with_interval),
        "coverage_identified": _mean(f["covered"] for f in identified),
        "identified": len(shown),
        "range_coverage": _mean(f["covered"] for f in refused),
        "refused": (len(refused) + len(rows) - len(fitted)) / len(rows) if rows else None,
        "median_width": statistics.median(f["hi"] - f["lo"] for f in identified) if identified else None,
        "mean_abs_error": _mean(abs(r[method]["pass_rate"] - r["final"]) for r in shown),
        "id_width_percentiles": _percentiles([r[method].get("id_width") for r in fitted]),
    }


def _percentiles(values: Sequence[float | None]) -> dict[str, float] | None:
    """5th/30th/50th/95th/99th percentiles of the identification widths (the threshold's calibration)."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    return {str(q): xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))] for q in (5, 30, 50, 95, 99)}


def _mean(xs: Iterable[float]) -> float | None:
    values = [float(x) for x in xs]
    return sum(values) / len(values) if values else None


def calibration(*, runs: int, fractions: Sequence[float] = FRACTIONS, regimes: Sequence[str] = REGIMES,
                prompts: Sequence[int] = PROMPTS, n_bootstrap: int = 200, jobs: int = 1, wobble_ar: float = WOBBLE_AR,
                first_seed: int = 0) -> dict[str, Any]:
    """The table: {prompts: {fraction: {regime: {method: summary}}}} and the mean wall time of one analysis."""
    tasks = [(g, s, f, p, n_bootstrap, wobble_ar) for p in prompts for f in fractions for g in regimes
             for s in range(first_seed, first_seed + runs)]
    rows: list[Row] = []
    t0, shown = time.perf_counter(), 0.0

    def progress(row: Row) -> None:  # on stderr, about every 5%: done, rate, ETA
        nonlocal shown
        rows.append(row)
        done = len(rows)
        if done == len(tasks) or done / len(tasks) >= shown + 0.05:
            shown = done / len(tasks)
            rate = done / max(time.perf_counter() - t0, 1e-9)
            print(f"forecast_calibration: {done}/{len(tasks)} fits, {rate:.1f} fits/s, "
                  f"ETA {(len(tasks) - done) / rate / 60:.1f} min", file=sys.stderr, flush=True)

    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            for row in pool.map(_row_task, tasks, chunksize=8):
                progress(row)
    else:
        for t in tasks:
            progress(_row_task(t))
    table: dict[str, Any] = {}
    for p in prompts:
        for f in fractions:
            for g in regimes:
                sel = [r for r in rows if r["n_prompts"] == p and r["fraction"] == f and r["regime"] == g]
                table.setdefault(str(p), {}).setdefault(str(f), {})[g] = {m: summarise(sel, m) for m in METHODS}
    walls = [r["wall_s"] for r in rows if not r["no_fit"]]
    return {"table": table, "mean_analysis_wall_s": _mean(walls)}


def check_targets(table: Mapping[str, Any], method: str = "ours") -> list[str]:
    """Issue #31's targets (`TARGETS`) that `method` misses in one prompt setting's table {fraction: {regime:
    {method: summary}}}; [] when it meets them all. A fraction missing from the table is not checked."""
    misses: list[str] = []

    def need(ok: bool, what: str) -> None:
        if not ok:
            misses.append(what)

    half = table.get("0.5")
    if half is not None:
        for g, cell in half.items():
            cov = cell[method]["coverage"]
            need(cov is not None and cov >= TARGETS["0.5"]["coverage_min"], f"50% {g}: coverage {cov}")
        bent = half["bent"][method]
        need(bent["coverage"] is not None and bent["coverage"] <= TARGETS["0.5"]["coverage_max_bent"],
             f"50% bent: coverage {bent['coverage']} (vacuous)")
        need(bent["refused"] <= TARGETS["0.5"]["bent_refused_max"], f"50% bent: refused {bent['refused']}")
        need(bent["median_width"] is not None and bent["median_width"] <= TARGETS["0.5"]["bent_width_max"],
             f"50% bent: median width {bent['median_width']}")
        need(bent["mean_abs_error"] is not None and bent["mean_abs_error"] <= TARGETS["0.5"]["bent_mae_max"],
             f"50% bent: mean |error| {bent['mean_abs_error']}")
        refused = half["not-yet"][method]["refused"]
        need(refused >= TARGETS["0.5"]["not-yet_refused_min"], f"50% not-yet: refused {refused}")
    early = table.get("0.25")
    if early is not None:
        for g, cell in early.items():
            refused = cell[method]["refused"]
            need(refused >= TARGETS["0.25"]["refused_min"], f"25% {g}: refused {refused}")
    late = table.get("0.75")
    if late is not None:
        for g, cell in late.items():
            cov = cell[method]["coverage"]
            need(cov is None or cov >= TARGETS["0.75"]["coverage_min"], f"75% {g}: coverage {cov}")
    return misses


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "—" if x is None else format(x, spec)


def format_table(result: Mapping[str, Any]) -> str:
    """Markdown: one row per prompts × fraction × regime, ours beside today's."""
    lines = [f"{result['runs']} simulated runs per regime; nominal {LEVEL:.0%}; coverage: of the final eval by the "
             "interval shown (identified: prediction interval; refused: the range); width and |error|: identified",
             "",
             "| prompts × 8 | fit on | regime | coverage ours / today | refused ours / today | ours: coverage "
             "identified (n) / ranges | median width ours / today | mean abs error ours / today |",
             "|---|---|---|---|---|---|---|---|"]
    for p, by_f in result["table"].items():
        for f, by_g in by_f.items():
            for g, cell in by_g.items():
                o, t = cell["ours"], cell["today"]
                lines.append(f"| {p} | first {float(f):.0%} | {g} | {_fmt(o['coverage'])} / {_fmt(t['coverage'])} | "
                             f"{_fmt(o['refused'], '.2f')} / {_fmt(t['refused'], '.2f')} | "
                             f"{_fmt(o['coverage_identified'])} ({o['identified']}) / {_fmt(o['range_coverage'])} | "
                             f"{_fmt(o['median_width'])} / {_fmt(t['median_width'])} | "
                             f"{_fmt(o['mean_abs_error'], '.4f')} / {_fmt(t['mean_abs_error'], '.4f')} |")
    return "\n".join(lines)


def _fraction_list(text: str) -> list[float]:
    try:
        out = sorted({float(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--fractions: {text!r} is not a comma-separated list of numbers") from None
    if not out or not all(0 < f < 1 for f in out):
        raise argparse.ArgumentTypeError(f"--fractions: give fractions in (0, 1), got {text!r}")
    return out


def _int_list(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prompts: {text!r} is not a comma-separated list of integers") from None
    if not out or min(out) < 2:
        raise argparse.ArgumentTypeError(f"--prompts: give prompt counts >= 2, got {text!r}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=200, help="simulated runs per regime, fraction and prompt count")
    ap.add_argument("--fractions", type=_fraction_list, default=list(FRACTIONS), metavar="F1,F2")
    ap.add_argument("--prompts", type=_int_list, default=list(PROMPTS), metavar="P1,P2",
                    help="held-out prompts per eval (8 samples each)")
    ap.add_argument("--bootstrap", type=int, default=200, help="resamples of today's prompt bootstrap (0: skip it)")
    ap.add_argument("--wobble-ar", type=float, default=WOBBLE_AR, metavar="PHI",
                    help="the simulated wobble's eval-to-eval correlation (the method assumes 0.7 whatever this is)")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--out", default="bench/results.json", help="results file")
    ap.add_argument("--section", default="forecast_calibration", help="the key of the results file")
    args = ap.parse_args(argv)
    if args.runs < 1 or args.jobs < 1 or args.bootstrap < 0 or args.bootstrap == 1 or not 0 <= args.wobble_ar < 1:
        ap.error("--runs and --jobs must be >= 1, --bootstrap 0 or >= 2, --wobble-ar in [0, 1)")
    t0 = time.perf_counter()
    res = calibration(runs=args.runs, fractions=args.fractions, prompts=args.prompts, n_bootstrap=args.bootstrap,
                      wobble_ar=args.wobble_ar,
                      jobs=args.jobs)
    result = {"runs": args.runs, "fractions": args.fractions, "regimes": list(REGIMES), "prompts": args.prompts,
              "samples_per_prompt": 8, "wobble_ar": args.wobble_ar, "level": LEVEL, "early_fraction": EARLY_FRACTION,
              "n_bootstrap": args.bootstrap,
              **res, "targets": TARGETS,
              "misses": {m: check_targets(res["table"].get("128", {}), m) for m in METHODS
                         if m == "ours" or args.bootstrap},
              "wall_s": time.perf_counter() - t0}
    print(format_table(result))
    for m, misses in result["misses"].items():
        print(f"{m}: " + ("meets issue #31's targets (128 prompts)" if not misses else "misses " + "; ".join(misses)))
    print(f"forecast_calibration: {result['wall_s']:.0f} s wall, {res['mean_analysis_wall_s']:.3f} s per analysis "
          f"(fit + {args.bootstrap} bootstrap resamples + prediction)")
    merge_sections(Path(args.out), {args.section: result})
    print(f"wrote {args.out} (key {args.section!r})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
