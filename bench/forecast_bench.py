"""`make bench` section "forecast": does the saturating-curve forecast hold on real runs?

For each seed (same `task.data_seed`, so every run is evaluated on the same held-out prompts) one RL
run of `examples/forecast.yaml` is trained from one shared SFT start. Then, per run and per fraction
f of the run's compute (25% and 50%):

1. keep the eval records up to f × the run's final compute (`truncate`);
2. fit them as `scalerl fit RUN --max-compute-fraction f` does (`scalerl.scaling.analyse_curve`: the
   paper's grid + least squares, bootstrap intervals of A over prompts, prediction intervals) with the
   one window rule of the CLI and the online fit: the early regime is left out, the evals below
   `EARLY_FRACTION` (the JobSpec's `fit.min_compute_fraction` default) of the run's total compute (the
   paper drops about one epoch, ~1.5k GPU-hours, spec §1.3); R0 is the measured step-0 pass rate;
3. forecast the eval at the run's final compute and compare it with the final measurement.

Reported, per seed and aggregated: error = predicted − measured final pass rate (fraction), the
forecast's 95% prediction interval (of one measured eval: checkpoint noise and the eval's own noise
included), whether the measurement falls in it (coverage), whether the forecast was identified (else
no point is given, only the range), and the fitted A against the final measured pass rate.

The compute axis is `compute_flops` when every eval record has it, else `compute` (device-hours:
wall-clock based, noisy on a shared machine); `--axis` overrides, and the output says which was used.

    PYTHONPATH=services python bench/forecast_bench.py --seeds 0,1,2 --out bench/results.json
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from results_file import merge_sections
from scalerl.console import quiet_third_party_bars

FRACTIONS = (0.25, 0.5)
"""Fractions of the run's final compute the forecast may see (the default; `--forecast-fractions`)."""
EARLY_FRACTION = 0.1
"""Evals below this fraction of the run's total compute are the early regime, left out of every fit (the
JobSpec's `fit.min_compute_fraction` default, so the bench fits the window `scalerl fit` fits)."""
AXES = ("compute_flops", "compute")
AXIS_UNITS = {"compute": "device-hours", "compute_flops": "FLOPs"}
LEVEL = 0.95

Record = Mapping[str, Any]


# -- pure parts (unit-tested on synthetic records) ---------------------------------------------------
def eval_records(records: Sequence[Record]) -> list[Record]:
    """The eval records (`kind` absent or "eval"), in file order."""
    return [r for r in records if r.get("kind", "eval") == "eval"]


def choose_axis(records: Sequence[Record], requested: str = "auto") -> str:
    """`requested`, or for "auto" `compute_flops` when every eval record has it, else `compute`."""
    if requested != "auto":
        if requested not in AXES:
            raise ValueError(f"axis must be one of {['auto', *AXES]}, got {requested!r}")
        return requested
    evals = eval_records(records)
    has_flops = bool(evals) and all(isinstance(r.get("compute_flops"), int | float) for r in evals)
    return "compute_flops" if has_flops else "compute"


def truncate(records: Sequence[Record], axis: str, fraction: float) -> list[Record]:
    """Eval records with `axis` ≤ fraction × the largest `axis` of any eval record (the run's end)."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    evals = eval_records(records)
    end = max(float(r[axis]) for r in evals)
    return [r for r in evals if float(r[axis]) <= fraction * end + 1e-12 * end]


def is_covered(measured: float, lo: float | None, hi: float | None) -> bool | None:
    """Whether `measured` lies in [lo, hi]; None when there is no interval."""
    if lo is None or hi is None:
        return None
    return lo <= measured <= hi


def final_measurement(records: Sequence[Record], axis: str) -> tuple[float, float, float | None]:
    """(axis value, pass rate, standard error over prompts or None) of the last eval of the run."""
    last = max(eval_records(records), key=lambda r: float(r[axis]))
    rates = last.get("prompt_pass_rates")
    se = None
    if isinstance(rates, list) and len(rates) > 1:
        mean = sum(rates) / len(rates)
        se = math.sqrt(sum((x - mean) ** 2 for x in rates) / (len(rates) - 1) / len(rates))
    return float(last[axis]), float(last["pass_rate"]), se


def summarise(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Aggregate per-seed forecast rows of one fraction: mean error and mean |error| of the points given,
    coverage k/n of the identified forecasts' intervals, refusals (and how often their ranges covered),
    widths, A."""
    fitted = [r for r in rows if "fit_error" not in r]
    ok = [r for r in fitted if r.get("predicted") is not None]
    refused = [r for r in fitted if r.get("identified") is False]
    covered = [r["covered"] for r in ok if r.get("covered") is not None]
    widths = [r["hi"] - r["lo"] for r in ok if r.get("lo") is not None and r.get("hi") is not None]

    def mean(xs: Sequence[float]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    return {
        "runs": len(rows), "fitted": len(fitted), "identified": len(ok), "refused": len(refused),
        "refused_range_covered": sum(bool(r.get("covered")) for r in refused),
        "mean_error": mean([r["error"] for r in ok]),
        "mean_abs_error": mean([abs(r["error"]) for r in ok]),
        "covered": sum(covered), "with_interval": len(covered),
        "coverage": (sum(covered) / len(covered)) if covered else None,
        "mean_interval_width": mean(widths),
        "mean_A": mean([r["A"] for r in fitted]),
        "mean_measured_final": mean([r["measured"] for r in rows]),
    }


# -- fitting one run (scaling package; no I/O) -------------------------------------------------------
def forecast_row(records: Sequence[Record], *, axis: str, fraction: float, early_fraction: float = EARLY_FRACTION,
                 n_bootstrap: int = 200, seed: int = 0) -> dict[str, Any]:
    """Fit on the records up to `fraction` of the run's compute (leaving out those below `early_fraction` of
    it) and forecast its final pass rate: `predicted` is None when the forecast is not identified."""
    from scalerl.scaling import FitError, analyse_curve, curve_from_records

    end, measured, measured_se = final_measurement(records, axis)
    prefix = truncate(records, axis, fraction)
    row: dict[str, Any] = {"fraction": fraction, "fit_until": fraction * end, "final_compute": end,
                           "measured": measured, "measured_se": measured_se, "n_evals_seen": len(prefix)}
    try:
        curve = curve_from_records(prefix, x=axis)
        a = analyse_curve(curve, min_compute_fraction=early_fraction, total_compute=end, predict=[end],
                          n_bootstrap=n_bootstrap, seed=seed, level=LEVEL)
    except FitError as e:
        return {**row, "predicted": None, "fit_error": str(e)}
    f = a.forecasts[0]
    a_ci = a.bootstrap.interval("A") if a.bootstrap is not None else (None, None)
    return {**row, "n_points_fitted": a.fit.n_points, "predicted": f.pass_rate, "lo": f.lo, "hi": f.hi,
            "identified": f.identified, "early_compute": a.min_compute,
            "error": None if f.pass_rate is None else f.pass_rate - measured,
            "covered": is_covered(measured, f.lo, f.hi),
            "A": a.fit.A, "A_lo": a_ci[0], "A_hi": a_ci[1], "B": a.fit.B, "C_mid": a.fit.C_mid,
            "R0": a.fit.R0, "warnings": list(a.warnings)}


def analyse_runs(runs: Mapping[int, Sequence[Record]], *, axis: str, early_fraction: float = EARLY_FRACTION,
                 n_bootstrap: int = 200, fractions: Sequence[float] = FRACTIONS) -> dict[str, Any]:
    """Per seed and per fraction (plus the full run's A), and the aggregate per fraction."""
    per_seed: dict[str, Any] = {}
    for seed, records in runs.items():
        rows = [forecast_row(records, axis=axis, fraction=f, early_fraction=early_fraction, n_bootstrap=n_bootstrap)
                for f in fractions]
        full = forecast_row(records, axis=axis, fraction=1.0, early_fraction=early_fraction,
                            n_bootstrap=n_bootstrap)
        per_seed[str(seed)] = {"forecasts": rows, "full_fit_A": full.get("A"),
                               "full_fit_A_ci": [full.get("A_lo"), full.get("A_hi")],
                               "initial_pass_rate": eval_records(records)[0]["pass_rate"],
                               "evals": [[int(r["step"]), float(r[axis]), float(r["pass_rate"])]
                                         for r in eval_records(records)],
                               "final_pass_rate": rows[0]["measured"]}
    aggregate = {str(f): summarise([s["forecasts"][i] for s in per_seed.values()]) for i, f in enumerate(fractions)}
    return {"per_seed": per_seed, "aggregate": aggregate}


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "—" if x is None else format(x, spec)


def format_table(result: Mapping[str, Any]) -> str:
    """Markdown table: one row per seed and fraction, then one aggregate row per fraction."""
    axis = result["axis"]
    head = [f"compute axis: {axis} ({AXIS_UNITS[axis]}); pass rates are held-out mean@k fractions; "
            f"interval: {LEVEL:.0%} prediction interval of the final eval (\"not identified\": no point, the range "
            "only); A's interval: bootstrap over prompts",
            "",
            "| seed | fit on | evals seen | predicted final | 95% interval | measured final (± s.e.) | error | "
            "covered | fitted A (95% interval) |",
            "|---|---|---|---|---|---|---|---|---|"]
    for seed, s in result["per_seed"].items():
        for r in s["forecasts"]:
            interval = f"[{_fmt(r.get('lo'))}, {_fmt(r.get('hi'))}]"
            a = f"{_fmt(r.get('A'))} [{_fmt(r.get('A_lo'))}, {_fmt(r.get('A_hi'))}]"
            cov = {True: "yes", False: "no", None: "—"}[r.get("covered")]
            point = "not identified" if r.get("identified") is False else _fmt(r.get("predicted"))
            head.append(f"| {seed} | first {r['fraction']:.0%} | {r['n_evals_seen']} | {point} | "
                        f"{interval} | {r['measured']:.3f} ± {_fmt(r.get('measured_se'))} | "
                        f"{_fmt(r.get('error'), '+.3f')} | {cov} | {a} |")
    for f, agg in result["aggregate"].items():
        head.append(f"| all | first {float(f):.0%} | | {agg['refused']}/{agg['fitted']} not identified "
                    f"({agg['refused_range_covered']} ranges covered) | "
                    f"mean width {_fmt(agg['mean_interval_width'])} | "
                    f"mean {_fmt(agg['mean_measured_final'])} | mean {_fmt(agg['mean_error'], '+.3f')}, "
                    f"mean abs {_fmt(agg['mean_abs_error'])} | {agg['covered']}/{agg['with_interval']} | "
                    f"mean {_fmt(agg['mean_A'])} |")
    return "\n".join(head)


def forecast_png(result: Mapping[str, Any]) -> bytes:
    """One panel per seed: the evals against compute (log x; the early regime hollow), each fraction's
    fitted curve drawn to the run's end from its cut-off (dotted line), its forecast with the 95% interval
    at the final compute (a dotted range without a point when not identified), and the final measurement."""
    import io

    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter

    from scalerl.scaling import sigmoid
    from scalerl.scaling.compute import axis_label

    seeds = list(result["per_seed"].items())
    fig = Figure(figsize=(4.2 * len(seeds), 4.0), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(seeds), sharey=True, squeeze=False)[0]
    colors = {0.25: "C1", 0.5: "C2"}
    for ax, (seed, s) in zip(axes, seeds, strict=True):
        _, x, y = (np.array(col, dtype=float) for col in zip(*s["evals"], strict=True))
        early = x < EARLY_FRACTION * float(x.max())
        pos = x > 0
        ax.scatter(x[pos & ~early], y[pos & ~early], s=14, color="C0", zorder=3, label="eval")
        ax.scatter(x[pos & early], y[pos & early], s=14, facecolors="none", edgecolors="C0", zorder=3,
                   label="early regime (left out)")
        end = float(x.max())
        for i, r in enumerate(s["forecasts"]):
            color = colors.get(r["fraction"], f"C{3 + i}")
            ax.axvline(r["fit_until"], color=color, ls=":", lw=1)
            if r.get("A") is None:
                continue
            grid = np.geomspace(x[pos].min(), end, 200)
            ax.plot(grid, sigmoid(grid, A=r["A"], B=r["B"], C_mid=r["C_mid"], R0=r["R0"]), color=color, lw=1.3,
                    label=f"fit on first {r['fraction']:.0%}")
            xe = end * (1.04 + 0.05 * i)
            if r.get("predicted") is not None:
                ax.errorbar([xe], [r["predicted"]], yerr=[[r["predicted"] - r["lo"]], [r["hi"] - r["predicted"]]],
                            color=color, fmt="s", ms=4, capsize=3)
            elif r.get("lo") is not None:  # not identified: the range only
                ax.vlines([xe], [r["lo"]], [r["hi"]], color=color, lw=2, linestyles="dotted")
        ax.scatter([end], [s["final_pass_rate"]], s=40, marker="*", color="k", zorder=4, label="final measured")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(axis_label(result["axis"]))
        ax.set_title(f"seed {seed}", fontsize=10)
    axes[0].set_ylabel("held-out pass rate")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 2 * len(seeds)), fontsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


# -- the runs (training; the only I/O) ---------------------------------------------------------------
Runs = dict[int, list[dict[str, Any]]]


def kept_run(run_dir: Path, spec_text: str, flag: str) -> bool:
    """Whether `run_dir` holds a finished run (summary.json written) of the spec `spec_text` to read instead of
    training it; False when there is nothing there. A run of another spec, or an unfinished one, stops the
    bench with a line naming `flag`, the folder option it came from."""
    if (run_dir / "summary.json").is_file():
        if (run_dir / "spec.yaml").read_text() != spec_text:
            raise SystemExit(f"{flag}: {run_dir} holds a run of another spec; give a new folder")
        return True
    if run_dir.exists():
        raise SystemExit(f"{flag}: {run_dir} holds an unfinished run; remove it to train it again")
    return False


def train_runs(spec_path: str, overrides: Sequence[str], seeds: Sequence[int], work: Path,
               init_checkpoint: str | None = None,
               on_run: Callable[[Runs, dict[str, Any]], None] | None = None) -> tuple[Runs, dict[str, Any]]:
    """One RL run per seed from one start (`init_checkpoint`, else one SFT shared by every seed when the spec
    asks for SFT, else the spec's own model); returns ({seed: its records}, timing). Prints progress and
    calls `on_run(runs so far, timing)` after each run. A run already finished in `work/seed<S>` (its
    summary.json written, its spec.yaml the one this run would write) is read, not trained again, and so
    is an SFT start in `work/sft`: an interrupted bench resumes, and kept runs can be re-analysed."""
    from scalerl.config import dump_spec, load_spec
    from scalerl.parts import make_task, seed_everything
    from scalerl.runtime.embedded import EmbeddedRun
    from scalerl.runtime.outputs import RunOutputs
    from scalerl.runtime.setup import initial_model

    t0 = time.perf_counter()
    base = load_spec(spec_path, list(overrides))
    sft_spec = work / "sft.spec.yaml"  # the spec whose SFT start work/sft is
    if init_checkpoint is None and (work / "sft" / "config.json").is_file():
        if not sft_spec.is_file() or sft_spec.read_text() != dump_spec(base):
            raise SystemExit(f"--forecast-work: {work / 'sft'} is the SFT start of another spec; give a new folder")
        init_checkpoint = str(work / "sft")
        print(f"forecast: reusing the SFT start in {init_checkpoint}", file=sys.stderr, flush=True)
    if init_checkpoint is None and base.model.init_checkpoint is None and base.sft.steps > 0:
        print(f"forecast: SFT warm start ({base.sft.steps} steps), shared by every seed...", file=sys.stderr,
              flush=True)
        seed_everything(base.seed)
        initial_model(base, make_task(base), work)
        if (work / "sft" / "config.json").is_file():  # not when the task has no gold solutions
            init_checkpoint = str(work / "sft")
            sft_spec.write_text(dump_spec(base))
    start = [f"model.init_checkpoint={init_checkpoint}"] if init_checkpoint else []  # else the spec's own start
    sft_s = time.perf_counter() - t0
    runs: Runs = {}
    run_s: list[float] = []
    reused: list[int] = []
    timing = {"sft_wall_s": sft_s, "run_wall_s": run_s, "steps": base.train.steps,
              "eval_every_steps": base.eval.every_steps, "data_seed": base.task.data_seed,
              "init_checkpoint": init_checkpoint, "reused_seeds": reused}
    for i, seed in enumerate(seeds):
        spec = load_spec(spec_path, [*overrides, f"seed={seed}", *start])
        run_dir = work / f"seed{seed}"
        if kept_run(run_dir, dump_spec(spec), "--forecast-work"):
            print(f"forecast: seed {seed} ({i + 1}/{len(seeds)}) already run in {run_dir}; reading it",
                  file=sys.stderr, flush=True)
            reused.append(seed)
            runs[seed] = RunOutputs(run_dir).read(run_dir / "metrics.jsonl")
            if on_run is not None:
                on_run(runs, timing)
            continue
        t1 = time.perf_counter()
        summary = EmbeddedRun(spec, run_dir, show_progress=sys.stderr.isatty()).run()
        run_s.append(time.perf_counter() - t1)
        runs[seed] = RunOutputs(run_dir).read(run_dir / "metrics.jsonl")
        eta = (len(seeds) - len(runs)) * sum(run_s) / len(run_s)
        print(f"forecast: seed {seed} ({i + 1}/{len(seeds)}) {summary['steps']} steps in {run_s[-1]:.0f} s wall "
              f"({summary['steps'] / run_s[-1] * 3600:.0f} steps/hour incl. evals); pass rate "
              f"{summary['initial_pass_rate']:.3f} -> {summary['final_pass_rate']:.3f}; ETA {eta:.0f} s",
              file=sys.stderr, flush=True)
        if on_run is not None:
            on_run(runs, timing)
    return runs, timing


def bench_forecast(spec_path: str, overrides: Sequence[str], seeds: Sequence[int], *, axis: str = "auto",
                   n_bootstrap: int = 200, work: Path | None = None, init_checkpoint: str | None = None,
                   fractions: Sequence[float] = FRACTIONS,
                   on_partial: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Train the runs, forecast each from its first `fractions` of compute, and return the JSON-able result
    (`on_partial` gets the result over the runs finished so far, after each run, with complete=False)."""
    t0 = time.perf_counter()

    def result(runs: Runs, timing: dict[str, Any]) -> dict[str, Any]:
        used = choose_axis(next(iter(runs.values())), axis)
        heldout = {str(s): sorted({str(r.get("heldout_set")) for r in eval_records(recs)}) for s, recs in runs.items()}
        return {"spec": spec_path, "overrides": list(overrides), "seeds": list(seeds), "complete": False,
                "axis": used, "axis_unit": AXIS_UNITS[used], "fractions": list(fractions),
                "early_fraction_left_out": EARLY_FRACTION, "n_bootstrap": n_bootstrap, "level": LEVEL,
                "heldout_sets": heldout, **timing,
                **analyse_runs(runs, axis=used, n_bootstrap=n_bootstrap, fractions=fractions),
                "wall_s": time.perf_counter() - t0}

    def partial(runs: Runs, timing: dict[str, Any]) -> None:
        if on_partial is not None and len(runs) < len(seeds):
            on_partial(result(runs, timing))

    with tempfile.TemporaryDirectory(prefix="scalerl-forecast-") as tmp:
        runs, timing = train_runs(spec_path, overrides, seeds, work or Path(tmp), init_checkpoint, partial)
    return {**result(runs, timing), "complete": True}


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds: {text!r} is not a comma-separated list of integers") from None
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"--seeds: give distinct integers >= 0, got {text!r}")
    return seeds


def _fractions(text: str) -> list[float]:
    from scalerl.report.commands import open_fraction  # `scalerl fit --max-compute-fraction`'s own check

    try:
        fractions = sorted({open_fraction(s) for s in text.split(",") if s.strip()})
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"--fractions: {e}") from None
    if not fractions:
        raise argparse.ArgumentTypeError(f"--fractions: give fractions in (0, 1), e.g. 0.25,0.5; got {text!r}")
    return fractions


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--forecast-spec", default="examples/forecast.yaml", help="job spec of the forecast runs")
    ap.add_argument("--forecast-seeds", type=_seeds, default=[0, 1, 2], metavar="S1,S2,S3",
                    help="run seeds (one task.data_seed for all; the section's claim is over >= 3, "
                         "fewer is a spot check, e.g. of a model too slow for three runs)")
    ap.add_argument("--forecast-axis", choices=["auto", *AXES], default="auto",
                    help="compute axis (auto: compute_flops when the records have it, else compute)")
    ap.add_argument("--forecast-bootstrap", type=int, default=200, metavar="N", help="bootstrap resamples")
    ap.add_argument("--forecast-init", default=None, metavar="DIR",
                    help="SFT model folder to start every seed from (default: run SFT once)")
    ap.add_argument("--forecast-fractions", type=_fractions, default=list(FRACTIONS), metavar="F1,F2",
                    help="fit on the evals up to these fractions of each run's final compute (default 0.25,0.5)")
    ap.add_argument("--forecast-work", default=None, metavar="DIR",
                    help="keep every run in DIR/seed<S> (metrics.jsonl, report.html; `scalerl fit` reads it) and "
                         "read, not retrain, the runs already finished there; default: a temporary folder")
    ap.add_argument("--forecast-plot", default=None, metavar="PNG",
                    help="also draw each run with its 25%%/50%% fits and forecasts to this PNG")


def run_section(args: argparse.Namespace, overrides: Sequence[str],
                on_partial: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The bench section as `run_bench.py` calls it: train, analyse, print the table."""
    if not Path(args.forecast_spec).is_file():
        print(f"--forecast-spec: {args.forecast_spec} is not a file; give a job spec YAML", file=sys.stderr)
        raise SystemExit(2)
    plot = Path(args.forecast_plot) if args.forecast_plot else None
    work = Path(args.forecast_work) if args.forecast_work else None
    if work is not None and ((work.exists() and not work.is_dir()) or not work.parent.is_dir()):
        print(f"--forecast-work: {work} must be a folder (new, or of an earlier run of this bench) in an "
              "existing folder", file=sys.stderr)
        raise SystemExit(2)
    if plot is not None and (plot.suffix.lower() != ".png" or not plot.parent.is_dir()):
        print(f"--forecast-plot: {plot} must be a .png path in an existing folder", file=sys.stderr)
        raise SystemExit(2)
    if work is not None:
        work.mkdir(exist_ok=True)
    shown = "/".join(f"{f:.0%}" for f in args.forecast_fractions)
    print(f"bench: forecast from the first {shown} of {len(args.forecast_seeds)} runs of {args.forecast_spec}...",
          file=sys.stderr, flush=True)
    result = bench_forecast(args.forecast_spec, overrides, args.forecast_seeds, axis=args.forecast_axis,
                            n_bootstrap=args.forecast_bootstrap, work=work, fractions=args.forecast_fractions,
                            init_checkpoint=args.forecast_init, on_partial=on_partial)
    print(format_table(result))
    if plot is not None:
        plot.write_bytes(forecast_png(result))
        print(f"wrote {plot}")
    print(f"forecast section: {result['wall_s']:.0f} s wall")
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench/results.json", help="results file")
    ap.add_argument("--section", default="forecast", help="the key of the results file the section goes under")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="spec override, as for `scalerl run`")
    add_arguments(ap)
    args = ap.parse_args()
    quiet_third_party_bars()  # transformers' deprecation notices and load bars, as the CLI does
    out = Path(args.out)

    def write(result: dict[str, Any]) -> None:
        merge_sections(out, {args.section: result})

    write(run_section(args, args.overrides, on_partial=write))
    print(f"wrote {out} (key {args.section!r})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
