"""`scalerl fit` and `scalerl compare`: their arguments (the handlers, which read the files, fit with `scaling`
and draw with `report`, are in `report.handlers`).

    scalerl fit runs/quick                      # a run folder or a metrics file (JSONL, JSON list, CSV)
    scalerl fit metrics.jsonl --max-compute 50 --predict 100,200 --plot curve.png
    scalerl fit runs/quick --max-compute-fraction 0.5   # fit the first half, check it on the second
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
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from scalerl.lazy import lazy_handler
from scalerl.scaling.compute import AXES
from scalerl.scaling.constants import A_MARGIN

FORMULA = "R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B)"
METRICS_SUFFIXES = frozenset({".jsonl", ".json", ".csv"})
EXIT_BAD_INPUT = 2


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `fit` and `compare` subcommands; each sets `func(args) -> int` (the exit status)."""
    fit = subparsers.add_parser(
        "fit",
        help="fit the ScaleRL sigmoid to a pass-rate curve and forecast it",
        description=f"Fit {FORMULA} to eval records (paper's grid + least squares), with bootstrap "
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
        help="compute values to forecast, each as a prediction interval of a measured eval there, with a point "
        "only when the data identify it (default: last observed × 1, 2, 4)",
    )
    fit.add_argument("--max-compute-fraction", type=open_fraction, default=None, metavar="F",
                     help="fit only points up to F × the run's largest compute; later points become a held-out "
                     "check (e.g. 0.5: does the first half forecast the second?)")
    fit.add_argument("--points", action="store_true", help="also print every eval point with its residual")
    fit.set_defaults(func=_paths_first("fit", "fit_command"))

    cmp = subparsers.add_parser(
        "compare",
        help="rank runs by the paper's rule (A first; B at a shared A when A ties)",
        description=f"Fit every run; if all A lie within ±{A_MARGIN} refit them at their mean A and rank "
        "by B, otherwise rank by A (ScaleRL §1.4).",
    )
    cmp.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="run folders or metrics files")
    _common(cmp)
    cmp.add_argument("--margin", type=float, default=A_MARGIN, help=f"margin on A (default {A_MARGIN})")
    cmp.set_defaults(func=_paths_first("compare", "compare_command"))


def path_problems(command: str, args: argparse.Namespace) -> list[str]:
    """Every input that is not a run folder or metrics file, every input given twice (`compare`), and an
    unusable --plot: one line each. Reads only the file system, so a bad path is refused before numpy/scipy."""
    from scalerl.endpoints import output_file_problem
    from scalerl.report.runfiles import RunFileError, metrics_file

    problems: list[str] = []
    seen: dict[Path, Path] = {}
    for path in [args.file] if command == "fit" else args.runs:
        if command == "compare" and path.is_file() and path.suffix.lower() not in METRICS_SUFFIXES:
            continue  # the handler skips it with a note (e.g. a glob that caught compare.png)
        try:
            src = metrics_file(path).resolve()
        except RunFileError as exc:
            problems.append(str(exc))
            continue
        if src in seen:
            problems.append(f"{path} and {seen[src]} are the same metrics file ({src}): a run compared with itself "
                            "ties by construction; give each run once")
        seen.setdefault(src, path)
    if args.plot is not None and (problem := output_file_problem("--plot", args.plot)):
        problems.append(problem)
    return problems


def _paths_first(command: str, handler: str) -> Callable[[argparse.Namespace], int]:
    """The command's handler (`report.handlers`), imported and run once `path_problems` finds nothing."""
    run = lazy_handler("scalerl.report.handlers", handler)

    def checked(args: argparse.Namespace) -> int:
        problems = path_problems(command, args)
        for line in problems:
            print(f"scalerl {command}: error: {line}", file=sys.stderr)
        return EXIT_BAD_INPUT if problems else run(args)

    checked.__qualname__ = checked.__name__ = handler
    return checked


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--axis", choices=tuple(AXES), default=None,
                   help="compute axis: device-hours (column compute, the paper's; default) or flops (column "
                   "compute_flops: 2·N per generated/prefilled token + 6·N per trained token)")
    p.add_argument("--x", default=None, help="another compute column, e.g. gpu_hours (instead of --axis)")
    p.add_argument("--y", default="pass_rate", help="pass-rate column, a fraction in [0, 1] (default: pass_rate)")
    p.add_argument("--min-compute", type=float, default=0.0, metavar="C",
                   help="drop points below C, in the axis unit (paper: 1.5k GPU-hours)")
    p.add_argument("--min-compute-fraction", type=float, default=None, metavar="F",
                   help="drop points below F × the run's total compute, its largest, however much of it is "
                   "fitted (default: the run's fit.min_compute_fraction, JobSpec default 0.1)")
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


def open_fraction(text: str) -> float:
    """`text` as a fraction in the open interval (0, 1), else an argparse error saying what is allowed."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give a fraction in (0, 1)") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a fraction in (0, 1), e.g. 0.5")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry (`python -m scalerl.report.commands fit ...`) until `scalerl.cli` wires it in."""
    parser = argparse.ArgumentParser(prog="scalerl")
    register(parser.add_subparsers(dest="command", required=True))
    args: Any = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
