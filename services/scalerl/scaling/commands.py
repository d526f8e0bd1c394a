"""`scalerl fit` and `scalerl compare`: the command-line edge of the scaling package (the only file I/O).

    scalerl fit runs/quick                      # a run folder or a metrics file (JSONL, JSON list, CSV)
    scalerl fit metrics.jsonl --max-compute 50 --predict 100,200 --plot curve.png
    scalerl fit wandb_export.csv --x gpu_hours --y eval/pass_rate --json
    scalerl fit runs/quick --axis flops         # the machine-independent axis (compute_flops)
    scalerl compare runs/a runs/b runs/c --plot compare.png

The fit procedure (early-regime cutoff, bootstrap resamples, seed, level) defaults to the run's own
`fit` settings (its spec.yaml; the JobSpec default for a file from elsewhere), so `scalerl fit RUN --json`
prints the numbers summary.json and report.html show; a flag overrides one setting.

Bad input (missing file or column, too few points, NaN, out of range) exits with status 2 and one
paragraph on stderr saying what is wrong and what is needed; never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from scalerl.report import plots, tables
from scalerl.report.online import analysis_options
from scalerl.report.runfiles import RunFileError, fit_settings, json_safe, metrics_file, read_records, run_name
from scalerl.scaling.analysis import CurveAnalysis, analyse_curve
from scalerl.scaling.compare import Comparison, compare_curves, heldout_set_warning
from scalerl.scaling.compute import AXES, axis_label, column_unit
from scalerl.scaling.curves import A_MARGIN, FitError
from scalerl.scaling.data import Curve, curve_from_records

EXIT_OK = 0
EXIT_BAD_INPUT = 2
_FORMULA = "R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B)"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `fit` and `compare` subcommands; each sets `func(args) -> int` (the exit status)."""
    fit = subparsers.add_parser(
        "fit",
        help="fit the ScaleRL sigmoid to a pass-rate curve and forecast it",
        description=f"Fit {_FORMULA} to eval records (paper's grid + least squares), with bootstrap "
        "intervals, forecasts and the power law for contrast. Compute is in device-hours (--axis "
        "device-hours, the paper's) or FLOPs (--axis flops).",
    )
    fit.add_argument("file", type=Path, help="run folder (with metrics.jsonl), JSONL, JSON list or CSV file")
    _common(fit)
    fit.add_argument("--r0", type=float, default=None, help="starting pass rate (default: the first eval's)")
    fit.add_argument(
        "--predict",
        type=_compute_list,
        default=None,
        metavar="C1,C2,...",
        help="compute values to forecast (default: last observed × 1, 2, 4)",
    )
    fit.add_argument("--points", action="store_true", help="also print every eval point with its residual")
    fit.set_defaults(func=fit_command)

    cmp = subparsers.add_parser(
        "compare",
        help="rank runs by the paper's rule (A first; B at a shared A when A ties)",
        description=f"Fit every run; if all A lie within ±{A_MARGIN} refit them at their mean A and rank "
        "by B, otherwise rank by A (ScaleRL §1.4).",
    )
    cmp.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="run folders or metrics files")
    _common(cmp)
    cmp.add_argument("--margin", type=float, default=A_MARGIN, help=f"margin on A (default {A_MARGIN})")
    cmp.set_defaults(func=compare_command)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--axis", choices=tuple(AXES), default=None,
                   help="compute axis: device-hours (column compute, the paper's; default) or flops (column "
                   "compute_flops: 2·N per generated/prefilled token + 6·N per trained token)")
    p.add_argument("--x", default=None, help="another compute column, e.g. gpu_hours (instead of --axis)")
    p.add_argument("--y", default="pass_rate", help="pass-rate column, a fraction in [0, 1] (default: pass_rate)")
    p.add_argument("--min-compute", type=float, default=0.0, metavar="C",
                   help="drop points below C, in the axis unit (paper: 1.5k GPU-hours)")
    p.add_argument("--min-compute-fraction", type=float, default=None, metavar="F",
                   help="drop points below F × the largest fitted compute (default: the run's fit."
                   "min_compute_fraction, JobSpec default 0.1)")
    p.add_argument(
        "--max-compute",
        type=float,
        default=None,
        metavar="C",
        help="fit only points up to C; later points become a held-out check",
    )
    p.add_argument("--bootstrap", type=int, default=None, metavar="N",
                   help="bootstrap resamples, 0: none (default: the run's fit.bootstrap, 200)")
    p.add_argument("--level", type=float, default=None, help="interval coverage (default: the run's fit.level, 0.95)")
    p.add_argument("--seed", type=int, default=None, help="bootstrap seed (default: the run's fit.seed, 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--plot", type=Path, default=None, metavar="OUT.png", help="write a PNG plot")


def _compute_list(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None
    if not values or any(not v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: give positive compute values, e.g. 100,200,400")
    return values


def _guarded(cmd: str, body: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    try:
        return body(args)
    except (FitError, RunFileError) as e:
        print(f"scalerl {cmd}: {e}", file=sys.stderr)
    except OSError as e:
        print(f"scalerl {cmd}: cannot write {e.filename}: {e.strerror}. Check the output path.", file=sys.stderr)
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
        a = analyse_curve(curve, r0=args.r0, predict=args.predict, **_fit_options(args, src))
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
        f"(cutoff: max(--min-compute, {a.min_compute_fraction:g} × largest compute))",
        "",
        f"Sigmoid  {_FORMULA}",
        tables.render_text(tables.fit_table(a, x=x)),
    ]
    if a.warnings:
        head += ["", "Warnings:", *[f"  - {w}" for w in a.warnings]]
    head += [
        "",
        "Forecast (expected pass rate on the curve)",
        tables.render_text(tables.forecast_table(a, x=x)),
    ]
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


_METRICS_SUFFIXES = frozenset({".jsonl", ".json", ".csv"})


def _compare(args: argparse.Namespace) -> int:
    x = _x_column(args)
    runs: list[tuple[str, Curve]] = []
    sources: list[Path] = []
    heldout: list[tuple[str, list[str]]] = []
    for path in args.runs:
        if path.is_file() and path.suffix.lower() not in _METRICS_SUFFIXES:  # e.g. a glob caught compare.png
            print(f"scalerl compare: skipping {path}: not a run folder or a metrics file "
                  f"({', '.join(sorted(_METRICS_SUFFIXES))})", file=sys.stderr)
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
        unbounded = [r.name for r in cmp.rows if r.fit.A >= 0.999]
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
    return "\n".join(["scalerl compare", head, "", tables.render_text(tables.comparison_table(cmp, x=x))])


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry (`python -m scalerl.scaling.commands fit ...`) until `scalerl.cli` wires it in."""
    parser = argparse.ArgumentParser(prog="scalerl")
    register(parser.add_subparsers(dest="command", required=True))
    args: Any = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
