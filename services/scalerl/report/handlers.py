"""Handlers of `scalerl fit` and `scalerl compare` (arguments in `report.commands`): read the metrics files,
fit them with `scaling` (pure math) and print or draw the result. Imported when one of the commands runs, not
for `--help`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from scalerl.endpoints import output_file_problem
from scalerl.report import plots, tables
from scalerl.report.commands import FORMULA, METRICS_SUFFIXES
from scalerl.report.online import analysis_options
from scalerl.report.runfiles import RunFileError, fit_settings, json_safe, metrics_file, read_records, run_name
from scalerl.scaling.analysis import CurveAnalysis, analyse_curve
from scalerl.scaling.compare import Comparison, compare_curves, heldout_set_warning
from scalerl.scaling.compute import AXES, axis_label, column_unit
from scalerl.scaling.constants import A_AT_BOUND
from scalerl.scaling.curves import FitError
from scalerl.scaling.data import Curve, curve_from_records

EXIT_OK = 0
EXIT_BAD_INPUT = 2


def _guarded(cmd: str, body: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    problem = output_file_problem("--plot", args.plot) if args.plot is not None else None
    if problem:
        print(f"scalerl {cmd}: error: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return body(args)
    except (FitError, RunFileError) as e:
        print(f"scalerl {cmd}: error: {e}", file=sys.stderr)
    except OSError as e:
        print(f"scalerl {cmd}: error: cannot write {e.filename}: {e.strerror}. Check the output path.",
              file=sys.stderr)
    return EXIT_BAD_INPUT


def _x_column(args: argparse.Namespace) -> str:
    """The compute column: --x, else --axis's column; both given is an error (one would be ignored)."""
    if args.x is not None and args.axis is not None:
        raise FitError(f"--x {args.x!r} and --axis {args.axis!r} both name the compute column; give one.")
    return str(args.x) if args.x is not None else AXES[args.axis or "device-hours"]


def _fit_options(args: argparse.Namespace, run: Path) -> dict[str, Any]:
    """`analyse_curve` options: the run's fit settings (`fit_settings`), each overridden by its flag."""
    opts = analysis_options(fit_settings(run))
    for key, flag in (("min_compute_fraction", "min_compute_fraction"), ("n_bootstrap", "bootstrap"),
                      ("seed", "seed"), ("level", "level")):
        if getattr(args, flag) is not None:
            opts[key] = getattr(args, flag)
    return {**opts, "min_compute": args.min_compute, "max_compute": args.max_compute}


def _window_end(args: argparse.Namespace, curve: Curve) -> float | None:
    """The fit window's end: --max-compute, or --max-compute-fraction × the curve's largest compute."""
    fraction = getattr(args, "max_compute_fraction", None)
    if fraction is None:
        return args.max_compute  # type: ignore[no-any-return]
    if args.max_compute is not None:
        raise FitError(f"--max-compute {args.max_compute:g} and --max-compute-fraction {fraction:g} both set "
                       "the end of the fit window; give one.")
    return float(fraction * curve.compute.max())


def _load_curve(path: Path, x: str, y: str) -> tuple[Path, Curve]:
    src, curve, _ = _load_run(path, x, y)
    return src, curve


def _load_run(path: Path, x: str, y: str) -> tuple[Path, Curve, list[str]]:
    """(metrics file, curve, the distinct `heldout_set` fingerprints its eval records name, in order)."""
    src = metrics_file(path)
    records = read_records(src)
    with _about(src):
        curve = curve_from_records(records, x=x, y=y)
    sets = [r["heldout_set"] for r in records
            if r.get("kind", "eval") == "eval" and isinstance(r.get("heldout_set"), str)]
    return src, curve, list(dict.fromkeys(sets))


@contextmanager
def _about(src: Path) -> Iterator[None]:
    """Prefix a FitError's message with the file it is about."""
    try:
        yield
    except FitError as e:
        raise FitError(f"{src}: {e}") from None


def fit_command(args: argparse.Namespace) -> int:
    """Handler of `scalerl fit`."""
    return _guarded("fit", _fit, args)


def _fit(args: argparse.Namespace) -> int:
    x = _x_column(args)
    src, curve = _load_curve(args.file, x, args.y)
    with _about(src):
        opts = {**_fit_options(args, src), "max_compute": _window_end(args, curve)}
        a = analyse_curve(curve, r0=args.r0, predict=args.predict, **opts)
    if args.plot is not None:
        png = plots.fit_png(curve, a, title=f"{run_name(args.file)}: pass rate vs {axis_label(x)}", x=x)
        args.plot.write_bytes(png)
    if args.json:
        print(json.dumps({**json_safe(a.to_dict()), "x": x, "x_unit": column_unit(x)}, allow_nan=False))
    else:
        print(format_fit(a, source=str(src), x=x, y=args.y, show_points=args.points))
        if args.plot is not None:
            print(f"\nplot written to {args.plot}")
    return EXIT_OK


def format_fit(
    a: CurveAnalysis, *, source: str, x: str = "compute", y: str = "pass_rate", show_points: bool = False
) -> str:
    """The human-readable report of one fit."""
    n_zero = int((a.curve.compute == 0).sum())
    r0_src = "the first eval" if a.window.r0_is_measured else "--r0"
    head = [
        f"scalerl fit {source}",
        f"  {len(a.curve)} eval points ({n_zero} at compute 0); {a.fit.n_points} fitted; R0 from {r0_src}",
        f"  x = {x} ({tables.compute_unit(x)}), y = {y} (fraction)"
        + f"; fit window [{a.min_compute:g}, {'∞' if a.max_compute is None else f'{a.max_compute:g}'}] "
        f"(cutoff: max(--min-compute, {a.min_compute_fraction:g} × the run's total compute "
        f"{a.window.total_compute:g}))",
        "",
        f"Sigmoid  {FORMULA}",
        tables.render_text(tables.fit_table(a, x=x)),
    ]
    if a.warnings:
        head += ["", "Warnings:", *[f"  - {w}" for w in a.warnings]]
    head += ["", "Forecast of a measured eval (interval: noise shared by the prompts and correlated over evals, and "
             f"the eval's own noise; \"{tables.NOT_IDENTIFIED}\": the data do not pin it, only the range is given)",
             tables.render_text(tables.forecast_table(a, x=x))]
    if a.prediction is not None:
        lo, hi = a.prediction.A_interval
        head.append(f"  A: {a.prediction.level:.0%} profile-likelihood interval [{lo:.4f}, {hi:.4f}] (checkpoint noise "
                    "included; the bootstrap interval above resamples prompts only)")
    if a.holdout is not None:
        h = a.holdout
        head += [
            "",
            f"Held-out check: {h.n_points} points beyond max compute; mean |observed − forecast| "
            f"{h.mean_abs_error:.4f}, max {h.max_abs_error:.4f}, last point {h.final_error:+.4f}",
        ]
    head += ["", "Power law  R = A − D / C^B  (for contrast, paper App. A.4)"]
    head.append(tables.render_text(tables.power_law_table(a)))
    if show_points:
        head += ["", "Eval points", tables.render_text(tables.points_table(a, x=x))]
    return "\n".join(head)


def compare_command(args: argparse.Namespace) -> int:
    """Handler of `scalerl compare`."""
    return _guarded("compare", _compare, args)


def _compare(args: argparse.Namespace) -> int:
    x = _x_column(args)
    runs: list[tuple[str, Curve]] = []
    sources: list[Path] = []
    heldout: list[tuple[str, list[str]]] = []
    for path in args.runs:
        if path.is_file() and path.suffix.lower() not in METRICS_SUFFIXES:  # e.g. a glob caught compare.png
            print(f"scalerl compare: skipping {path}: not a run folder or a metrics file "
                  f"({', '.join(sorted(METRICS_SUFFIXES))})", file=sys.stderr)
            continue
        src, curve, sets = _load_run(path, x, args.y)
        sources.append(src)
        runs.append((_unique(run_name(path), [n for n, _ in runs]), curve))
        heldout.append((runs[-1][0], sets))
    # one window rule for every run: the first run's fit settings (and the flags over them)
    opts = _fit_options(args, sources[0]) if sources else {}
    cmp = compare_curves(runs, margin=args.margin, **opts)
    if args.plot is not None:
        args.plot.write_bytes(plots.comparison_png(cmp, x=x))
    heldout_warning = heldout_set_warning(heldout)
    if args.json:
        out = {**cmp.to_dict(), "x": x, "x_unit": column_unit(x),
               "heldout_sets": {name: sets or None for name, sets in heldout},
               "warnings": [heldout_warning] if heldout_warning else []}
        print(json.dumps(json_safe(out), allow_nan=False))
    else:
        print(format_comparison(cmp, x=x))
        if heldout_warning:
            print(f"\n  warning: {heldout_warning}")
        unbounded = [r.name for r in cmp.rows if r.fit.A >= A_AT_BOUND]
        if unbounded:
            print(f"\n  warning: A sits at its bound 1.0 for {', '.join(unbounded)}: those curves have not bent "
                  "over yet, so A is not identified and the ranking rests on extrapolation; train longer.")
        if args.plot is not None:
            print(f"\nplot written to {args.plot}")
    return EXIT_OK


def _unique(name: str, taken: Sequence[str]) -> str:
    out, k = name, 2
    while out in taken:
        out, k = f"{name}#{k}", k + 1
    return out


def format_comparison(cmp: Comparison, *, x: str = "compute") -> str:
    if cmp.shared_a is not None:
        rule = (
            f"All A within ±{cmp.margin:g} (spread {cmp.a_spread:.3f}): refitted at the shared A = "
            f"{cmp.shared_a:.3f} and ranked by B (higher B = more compute-efficient)."
        )
    else:
        rule = f"A spread {cmp.a_spread:.3f} exceeds ±{cmp.margin:g}: ranked by A (the ceiling comes first)."
    head = f"  x = {x} ({tables.compute_unit(x)}); {rule}"
    lines = ["scalerl compare", head, "", tables.render_text(tables.comparison_table(cmp, x=x))]
    if cmp.caveat is not None:  # the order above is of point estimates only
        lines += ["", f"  Ranking {cmp.caveat}."]
    return "\n".join(lines)
