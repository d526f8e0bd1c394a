"""Handlers of `scalerl fit` and `scalerl compare` (arguments in `scaling.commands`): the only file I/O
of the scaling package. Imported when one of the commands runs, not for `--help`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from scalerl.endpoints import output_file_problem
from scalerl.report import plots, tables
from scalerl.report.runfiles import RunFileError, json_safe, metrics_file, read_records, run_name
from scalerl.scaling.analysis import CurveAnalysis, analyse_curve
from scalerl.scaling.commands import FORMULA
from scalerl.scaling.compare import Comparison, compare_curves
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
        print(f"scalerl {cmd}: {e}", file=sys.stderr)
    except OSError as e:
        print(f"scalerl {cmd}: cannot write {e.filename}: {e.strerror}. Check the output path.", file=sys.stderr)
    return EXIT_BAD_INPUT


def _load_curve(path: Path, x: str, y: str) -> tuple[Path, Curve]:
    src = metrics_file(path)
    with _about(src):
        return src, curve_from_records(read_records(src), x=x, y=y)


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
    src, curve = _load_curve(args.file, args.x, args.y)
    with _about(src):
        a = analyse_curve(
            curve,
            r0=args.r0,
            min_compute=args.min_compute,
            max_compute=args.max_compute,
            predict=args.predict,
            n_bootstrap=args.bootstrap,
            seed=args.seed,
            level=args.level,
        )
    if args.plot is not None:
        png = plots.fit_png(curve, a, title=f"{run_name(args.file)}: pass rate vs {args.x}", x=args.x)
        args.plot.write_bytes(png)
    if args.json:
        print(json.dumps(json_safe(a.to_dict()), allow_nan=False))
    else:
        print(format_fit(a, source=str(src), x=args.x, y=args.y, show_points=args.points))
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
        + (f"; window [{a.min_compute:g}, {a.max_compute:g}]" if a.max_compute is not None else ""),
        "",
        f"Sigmoid  {FORMULA}",
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
    runs: list[tuple[str, Curve]] = []
    for path in args.runs:
        if path.is_file() and path.suffix.lower() not in _METRICS_SUFFIXES:  # e.g. a glob caught compare.png
            print(f"scalerl compare: skipping {path}: not a run folder or a metrics file "
                  f"({', '.join(sorted(_METRICS_SUFFIXES))})", file=sys.stderr)
            continue
        _, curve = _load_curve(path, args.x, args.y)
        runs.append((_unique(run_name(path), [n for n, _ in runs]), curve))
    cmp = compare_curves(
        runs,
        margin=args.margin,
        min_compute=args.min_compute,
        max_compute=args.max_compute,
        n_bootstrap=args.bootstrap,
        seed=args.seed,
        level=args.level,
    )
    if args.plot is not None:
        args.plot.write_bytes(plots.comparison_png(cmp, x=args.x))
    if args.json:
        print(json.dumps(json_safe(cmp.to_dict()), allow_nan=False))
    else:
        print(format_comparison(cmp))
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


def format_comparison(cmp: Comparison) -> str:
    if cmp.shared_a is not None:
        rule = (
            f"All A within ±{cmp.margin:g} (spread {cmp.a_spread:.3f}): refitted at the shared A = "
            f"{cmp.shared_a:.3f} and ranked by B (higher B = more compute-efficient)."
        )
    else:
        rule = f"A spread {cmp.a_spread:.3f} exceeds ±{cmp.margin:g}: ranked by A (the ceiling comes first)."
    return "\n".join(["scalerl compare", f"  {rule}", "", tables.render_text(tables.comparison_table(cmp))])
