"""`scalerl` command line: run | serve | fetch-run | dlq | sft | fit | compare | eval.

Entry points are thin: parse -> validate (exit 2 with one message naming the field) -> build -> run.
Building the parser imports no torch, transformers, numpy or pydantic: each command's handler imports
what it needs when it runs, so `scalerl --help` and `scalerl CMD --help` answer at once.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from scalerl import __version__

if TYPE_CHECKING:
    from scalerl.config import JobSpec

EXIT_BAD_INPUT = 2
log = logging.getLogger("scalerl.cli")


def _fail(command: str, problems: str | list[str]) -> int:
    """Print every problem as `scalerl COMMAND: error: PROBLEM`, one line each; the exit status of bad input."""
    for line in problems.splitlines() if isinstance(problems, str) else problems:
        print(f"scalerl {command}: error: {line}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _load(args: argparse.Namespace) -> JobSpec:
    """The validated spec and every check of what it points at (runtime/preflight.py: no torch imported);
    SpecError lists every problem, one line each."""
    from scalerl.config import load_spec
    from scalerl.runtime.preflight import check_spec

    spec = load_spec(args.spec, args.set)
    if getattr(args, "smoke", False):
        from scalerl.runtime.smoke import smoke_banner, smoke_spec

        spec, overrides = smoke_spec(args.spec, args.set, spec)
        print(smoke_banner(overrides))
    if args.command == "sft":  # `scalerl sft` trains from the base model whatever init_checkpoint says
        spec = spec.model_copy(update={"model": spec.model.model_copy(update={"init_checkpoint": None})})
    check_spec(spec)
    return spec


def cmd_run(args: argparse.Namespace) -> int:
    from scalerl.config import SpecError
    from scalerl.endpoints import output_dir_problem

    spec, problems = None, []
    try:
        spec = _load(args)
    except SpecError as exc:
        problems += str(exc).splitlines()
    out = Path(args.out) if args.out else None
    if out is None and spec is not None:
        out = Path("runs") / (f"{spec.name}-smoke" if args.smoke else spec.name)
    if out is not None and (problem := output_dir_problem("--out", out)):
        problems.append(problem)
    if spec is not None and out is not None and args.distributed:
        from scalerl.runtime.commands import distributed_problems

        problems += distributed_problems(spec, out, args)
    if problems or spec is None or out is None:
        return _fail("run", problems)
    if out.exists() and any(p.name != "sft" for p in out.iterdir()) and not (args.resume or args.overwrite):
        return _fail("run", f"{out} already holds a run: pass --resume to continue it, --overwrite to replace "
                     "it, or --out DIR")
    log.info("spec %s checked: task %s, %d SFT + %d RL steps, model %s; run folder %s", args.spec, spec.task.kind,
             spec.sft.steps, spec.train.steps, spec.model.path or "tiny (built from model.tiny)", out)
    if args.overwrite and not args.resume:
        shutil.rmtree(out, ignore_errors=True)
    if args.distributed:
        from scalerl.runtime.commands import run_distributed

        return run_distributed(spec, out, args, show_summary=_print_summary)
    from scalerl.console import quiet_third_party_bars
    from scalerl.runtime.embedded import EmbeddedRun

    quiet_third_party_bars()
    summary = EmbeddedRun(spec, out, resume=args.resume, show_progress=not args.quiet).run()
    _print_summary(out, summary)
    return 0


def _gain_text(s: dict[str, object]) -> str:
    """", gain +0.160 (95% interval +0.080 to +0.240, paired bootstrap over 32 held-out prompts)" or ""."""
    gain, interval, level = s.get("gain"), s.get("gain_interval"), s.get("gain_level")
    if not isinstance(gain, int | float):
        return ""
    text = f", gain {gain:+.3f}"
    if isinstance(interval, list) and isinstance(level, int | float):
        text += (f" ({level:.0%} interval {interval[0]:+.3f} to {interval[1]:+.3f}, paired bootstrap over "
                 f"{s.get('gain_prompts')} held-out prompts)")
    return text


def _print_summary(out: Path, s: dict[str, object]) -> None:
    def f(key: str, fmt: str = "{:.3f}") -> str:
        v = s.get(key)
        return fmt.format(v) if isinstance(v, int | float) else "n/a"

    print(f"\nrun {s['name']}: {s['steps']} RL steps, {f('train_wall_s', '{:.0f}')} s of training "
          f"= {f('compute', '{:.4f}')} device-hours")
    print(f"  held-out pass rate (mean@k): {f('initial_pass_rate')} -> {f('final_pass_rate')}{_gain_text(s)}")
    warnings = s.get("warnings")
    for warning in warnings if isinstance(warnings, list) else []:  # e.g. the idle-steps warning: nothing learned
        print(f"  warning: {warning}")
    if s.get("A") is not None:
        print(f"  fitted curve: A={f('A')} (asymptotic pass rate), B={f('B', '{:.2f}')} (exponent), "
              f"C_mid={f('C_mid', '{:.4f}')} device-hours")
    print(f"  metrics: {out / 'metrics.jsonl'}   train log: {out / 'train.jsonl'}")
    print(f"  curve:   {out / 'curve.png'}")
    print(f"  report:  {s.get('report', out / 'report.html')}")


def cmd_sft(args: argparse.Namespace) -> int:
    from scalerl.config import SpecError
    from scalerl.endpoints import output_dir_problem

    spec, problems = None, []
    try:
        spec = _load(args)
    except SpecError as exc:
        problems += str(exc).splitlines()
    out = Path(args.out) if args.out else None if spec is None else Path("runs") / spec.name
    if out is not None and (problem := output_dir_problem("--out", out)):
        problems.append(problem)
    if problems or spec is None or out is None:
        return _fail("sft", problems)
    if (out / "sft" / "config.json").exists() and not args.overwrite:
        return _fail("sft", f"{out / 'sft'} exists; pass --overwrite to retrain")
    log.info("spec %s checked: task %s, %d SFT steps, model %s; writing %s", args.spec, spec.task.kind,
             spec.sft.steps, spec.model.path or "tiny (built from model.tiny)", out / "sft")
    from scalerl.console import Progress, quiet_third_party_bars
    from scalerl.parts import configure_threads, make_task, seed_everything
    from scalerl.runtime.setup import initial_model

    quiet_third_party_bars()
    shutil.rmtree(out / "sft", ignore_errors=True)
    seed_everything(spec.seed)
    configure_threads(spec)
    bar = Progress(not args.quiet).bar("SFT", spec.sft.steps, unit="step")
    _, _, info = initial_model(spec, make_task(spec), out,
                               on_sft_step=lambda s, loss: bar.update(1, loss=f"{loss:.3f}"))
    bar.close()
    print(json.dumps({"model": str(out / "sft"), **info}))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scalerl", description=__doc__.split("\n\n")[0],
                                epilog="`scalerl COMMAND --help` describes a command's arguments.")
    p.add_argument("--version", action="version", version=f"scalerl {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def spec_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("spec", help="job spec YAML (see examples/quickstart.yaml)")
        sp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a field by dotted path, e.g. --set loss.type=dapo (repeatable)")
        sp.add_argument("--quiet", action="store_true", help="no progress bars")
        sp.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="log scalerl's INFO lines (also `scalerl -v COMMAND`)")
        sp.add_argument("--overwrite", action="store_true", help="replace existing outputs")

    from scalerl.runtime.commands import add_distributed_args
    from scalerl.runtime.commands import register as register_serve

    run = sub.add_parser("run", help="train a policy with RL (all roles in one process, or --distributed)")
    spec_args(run)
    run.add_argument("--out", help="run folder (default runs/<name>)")
    run.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    run.add_argument("--smoke", action="store_true",
                     help="check the set-up: a few steps with a tiny evaluation (caps printed; default --out "
                          "runs/<name>-smoke)")
    run.set_defaults(func=cmd_run)
    add_distributed_args(run)
    register_serve(sub)
    from scalerl.runtime.dlq_commands import register as register_dlq

    register_dlq(sub)

    sft = sub.add_parser("sft", help="supervised warm start on the task's gold chains of thought")
    spec_args(sft)
    sft.add_argument("--out", help="run folder; the model is written to OUT/sft, where `scalerl run` with the same "
                     "--out starts from it (default runs/<name>, as for run)")
    sft.set_defaults(func=cmd_sft)

    from scalerl.evaluation.commands import register as register_eval
    from scalerl.report.commands import register as register_scaling
    from scalerl.runtime.score_command import register as register_score

    register_scaling(sub)
    register_eval(sub)
    register_score(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.verbose:  # ours at INFO; third-party INFO chatter stays off the terminal
        logging.getLogger("scalerl").setLevel(logging.INFO)
    code = int(args.func(args))
    if argv is None:  # the process's own command line (not a caller's in-process call)
        _leave_past_stranded_threads(code)
    return code


def _leave_past_stranded_threads(code: int) -> None:
    """End the process without the interpreter's finalization when a weights-broadcast thread is still in
    a native call (`scalerl.weightsync.wire.stranded_threads`): finalizing under it aborts the
    process. Everything of ours is flushed first; the exit code is the command's."""
    wire = sys.modules.get("scalerl.weightsync.wire")  # imported only where broadcast was on
    stranded = wire.stranded_threads() if wire is not None else []
    if not stranded:
        return
    logging.getLogger("scalerl").warning("leaving without finalization: %s still in a transfer", ", ".join(stranded))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
