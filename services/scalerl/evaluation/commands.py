"""`scalerl eval`: test-time scaling of a trained policy (the CLI edge of the evaluation package).

    scalerl eval runs/quickstart --strategy sample,majority,best-of-n --n 1,2,4,8,16 --plot tts.png
    scalerl eval runs/quickstart/checkpoints/step_000600 --strategy budget-forcing --max-thinking 8,16,32
    scalerl eval runs/countdown --strategy tree --n 1,2,4,8,16,32 --json out.json
    scalerl eval runs/quickstart --checkpoints all --strategy majority --n 1,4,16 --plot frontier.png

Every argument is checked before any model is loaded; bad ones exit with status 2 and one line each on
stderr naming the argument and what is allowed (all of them, the spec's problems included).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

from scalerl.endpoints import output_file_problem, target_problem

STRATEGIES = ("greedy", "sample", "majority", "best-of-n", "budget-forcing", "tree")
EMBEDDED_ONLY = ("tree",)  # step-level stops: the Generate request has no stop ids
EXIT_BAD_INPUT = 2
T = TypeVar("T")


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
        from scalerl.rpc.security import RpcSecurity, RpcSecurityError

        try:
            RpcSecurity.from_env()
        except RpcSecurityError as exc:
            raise BadArgument(f"--engine grpc: {'; '.join(str(exc).splitlines())}") from None
        local = [s for s in strategies if s in EMBEDDED_ONLY]
        if local or args.checkpoints == "all":
            what = f"--strategy {','.join(local)}" if local else "--checkpoints all"
            raise BadArgument(f"--engine: {what} needs embedded (the Generate request has no step-stop field, "
                              "and a service serves one policy); allowed with grpc: greedy, sample, majority, "
                              "best-of-n, budget-forcing")


class _Problems:
    """Every bad argument, one line each: `check` runs one parse or check and keeps going past a failure,
    returning `default`, a harmless stand-in so that the checks after it still run (`plan` raises once all
    are checked, so no stand-in reaches a Plan)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, line: str) -> None:
        self.lines.append(line)

    def check(self, fn: Callable[..., T], *args: Any, default: object, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except BadArgument as exc:
            self.lines.extend(str(exc).splitlines())
            return cast(T, default)  # a stand-in of fn's type, so that later checks can go on


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


def _load_target(bad: _Problems, args: argparse.Namespace) -> tuple[Any, Path | None, list[Any]]:
    """(spec, run folder, checkpoints) of CHECKPOINT_OR_RUN and --spec; spec None after a problem."""
    from scalerl.config import SpecError, load_spec
    from scalerl.evaluation.checkpoints import TargetError, resolve_target
    from scalerl.generator.factory import check_engine
    from scalerl.report.runfiles import RunFileError

    try:
        spec_file, run, refs = resolve_target(args.target, which=args.checkpoints, spec=args.spec)
        spec = load_spec(spec_file)
    except (TargetError, RunFileError, SpecError) as exc:
        bad.add(str(exc))
        return None, None, []
    if args.engine == "embedded":
        try:
            check_engine(spec)
        except SpecError as exc:
            bad.add(str(exc))
    return spec, run, list(refs)


def _tree_options(bad: _Problems, args: argparse.Namespace, strategies: tuple[str, ...]) -> dict[str, Any]:
    """The tree search's settings (`EvalOptions.tree_*`), each bad one a line of `bad`."""
    if args.tree_value not in ("scorer", "prefix", "solver"):
        bad.add(f"--tree-value: {args.tree_value!r}; allowed: scorer, prefix, solver")
    methods = tuple(m.strip() for m in args.tree_method.split(",") if m.strip())
    if not methods or any(m not in ("unique", "beam") for m in methods):
        bad.add(f"--tree-method: {args.tree_method!r}; allowed: unique, beam (comma-separated)")
    if "tree" in strategies and "unique" in methods and args.no_calculator:
        bad.add("--no-calculator: the unique tree search always computes results (use --tree-method beam)")
    prune = None if args.tree_prune is None else bad.check(_floats, "--tree-prune", args.tree_prune,
                                                           default=(1.0,))[0]
    weight = 0.0 if args.tree_value_weight is None else bad.check(
        _floats, "--tree-value-weight", args.tree_value_weight, default=(1.0,))[0]
    return {"tree_value": args.tree_value, "tree_methods": methods, "tree_prune": prune, "tree_value_weight": weight,
            "tree_calculator": not args.no_calculator,
            "tree_widths": bad.check(_ints, "--beam", args.beam, default=(1,)),
            "tree_expansions": bad.check(_int, "--expansions", args.expansions, default=1),
            "tree_resample": bad.check(_int, "--resample-rounds", args.resample_rounds, lo=0, default=0),
            "tree_budgets": bad.check(_ints, "--tree-budget", args.tree_budget, default=(1,))}


def plan(args: argparse.Namespace) -> Plan:
    """Validate every argument (no model is loaded, and no torch imported until all are valid); BadArgument
    lists every problem, one line each (the spec's problems included)."""
    from scalerl.evaluation.checkpoints import is_scorer_folder, start_ref

    bad = _Problems()
    bad.check(_check_outputs, args, default=None)
    strategies = tuple(s.strip() for s in args.strategy.split(",") if s.strip())
    unknown = [s for s in strategies if s not in STRATEGIES]
    if not strategies or unknown:
        bad.add(f"--strategy: unknown {unknown or [args.strategy]}; allowed: {', '.join(STRATEGIES)}")
    ks = bad.check(_ints, "--n", args.n, default=(1,))
    samples = bad.check(_int, "--samples", args.samples, default=max(ks)) if args.samples is not None else max(ks)
    if max(ks) > samples:
        bad.add(f"--n: k = {max(ks)} is larger than --samples {samples} (the completions drawn per problem); "
                f"allowed: 1 <= k <= {samples}")
    if args.checkpoints not in ("latest", "all"):
        bad.add(f"--checkpoints: {args.checkpoints!r}; allowed: latest, all")
    bad.check(_check_engine, args, strategies, default=None)
    if args.scorer not in (None, "train") and not is_scorer_folder(Path(args.scorer)):
        bad.add(f"--scorer: {args.scorer} is not a scorer folder (scorer.json) or a Hugging Face "
                "*ForSequenceClassification model; allowed: PATH or train")
    spec, run, refs = _load_target(bad, args)
    if spec is not None and "tree" in strategies and spec.task.kind != "countdown":
        bad.add(f"--strategy: tree needs a task with step structure (countdown); this run's task is "
                f"{spec.task.kind!r}")
    bad.check(_check_tasks, args.tasks, default=None)
    temperature = None if args.temperature is None else bad.check(_floats, "--temperature", args.temperature,
                                                                  default=(1.0,))[0]
    max_thinking = bad.check(_ints, "--max-thinking", args.max_thinking, default=()) if args.max_thinking else None
    min_thinking = bad.check(_int, "--min-thinking", args.min_thinking, lo=0, default=0)
    max_waits = bad.check(_int, "--max-waits", args.max_waits, lo=0, default=0)
    if (min_thinking > 0) != (max_waits > 0):
        bad.add("--min-thinking/--max-waits: give both (a minimum is enforced by at most m 'Wait' insertions), "
                f"got --min-thinking {min_thinking} --max-waits {max_waits}")
    tree = _tree_options(bad, args, strategies)
    seed = bad.check(_int, "--seed", args.seed, lo=0, default=0)
    scorer_steps = bad.check(_int, "--scorer-steps", args.scorer_steps, default=1)
    scorer_prompts = bad.check(_int, "--scorer-prompts", args.scorer_prompts, default=1)
    limit = None if args.limit is None else bad.check(_int, "--limit", args.limit, default=1)
    served = bad.check(_ints, "--problems-served", args.problems_served, default=(1,)) if args.problems_served else None
    budgets = bad.check(_floats, "--budget", args.budget, default=(1.0,)) if args.budget else None
    if bad.lines or spec is None:
        raise BadArgument("\n".join(bad.lines))
    if args.checkpoints == "all" and run is not None and (start := start_ref(run, spec.model.init_checkpoint)):
        refs.insert(0, start)
    if max_thinking is None:  # 1/8, 1/4, 1/2, 3/4 and all of the spec's thinking budget
        budget = spec.generation.thinking_budget_tokens
        max_thinking = tuple(sorted({max(1, budget * f // 8) for f in (1, 2, 4, 6, 8)}))
    from scalerl.evaluation.runner import EvalOptions
    from scalerl.evaluation.scorer_training import ScorerTrainingConfig

    opts = EvalOptions(
        strategies=strategies, ks=ks, samples=samples,
        temperature=float(spec.eval.temperature) if temperature is None else temperature,
        top_p=spec.generation.top_p, seed=seed, scorer=args.scorer,
        scorer_training=ScorerTrainingConfig(steps=scorer_steps, prompts=scorer_prompts, seed=spec.seed),
        max_thinking=max_thinking, min_thinking=min_thinking, max_waits=max_waits, wait_text=args.wait_text,
        answer_prefix=args.answer_prefix, **tree, prompts_per_batch=spec.eval_prompts_per_batch,
        show_progress=not args.quiet)
    return Plan(spec=spec, run=run, refs=refs, opts=opts, tasks=args.tasks, limit=limit, engine=args.engine,
                grpc_target=args.grpc_target, problems_served=served, budgets=budgets)


def eval_command(args: argparse.Namespace) -> int:
    """Handler of `scalerl eval`."""
    try:
        p = plan(args)
    except BadArgument as exc:
        for line in str(exc).splitlines():
            print(f"scalerl eval: error: {line}", file=sys.stderr)
        return EXIT_BAD_INPUT
    from scalerl.console import quiet_third_party_bars

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
