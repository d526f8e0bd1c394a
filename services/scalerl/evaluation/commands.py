"""`scalerl eval`: test-time scaling of a trained policy (the CLI edge of the evaluation package).

    scalerl eval runs/quickstart --strategy sample,majority,best-of-n --n 1,2,4,8,16 --plot tts.png
    scalerl eval runs/quickstart/checkpoints/step_000600 --strategy budget-forcing --max-thinking 8,16,32
    scalerl eval runs/countdown --strategy tree --n 1,2,4,8,16,32 --json out.json
    scalerl eval runs/quickstart --checkpoints all --strategy majority --n 1,4,16 --plot frontier.png

Every argument is checked before any model is loaded; a bad one exits with status 2 and one line on
stderr naming the argument and what is allowed.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalerl.endpoints import output_file_problem, target_problem

STRATEGIES = ("greedy", "sample", "majority", "best-of-n", "budget-forcing", "tree")
EMBEDDED_ONLY = ("tree",)  # step-level stops: the Generate request has no stop ids
EXIT_BAD_INPUT = 2


class BadArgument(ValueError):
    """One line: the argument, what is wrong, what is allowed."""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("eval", help="test-time scaling of a checkpoint: pass@k, maj@k, best-of-N, "
                              "budget forcing, tree search, iso-compute frontier",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", type=Path, metavar="CHECKPOINT_OR_RUN",
                   help="a checkpoint folder (runs/<job>/checkpoints/step_NNNNNN) or a run folder (runs/<job>)")
    p.add_argument("--spec", type=Path, help="job spec (default: the run's spec.yaml)")
    p.add_argument("--checkpoints", default="latest", help="latest (default) or all (the iso-compute frontier)")
    p.add_argument("--tasks", default="eval", help="eval (the task's held-out split, default), train, or a "
                   "JSONL file of {prompt, answer} in the run's task format (checked by the run's verifier)")
    p.add_argument("--limit", default=None, help="evaluate only the first N problems")
    p.add_argument("--strategy", default="greedy,sample,majority", help=f"comma-separated: {', '.join(STRATEGIES)}")
    p.add_argument("--n", default="1,2,4,8,16", help="samples per problem a strategy may use (k), e.g. 1,2,4,8,16")
    p.add_argument("--samples", default=None, help="completions drawn per problem (default: the largest k)")
    p.add_argument("--temperature", default=None, help="sampling temperature (default: the spec's eval temperature)")
    p.add_argument("--seed", default="0", help="generator and subset seed")
    p.add_argument("--engine", default="embedded", help="embedded (generation.engine in this process) or grpc")
    p.add_argument("--target", dest="grpc_target", default=None, metavar="HOST:PORT",
                   help="generator service address (--engine grpc)")
    p.add_argument("--scorer", default=None, metavar="PATH|train",
                   help="outcome scorer for best-of-n / tree: a scorer folder, a Hugging Face sequence-classification "
                   "reward model, or 'train' (default: the checkpoint's scorer/ if any, else train one)")
    p.add_argument("--scorer-steps", default="300", help="training steps of a new outcome scorer")
    p.add_argument("--scorer-prompts", default="384", help="training problems sampled for a new scorer's rollouts")
    p.add_argument("--max-thinking", default=None, help="budget forcing: maximum thinking budgets in tokens, "
                   "e.g. 8,16,32 (default: 1/8, 1/4, 1/2, 3/4 and all of the spec's thinking budget)")
    p.add_argument("--min-thinking", default="0", help="budget forcing: minimum thinking tokens (with --max-waits)")
    p.add_argument("--max-waits", default="0", help="budget forcing: most 'Wait' insertions per sample")
    p.add_argument("--wait-text", default="Wait", help="text forced in place of an early </think>")
    p.add_argument("--answer-prefix", default="",
                   help="text forced after </think> at the maximum, e.g. 'Final Answer:'")
    p.add_argument("--tree-method", default="unique", help="tree search: unique (chains drawn without "
                   "replacement over the tree of steps, shared prefixes paid once; default) and/or beam "
                   "(step-level beam search ranked by --tree-value), comma-separated")
    p.add_argument("--tree-budget", default="64,128,256,512,1024",
                   help="unique tree search: generated tokens per problem to report (it runs to the largest)")
    p.add_argument("--tree-prune", default=None, metavar="V",
                   help="unique tree search: drop states --tree-value rates below V (default: no value)")
    p.add_argument("--tree-value-weight", default=None, metavar="BETA",
                   help="unique tree search: weigh each state's unexplored mass by its --tree-value to the power "
                   "BETA in later draws (default 0: the policy alone)")
    p.add_argument("--beam", default="1,2,4", help="tree search: beam widths to run")
    p.add_argument("--expansions", default="4", help="tree search: continuations sampled per beam node")
    p.add_argument("--tree-value", default="scorer", help="tree search: scorer (the learned outcome scorer, "
                   "default), prefix (a value trained on partial states' Monte-Carlo labels, saved in "
                   "<checkpoint>/prefix_value/) or solver (diagnostic upper bound: the exhaustive solver rates states)")
    p.add_argument("--no-calculator", action="store_true", help="tree search: the model writes whole steps "
                   "(default: it writes 'a op b=' and the result is computed, fed as forced tokens)")
    p.add_argument("--resample-rounds", default="0", help="tree search: extra calls per depth re-sampling a node "
                   "once per duplicate step it proposed (default 0: measured not to pay on Countdown)")
    p.add_argument("--problems-served", default=None,
                   help="iso-compute frontier: problems the inference is paid for, one frontier each, e.g. "
                   "100,1000000 (default: the eval's problem count)")
    p.add_argument("--budget", default=None, help="iso-compute frontier: device-hour budgets to answer, e.g. 0.05,0.1")
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="OUT.json",
                   help="write every number as JSON (to stdout when no file is given)")
    p.add_argument("--plot", type=Path, default=None, metavar="OUT.png", help="test-time scaling plot; with "
                   "--checkpoints all also one frontier plot per --problems-served N: OUT-frontier-N.png "
                   "(frontier-N.png for --plot frontier.png)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=eval_command)


def _ints(name: str, text: str, *, lo: int = 1) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or any(v < lo for v in values):
        raise BadArgument(f"{name}: expected a comma-separated list of integers >= {lo} (e.g. 1,2,4,8), got {text!r}")
    return values


def _int(name: str, text: str, *, lo: int = 1) -> int:
    values = _ints(name, text, lo=lo)
    if len(values) != 1:
        raise BadArgument(f"{name}: expected one integer >= {lo}, got {text!r}")
    return values[0]


def _floats(name: str, text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or any(not v > 0 for v in values):
        raise BadArgument(f"{name}: expected a comma-separated list of positive numbers, got {text!r}")
    return values


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything `scalerl eval` will do, validated."""

    spec: Any
    run: Path | None
    refs: list[Any]
    opts: Any
    tasks: str
    limit: int | None
    engine: str
    grpc_target: str | None
    problems_served: tuple[int, ...] | None
    budgets: tuple[float, ...] | None


def _check_engine(args: argparse.Namespace, strategies: tuple[str, ...]) -> None:
    if args.engine not in ("embedded", "grpc"):
        raise BadArgument(f"--engine: {args.engine!r}; allowed: embedded, grpc")
    if args.engine == "grpc":
        problem = target_problem("--target", args.grpc_target)
        if problem:
            raise BadArgument(f"{problem}; --engine grpc needs the generator service as HOST:PORT")
        local = [s for s in strategies if s in EMBEDDED_ONLY]
        if local or args.checkpoints == "all":
            what = f"--strategy {','.join(local)}" if local else "--checkpoints all"
            raise BadArgument(f"--engine: {what} needs embedded (the Generate request has no step-stop field, "
                              "and a service serves one policy); allowed with grpc: greedy, sample, majority, "
                              "best-of-n, budget-forcing")


def _check_tasks(tasks: str) -> None:
    if tasks in ("eval", "train"):
        return
    from scalerl.tasks import DatasetError, validate_jsonl

    try:
        validate_jsonl(tasks)
    except DatasetError as exc:
        raise BadArgument(f"--tasks: not eval, train or a usable JSONL file: {exc}") from None


def frontier_plot_path(plot: Path, problems_served: int) -> Path:
    """Where `--plot OUT.png` puts the frontier for N problems served: OUT-frontier-N.png (frontier-N.png
    when OUT already ends in "frontier")."""
    stem = plot.stem if plot.stem.endswith("frontier") else f"{plot.stem}-frontier"
    return plot.with_name(f"{stem}-{problems_served}{plot.suffix}")


def _check_outputs(args: argparse.Namespace) -> None:
    for option, path in (("--json", None if args.json in (None, "-") else args.json), ("--plot", args.plot)):
        problem = None if path is None else output_file_problem(option, path)
        if problem:
            raise BadArgument(problem)


def plan(args: argparse.Namespace) -> Plan:
    """Validate every argument (no model is loaded, and no torch imported until all are valid); BadArgument
    names the first bad one (every problem of the spec, one line each)."""
    from scalerl.config import SpecError, load_spec
    from scalerl.evaluation.checkpoints import TargetError, is_scorer_folder, resolve_target, start_ref
    from scalerl.generator.factory import check_engine
    from scalerl.report.runfiles import RunFileError

    _check_outputs(args)
    strategies = tuple(s.strip() for s in args.strategy.split(",") if s.strip())
    unknown = [s for s in strategies if s not in STRATEGIES]
    if not strategies or unknown:
        raise BadArgument(f"--strategy: unknown {unknown or [args.strategy]}; allowed: {', '.join(STRATEGIES)}")
    ks = _ints("--n", args.n)
    samples = _int("--samples", args.samples) if args.samples is not None else max(ks)
    if max(ks) > samples:
        raise BadArgument(f"--n: k = {max(ks)} is larger than --samples {samples} (the completions drawn per "
                          f"problem); allowed: 1 <= k <= {samples}")
    if args.checkpoints not in ("latest", "all"):
        raise BadArgument(f"--checkpoints: {args.checkpoints!r}; allowed: latest, all")
    _check_engine(args, strategies)
    if args.scorer not in (None, "train") and not is_scorer_folder(Path(args.scorer)):
        raise BadArgument(f"--scorer: {args.scorer} is not a scorer folder (scorer.json) or a Hugging Face "
                          "*ForSequenceClassification model; allowed: PATH or train")
    try:
        spec_file, run, refs = resolve_target(args.target, which=args.checkpoints, spec=args.spec)
        spec = load_spec(spec_file)
        if args.engine == "embedded":
            check_engine(spec)
    except (TargetError, RunFileError, SpecError) as exc:
        raise BadArgument(str(exc)) from None
    if args.checkpoints == "all" and run is not None and (start := start_ref(run, spec.model.init_checkpoint)):
        refs.insert(0, start)
    if "tree" in strategies and spec.task.kind != "countdown":
        raise BadArgument(f"--strategy: tree needs a task with step structure (countdown); this run's task is "
                          f"{spec.task.kind!r}")
    _check_tasks(args.tasks)
    temperature = float(spec.eval.temperature) if args.temperature is None else _floats("--temperature",
                                                                                         args.temperature)[0]
    budget = spec.generation.thinking_budget_tokens
    default_max = sorted({max(1, budget * f // 8) for f in (1, 2, 4, 6, 8)})
    max_thinking = _ints("--max-thinking", args.max_thinking) if args.max_thinking else tuple(default_max)
    min_thinking, max_waits = _int("--min-thinking", args.min_thinking, lo=0), _int("--max-waits", args.max_waits, lo=0)
    if args.tree_value not in ("scorer", "prefix", "solver"):
        raise BadArgument(f"--tree-value: {args.tree_value!r}; allowed: scorer, prefix, solver")
    tree_methods = tuple(m.strip() for m in args.tree_method.split(",") if m.strip())
    if not tree_methods or any(m not in ("unique", "beam") for m in tree_methods):
        raise BadArgument(f"--tree-method: {args.tree_method!r}; allowed: unique, beam (comma-separated)")
    if "tree" in strategies and "unique" in tree_methods and args.no_calculator:
        raise BadArgument("--no-calculator: the unique tree search always computes results (use --tree-method beam)")
    tree_prune = None if args.tree_prune is None else _floats("--tree-prune", args.tree_prune)[0]
    value_weight = 0.0 if args.tree_value_weight is None else _floats("--tree-value-weight",
                                                                      args.tree_value_weight)[0]
    if (min_thinking > 0) != (max_waits > 0):
        raise BadArgument("--min-thinking/--max-waits: give both (a minimum is enforced by at most m 'Wait' "
                          f"insertions), got --min-thinking {min_thinking} --max-waits {max_waits}")
    from scalerl.evaluation.runner import EvalOptions
    from scalerl.evaluation.scorer_training import ScorerTrainingConfig

    opts = EvalOptions(
        strategies=strategies, ks=ks, samples=samples, temperature=temperature, top_p=spec.generation.top_p,
        seed=_int("--seed", args.seed, lo=0), scorer=args.scorer,
        scorer_training=ScorerTrainingConfig(steps=_int("--scorer-steps", args.scorer_steps),
                                             prompts=_int("--scorer-prompts", args.scorer_prompts), seed=spec.seed),
        max_thinking=max_thinking, min_thinking=min_thinking, max_waits=max_waits, wait_text=args.wait_text,
        answer_prefix=args.answer_prefix, tree_widths=_ints("--beam", args.beam),
        tree_expansions=_int("--expansions", args.expansions), tree_value=args.tree_value,
        tree_calculator=not args.no_calculator, tree_resample=_int("--resample-rounds", args.resample_rounds, lo=0),
        tree_methods=tree_methods, tree_budgets=_ints("--tree-budget", args.tree_budget), tree_prune=tree_prune,
        tree_value_weight=value_weight,
        prompts_per_batch=spec.eval_prompts_per_batch,
        show_progress=not args.quiet)
    return Plan(spec=spec, run=run, refs=refs, opts=opts, tasks=args.tasks,
                limit=_int("--limit", args.limit) if args.limit is not None else None, engine=args.engine,
                grpc_target=args.grpc_target,
                problems_served=_ints("--problems-served", args.problems_served) if args.problems_served else None,
                budgets=_floats("--budget", args.budget) if args.budget else None)


def eval_command(args: argparse.Namespace) -> int:
    """Handler of `scalerl eval`."""
    try:
        p = plan(args)
    except BadArgument as exc:
        for line in str(exc).splitlines():
            print(f"scalerl eval: error: {line}", file=sys.stderr)
        return EXIT_BAD_INPUT
    from scalerl.runtime.progress import quiet_third_party_bars

    quiet_third_party_bars()
    from scalerl.evaluation.scorer_training import ScorerDataError
    from scalerl.evaluation.session import run_plan

    try:
        result, text = run_plan(p)
    except ScorerDataError as exc:
        print(f"scalerl eval: error: {exc}", file=sys.stderr)
        return 1
    if args.plot is not None:
        from scalerl.evaluation.plots import frontier_png, scaling_png

        last = result["checkpoints"][-1]
        args.plot.write_bytes(scaling_png(last, title=f"{args.target} step {last['step']}: test-time scaling"))
        plots = []
        for front in result.get("frontiers", []):
            path = frontier_plot_path(args.plot, front["problems_served"])
            path.write_bytes(frontier_png(front))
            plots.append(str(path))
        result["plot"] = str(args.plot)
        if plots:
            result["frontier_plots"] = plots
    from scalerl.report.runfiles import json_safe

    blob = json.dumps(json_safe(result), allow_nan=False, indent=1)
    if args.json == "-":
        print(blob)
    else:
        print(text)
        if args.json:
            Path(args.json).write_text(blob + "\n")
            print(f"\nJSON written to {args.json}")
        if args.plot is not None:
            print(f"plots written to {', '.join([str(args.plot), *result.get('frontier_plots', [])])}")
    return 0
