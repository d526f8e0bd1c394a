"""`scalerl eval`'s work for one checkpoint: sample, score, search, and count what it cost.

One sampling pass of `samples` completions per problem serves `sample`, `majority` and `best-of-n`
at every k (strategies.py); `greedy`, each budget-forcing budget and each tree search run their own
generation. The generator is the torch engine in-process (embedded) or a generator service (grpc);
the scorer and the verifier run here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from scalerl.config import JobSpec
from scalerl.evaluation.metrics import bootstrap_ci
from scalerl.evaluation.rollouts import sample_problems
from scalerl.evaluation.scorer import Scorer, load_scorer
from scalerl.evaluation.scorer_training import (
    LabelledPrefix,
    LabelledRollout,
    ScorerTrainingConfig,
    auc,
    prefix_value_labels,
    train_outcome_scorer,
    train_prefix_value,
    within_problem_auc,
)
from scalerl.evaluation.strategies import (
    ProblemSamples,
    StrategyPoint,
    best_of_n_points,
    interpolate_accuracy,
    majority_points,
    random_points,
    sample_points,
    verified_points,
)
from scalerl.evaluation.tree_search import SolverValue, TreeSearchConfig, beam_search, calc_chains
from scalerl.generator.engine import LengthControl, SamplingParams, budget_forcing
from scalerl.generator.role import length_control
from scalerl.messages import Completion
from scalerl.model.tokenizer import THINK_CLOSE
from scalerl.runtime.progress import Progress
from scalerl.tasks import Problem, Task, arithmetic_only_failure, solvable_state
from scalerl.verifier.verifier import Verifier

SCORER_DIR = "scorer"
PREFIX_VALUE_DIR = "prefix_value"
SELECTION_STRATEGIES = ("sample", "majority", "best-of-n")


class Backend(Protocol):
    """A generator: n completions for each prompt, prompt-major."""

    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingParams,
                 length: LengthControl) -> list[Completion]: ...


@dataclass(frozen=True, slots=True)
class EvalOptions:
    strategies: tuple[str, ...]
    ks: tuple[int, ...]
    samples: int
    temperature: float
    top_p: float = 1.0
    seed: int = 0
    scorer: str | None = None
    """"train", a folder, or None: the checkpoint's own scorer if it has one, else train one."""
    scorer_training: ScorerTrainingConfig = field(default_factory=ScorerTrainingConfig)
    max_thinking: tuple[int, ...] = ()
    min_thinking: int = 0
    max_waits: int = 0
    wait_text: str = "Wait"
    answer_prefix: str = ""
    tree_widths: tuple[int, ...] = (1, 2, 4)
    tree_expansions: int = 4
    tree_value: str = "scorer"
    """"scorer" (the learned outcome scorer), "prefix" (the value trained on partial states' Monte-Carlo
    labels, `resolve_prefix_value`) or "solver" (diagnostic upper bound: `SolverValue`)."""
    tree_calculator: bool = True
    tree_resample: int = 0
    prompts_per_batch: int = 16
    show_progress: bool = True


@dataclass(slots=True)
class Context:
    spec: JobSpec
    task: Task
    verifier: Verifier
    tokenizer: Any
    policy: Any
    """The checkpoint's model (for training a scorer); the backend may serve it or not (grpc)."""
    backend: Backend
    checkpoint: Path
    opts: EvalOptions
    progress: Progress


def _flat(backend: Backend) -> Callable[[list[list[int]], SamplingParams, LengthControl], list[Completion]]:
    """A backend as the per-row `generate(prompt_ids, sampling, length)` the samplers call (n = 1 rows)."""
    return lambda ids, sampling, length: backend.generate(ids, 1, sampling, length)


def _sample(ctx: Context, problems: list[Problem], n: int, sampling: SamplingParams, length: LengthControl,
            desc: str) -> tuple[list[ProblemSamples], float]:
    """Samples of every problem and the generation wall time in seconds."""
    bar = ctx.progress.bar(desc, len(problems), unit="prompt", leave=False)
    t0 = time.perf_counter()
    out = sample_problems(ctx.backend.generate, ctx.tokenizer, problems, ctx.task, ctx.verifier, n=n, sampling=sampling,
                          length=length, prompts_per_batch=ctx.opts.prompts_per_batch, on_batch=bar.update)
    bar.close()
    return out, time.perf_counter() - t0


def resolve_scorer(ctx: Context) -> tuple[Scorer, dict[str, Any]]:
    """The scorer `--scorer` names, the checkpoint's saved one, or a new one trained and saved there."""
    choice = ctx.opts.scorer
    saved = ctx.checkpoint / SCORER_DIR
    if choice not in (None, "train"):
        scorer = load_scorer(Path(choice))
        return scorer, {"source": str(choice), **getattr(scorer, "meta", {})}
    if choice is None and saved.is_dir():
        scorer = load_scorer(saved)
        return scorer, {"source": str(saved), **getattr(scorer, "meta", {})}
    cfg = ctx.opts.scorer_training
    train_problems = ctx.task.problems("train")[:cfg.prompts]
    sampling = SamplingParams(ctx.opts.temperature, ctx.opts.top_p)
    samples, _ = _sample(ctx, train_problems, cfg.samples_per_prompt, sampling, length_control(ctx.spec, ctx.tokenizer),
                         "scorer rollouts")
    rollouts = [LabelledRollout(s.problem_id, s.prompt, text, ok)
                for s in samples for text, ok in zip(s.texts, s.correct, strict=True)]
    bar = ctx.progress.bar("scorer training", cfg.steps, unit="step", leave=False)
    scorer = train_outcome_scorer(ctx.policy, ctx.tokenizer, rollouts, cfg,
                                  on_step=lambda _s, loss: bar.update(1, loss=f"{loss:.3f}"))
    bar.close()
    scorer.meta["policy_checkpoint"] = str(ctx.checkpoint)
    scorer.save(saved)
    return scorer, {"source": f"trained, saved to {saved}", **scorer.meta}


def _attach_scores(scorer: Scorer, samples: list[ProblemSamples]) -> None:
    prompts = [s.prompt for s in samples for _ in s.texts]
    texts = [t for s in samples for t in s.texts]
    scored = scorer.score(prompts, texts)
    i = 0
    for s in samples:
        s.scores = scored.values[i:i + s.n]
        s.scorer_tokens = scored.forward_tokens[i:i + s.n]
        i += s.n


def _majority_judge(task: Task) -> Callable[[ProblemSamples, str], bool]:
    cache: dict[tuple[str, str], bool] = {}

    def judge(p: ProblemSamples, winner: str) -> bool:
        key = (p.problem_id, winner)
        if key not in cache:
            cache[key] = task.is_correct(THINK_CLOSE + winner, p.reference)
        return cache[key]

    return judge


def evaluate_checkpoint(ctx: Context, problems: list[Problem]) -> dict[str, Any]:
    """Every requested strategy on `problems`; a JSON-ready record (points as dicts)."""
    o = ctx.opts
    base = length_control(ctx.spec, ctx.tokenizer)
    sampling = SamplingParams(o.temperature, o.top_p)
    points: list[StrategyPoint] = []
    record: dict[str, Any] = {"problems": len(problems)}
    if "greedy" in o.strategies:
        greedy, _ = _sample(ctx, problems, 1, SamplingParams(0.0), base, "greedy")
        points += [_renamed(p, "greedy") for p in sample_points(greedy, [1], seed=o.seed)]
    needs_samples = any(s in o.strategies for s in (*SELECTION_STRATEGIES, "tree"))
    samples: list[ProblemSamples] = []
    if needs_samples:
        samples, wall_s = _sample(ctx, problems, o.samples, sampling, base, f"sampling n={o.samples}")
        tokens = sum(sum(s.tokens) for s in samples)
        record["inference"] = {"gen_tokens": tokens, "wall_s": wall_s, "tokens_per_s": tokens / max(wall_s, 1e-9),
                               "device_hours_per_token": ctx.spec.runtime.devices * wall_s / 3600 / max(tokens, 1)}
    if "sample" in o.strategies:
        points += sample_points(samples, o.ks, seed=o.seed)
    if "majority" in o.strategies:
        points += majority_points(samples, o.ks, _majority_judge(ctx.task), seed=o.seed)
    scorer: Scorer | None = None
    if "best-of-n" in o.strategies or ("tree" in o.strategies and o.tree_value in ("scorer", "prefix")):
        scorer, record["scorer"] = resolve_scorer(ctx)
    if "best-of-n" in o.strategies and scorer is not None:
        _attach_scores(scorer, samples)
        points += best_of_n_points(samples, o.ks, seed=o.seed)
        points += random_points(samples, o.ks, seed=o.seed)
        if "sample" not in o.strategies:
            points += [_renamed(p, "oracle") for p in sample_points(samples, o.ks, seed=o.seed)]
    record["points"] = points
    if "budget-forcing" in o.strategies:
        record["budget_forcing"] = budget_forcing_rows(ctx, problems, base, sampling)
    if "tree" in o.strategies:
        record.update(tree_record(ctx, problems, samples, scorer, sampling, base))
    return record


def _renamed(p: StrategyPoint, name: str) -> StrategyPoint:
    p.strategy = name
    return p


def budget_forcing_rows(ctx: Context, problems: list[Problem], base: LengthControl,
                        sampling: SamplingParams) -> list[dict[str, Any]]:
    """mean@n at each maximum thinking budget (and the unforced reference), thinking tokens measured."""
    o, tok = ctx.opts, ctx.tokenizer
    wait_ids = list(tok(o.wait_text, add_special_tokens=False)["input_ids"]) if o.max_waits else []
    prefix_ids = list(tok(o.answer_prefix, add_special_tokens=False)["input_ids"]) if o.answer_prefix else []
    rows = []
    for max_thinking in (None, *o.max_thinking):
        length = base if max_thinking is None else budget_forcing(
            base, max_thinking=max_thinking, answer_prefix_ids=prefix_ids, min_thinking=o.min_thinking,
            wait_ids=wait_ids, max_waits=o.max_waits)
        samples, _ = _sample(ctx, problems, o.samples, sampling, length, f"budget forcing max={max_thinking}")
        per_problem = [sum(s.correct) / s.n for s in samples]
        lo, hi = bootstrap_ci(per_problem, seed=o.seed)
        n_total = sum(s.n for s in samples)
        phrase = len(length.interruption_ids or ())
        waits = sum((forced - (phrase if finish == "interrupted" else 0)) // max(1, len(wait_ids))
                    for s in samples for forced, finish in zip(s.forced_tokens, s.finish, strict=True))
        rows.append({"max_thinking": max_thinking, "min_thinking": length.min_thinking,
                     "max_waits": length.max_waits, "accuracy": sum(per_problem) / len(per_problem),
                     "ci_low": lo, "ci_high": hi,
                     "thinking_tokens_per_sample": sum(sum(s.thinking_tokens) for s in samples) / n_total,
                     "gen_tokens_per_sample": sum(sum(s.tokens) for s in samples) / n_total,
                     "waits_per_sample": waits / n_total if length.max_waits else 0.0})
    return rows


def tree_record(ctx: Context, problems: list[Problem], samples: list[ProblemSamples], scorer: Scorer | None,
                sampling: SamplingParams, base: LengthControl) -> dict[str, Any]:
    """The tree search's part of the record: its rows, the sampling baselines (verified, and sample+calc
    with the calculator), how wrong samples fail, and the learned values' ranking of held-out states."""
    o = ctx.opts
    record: dict[str, Any] = {}
    verified = verified_points(samples, o.ks, seed=o.seed)
    record["verified_sampling"] = [p.to_dict() for p in verified]
    wrong = [(s.prompt, t) for s in samples for t, ok in zip(s.texts, s.correct, strict=True) if not ok]
    record["sampling_wrong_arithmetic_only"] = (sum(arithmetic_only_failure(p, t) for p, t in wrong)
                                                / max(1, len(wrong)))
    record["sampling_wrong_fraction"] = len(wrong) / max(1, sum(s.n for s in samples))
    calc: list[StrategyPoint] = []
    eval_states: list[LabelledPrefix] = []
    if o.tree_calculator:
        calc_samples, eval_chains = calc_chains(problems, ctx.task, n=o.samples, generate=_flat(ctx.backend),
                                                tokenizer=ctx.tokenizer, cfg=TreeSearchConfig(), sampling=sampling,
                                                answer_budget=base.answer_budget)
        calc = [_renamed(p, "verified-calc") for p in verified_points(calc_samples, o.ks, seed=o.seed)]
        record["verified_calc_sampling"] = [p.to_dict() for p in calc]
        eval_states = prefix_value_labels([(p.id, p.prompt, r.states, r.solved)
                                           for p, group in zip(problems, eval_chains, strict=True) for r in group])
    value: Scorer | None = scorer
    if o.tree_value == "solver":
        value = SolverValue()
    elif o.tree_value == "prefix":
        value, record["prefix_value"] = resolve_prefix_value(ctx, scorer)
    record["tree_value"] = o.tree_value
    if eval_states:  # how each learned value ranks the held-out problems' states, against the solver
        for name, v in (("outcome_scorer", scorer), ("prefix_value", value if o.tree_value == "prefix" else None)):
            if v is not None:
                record[f"{name}_states"] = {"states": len(eval_states), **state_value_auc(v, eval_states, "")}
    record["tree"] = tree_rows(ctx, problems, value, sampling, base.answer_budget, verified, calc)
    return record


def resolve_prefix_value(ctx: Context, scorer: Scorer | None) -> tuple[Scorer, dict[str, Any]]:
    """The partial-state value saved in `<checkpoint>/prefix_value/`, or a new one: the policy's own
    calculator chains on *training* problems, every state labelled with the fraction of chains through it
    that the verifier accepted (`prefix_value_labels`), a value head fitted to them (`train_prefix_value`).
    Also the diagnostic: AUC of this value, and of the outcome scorer, against the solver's verdict
    (can the target still be made?) on the held-out problems' states."""
    saved = ctx.checkpoint / PREFIX_VALUE_DIR
    if saved.is_dir():
        loaded = load_scorer(saved)
        return loaded, {"source": str(saved), **getattr(loaded, "meta", {})}
    cfg = ctx.opts.scorer_training
    train_problems = ctx.task.problems("train")[:cfg.prompts]
    sampling = SamplingParams(ctx.opts.temperature, ctx.opts.top_p)
    bar = ctx.progress.bar("prefix value chains", len(train_problems), unit="prompt", leave=False)
    chains: list[list[Any]] = []
    chunk = max(1, 1024 // cfg.samples_per_prompt)  # rows per batched call: the engine pads to the longest
    answer_budget = length_control(ctx.spec, ctx.tokenizer).answer_budget
    for start in range(0, len(train_problems), chunk):
        part = train_problems[start:start + chunk]
        chains += calc_chains(part, ctx.task, n=cfg.samples_per_prompt, generate=_flat(ctx.backend),
                              tokenizer=ctx.tokenizer, cfg=TreeSearchConfig(), sampling=sampling,
                              answer_budget=answer_budget)[1]
        bar.update(len(part))
    bar.close()
    labelled = prefix_value_labels([(p.id, p.prompt, r.states, r.solved)
                                    for p, group in zip(train_problems, chains, strict=True) for r in group])
    bar = ctx.progress.bar("prefix value training", cfg.steps, unit="step", leave=False)
    value, held = train_prefix_value(ctx.policy, ctx.tokenizer, labelled, cfg,
                                     on_step=lambda _s, loss: bar.update(1, loss=f"{loss:.3f}"))
    bar.close()
    if held:
        diag = {"heldout_states": len(held), **state_value_auc(value, held, "")}
        if scorer is not None:
            diag.update(state_value_auc(scorer, held, "outcome_scorer_"))
        value.meta.update(diag)
    value.meta["policy_checkpoint"] = str(ctx.checkpoint)
    value.save(saved)
    return value, {"source": f"trained, saved to {saved}", **value.meta}


def state_value_auc(value: Scorer, states: list[LabelledPrefix], name: str) -> dict[str, Any]:
    """How well a value ranks search states against the solver's verdict (can the target still be made?):
    pooled AUC, and the mean AUC within a problem (what ranking one node's children needs)."""
    values = value.score([x.prompt for x in states], [x.prefix for x in states]).values
    verdicts = [solvable_state(x.prompt, x.prefix) for x in states]
    within, problems = within_problem_auc(values, verdicts, [x.prompt_id for x in states])
    return {f"{name}heldout_solvable_rate": sum(verdicts) / len(states),
            f"{name}heldout_auc_vs_solver": auc(values, verdicts),
            f"{name}heldout_within_problem_auc_vs_solver": within,
            f"{name}heldout_problems_with_both_verdicts": problems}


def tree_rows(ctx: Context, problems: list[Problem], scorer: Scorer | None, sampling: SamplingParams,
              answer_budget: int, verified: list[StrategyPoint], calc: list[StrategyPoint]) -> list[dict[str, Any]]:
    """Beam search at each width, with sampling+verifier's accuracy at the same generated tokens (and
    sample+calc's: chains with the same calculator, when the search uses it)."""
    o = ctx.opts
    rows = []
    for width in o.tree_widths:
        cfg = TreeSearchConfig(beam_width=width, expansions=o.tree_expansions, calculator=o.tree_calculator,
                               resample_rounds=o.tree_resample, root_width=width)
        depth = ctx.spec.task.countdown_numbers
        bar = ctx.progress.bar(f"tree search beam {width}x{o.tree_expansions}", depth, unit="depth", leave=False)

        def on_depth(_depth: int, solved: int, bar: Any = bar) -> None:
            bar.update(1, solved=solved)

        results = beam_search(problems, ctx.task, generate=_flat(ctx.backend), tokenizer=ctx.tokenizer,
                              scorer=scorer, cfg=cfg, sampling=sampling, answer_budget=answer_budget,
                              on_depth=on_depth)
        bar.close()
        n = len(results)
        per_problem = [float(r.solved) for r in results]
        lo, hi = bootstrap_ci(per_problem, seed=o.seed)
        gen = sum(r.gen_tokens for r in results) / n
        rows.append({"beam_width": width, "expansions": o.tree_expansions, "accuracy": sum(per_problem) / n,
                     "ci_low": lo, "ci_high": hi, "gen_tokens_per_problem": gen,
                     "thinking_tokens_per_problem": sum(r.thinking_tokens for r in results) / n,
                     "scorer_tokens_per_problem": sum(r.scorer_tokens for r in results) / n,
                     "prefill_tokens_per_problem": sum(r.prefill_tokens for r in results) / n,
                     "expansions_per_problem": sum(r.expansions for r in results) / n,
                     "illegal_steps_per_problem": sum(r.illegal_steps for r in results) / n,
                     "duplicate_steps_per_problem": sum(r.duplicate_steps for r in results) / n,
                     "forced_tokens_per_problem": sum(r.forced_tokens for r in results) / n,
                     "lost_states_per_problem": sum(r.lost_states for r in results) / n,
                     "leaves_per_problem": sum(r.leaves for r in results) / n,
                     "verified_sampling_accuracy_at_equal_tokens": interpolate_accuracy(verified, gen),
                     "verified_calc_sampling_accuracy_at_equal_tokens": interpolate_accuracy(calc, gen)})
    return rows


class EmbeddedBackend:
    """The torch engine in this process (the checkpoint's weights)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingParams,
                 length: LengthControl) -> list[Completion]:
        return list(self.engine.generate([p for p in prompt_ids for _ in range(n)], sampling, length))
