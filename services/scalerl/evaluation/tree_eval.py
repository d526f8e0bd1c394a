"""The tree search's part of `scalerl eval`'s record (Countdown): the step-level beam search and the search
without replacement, each against two sampling baselines at equal generated tokens per problem —
sampling + verifier, and sample+calc (independent chains with the search's calculator and early
rejection) — plus how wrong samples fail and how well the learned values rank search states.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scalerl.evaluation.metrics import bootstrap_ci
from scalerl.evaluation.scorer import Scorer, load_scorer
from scalerl.evaluation.scorer_training import (
    LabelledPrefix,
    auc,
    prefix_value_labels,
    train_prefix_value,
    within_problem_auc,
)
from scalerl.evaluation.strategies import (
    ProblemSamples,
    StrategyPoint,
    interpolate_accuracy,
    renamed,
    verified_points,
)
from scalerl.evaluation.tree_search import SolverValue, TreeSearchConfig, beam_search, calc_chains
from scalerl.evaluation.unique_search import UniqueResult, UniqueSearchConfig, accuracy_at, unique_search
from scalerl.generator.engine import LengthControl, SamplingParams
from scalerl.generator.role import length_control
from scalerl.messages import Completion
from scalerl.tasks import Problem, arithmetic_only_failure, solvable_state

if TYPE_CHECKING:
    from scalerl.evaluation.context import Context, EvalOptions

PREFIX_VALUE_DIR = "prefix_value"
TREE_METHODS = ("beam", "unique")


def tree_uses_value(o: EvalOptions) -> bool:
    """Whether the tree search rates states: the beam search always, the unique search when it prunes."""
    return "tree" in o.strategies and ("beam" in o.tree_methods or unique_uses_value(o))


def unique_uses_value(o: EvalOptions) -> bool:
    return o.tree_prune is not None or o.tree_value_weight > 0


def _flat(ctx: Context, stream: str) -> Callable[[list[list[int]], SamplingParams, LengthControl], list[Completion]]:
    """The backend as the per-row `generate(prompt_ids, sampling, length)` the searches call (n = 1 rows),
    drawing from the eval seed's stream `stream` from here on."""
    ctx.backend.use_stream(stream)
    return lambda ids, sampling, length: ctx.backend.generate(ids, 1, sampling, length)


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
        calc_samples, eval_chains = calc_chains(problems, ctx.task, n=o.samples, generate=_flat(ctx, "tree calc"),
                                                tokenizer=ctx.tokenizer, cfg=TreeSearchConfig(), sampling=sampling,
                                                answer_budget=base.answer_budget)
        calc = [renamed(p, "verified-calc") for p in verified_points(calc_samples, o.ks, seed=o.seed)]
        record["verified_calc_sampling"] = [p.to_dict() for p in calc]
        eval_states = prefix_value_labels([(p.id, p.prompt, r.states, r.solved)
                                           for p, group in zip(problems, eval_chains, strict=True) for r in group])
    value: Scorer | None = scorer
    if not tree_uses_value(o):
        value = None
    elif o.tree_value == "solver":
        value = SolverValue()
    elif o.tree_value == "prefix":
        value, record["prefix_value"] = resolve_prefix_value(ctx, scorer)
    record["tree_value"] = o.tree_value if value is not None else None
    if eval_states:  # how each learned value ranks the held-out problems' states, against the solver
        for name, v in (("outcome_scorer", scorer), ("prefix_value", value if o.tree_value == "prefix" else None)):
            if v is not None:
                record[f"{name}_states"] = {"states": len(eval_states), **state_value_auc(v, eval_states, "")}
    record["tree"] = []
    if "beam" in o.tree_methods:
        record["tree"] += tree_rows(ctx, problems, value, sampling, base.answer_budget, verified, calc)
    if "unique" in o.tree_methods:
        rows, record["tree_unique_run"] = unique_rows(ctx, problems, value, sampling, base.answer_budget,
                                                      verified, calc)
        record["tree"] += rows
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
    generate = _flat(ctx, "prefix value chains")
    for start in range(0, len(train_problems), chunk):
        part = train_problems[start:start + chunk]
        chains += calc_chains(part, ctx.task, n=cfg.samples_per_prompt, generate=generate,
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

        results = beam_search(problems, ctx.task, generate=_flat(ctx, f"tree beam {width}"), tokenizer=ctx.tokenizer,
                              scorer=scorer, cfg=cfg, sampling=sampling, answer_budget=answer_budget,
                              on_depth=on_depth)
        bar.close()
        n = len(results)
        per_problem = [float(r.solved) for r in results]
        lo, hi = bootstrap_ci(per_problem, seed=o.seed)
        gen = sum(r.gen_tokens for r in results) / n
        rows.append({"method": "beam", "beam_width": width, "expansions": o.tree_expansions,
                     "accuracy": sum(per_problem) / n,
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


def unique_rows(ctx: Context, problems: list[Problem], value: Scorer | None, sampling: SamplingParams,
                answer_budget: int, verified: list[StrategyPoint], calc: list[StrategyPoint]
                ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The search without replacement, run once to the largest `--tree-budget` and read at each budget (its
    draws do not depend on the budget), with the sampling baselines at the same generated tokens; and the
    whole run's counts."""
    o = ctx.opts
    next_probs = getattr(ctx.backend, "next_probs", None)
    if next_probs is None:
        raise TypeError("the unique tree search needs next-token probabilities: an embedded backend")
    cfg = UniqueSearchConfig(budget=max(o.tree_budgets), answer_budget=answer_budget, seed=o.seed,
                             prune_below=o.tree_prune, value_weight=o.tree_value_weight)
    bar = ctx.progress.bar("tree search without replacement", len(problems), unit="problem", leave=False)
    done = [0]

    def on_round(_round: int, finished: int) -> None:
        bar.update(finished - done[0])
        done[0] = finished

    t0 = time.perf_counter()
    results = unique_search(problems, ctx.task, next_probs=lambda rows: next_probs(rows, sampling),
                            tokenizer=ctx.tokenizer, cfg=cfg, value=value if unique_uses_value(o) else None,
                            on_round=on_round)
    wall_s = time.perf_counter() - t0
    bar.close()
    rows = [unique_row(results, b, seed=o.seed, prune_below=o.tree_prune, value_weight=o.tree_value_weight,
                       verified=verified, calc=calc)
            for b in sorted(o.tree_budgets)]
    return rows, unique_run_summary(results, budget=cfg.budget, wall_s=wall_s)


def unique_row(results: list[UniqueResult], budget: int, *, seed: int, prune_below: float | None,
               value_weight: float, verified: list[StrategyPoint], calc: list[StrategyPoint]) -> dict[str, Any]:
    """One budget's row: accuracy with its bootstrap CI over problems, generated tokens per problem, and
    the two sampling baselines' accuracy at those tokens."""
    per_problem = [float(r.solved_by(budget)) for r in results]
    lo, hi = bootstrap_ci(per_problem, seed=seed)
    acc, gen = accuracy_at(results, budget)
    return {"method": "unique", "budget": budget, "prune_below": prune_below,
            "value_weight": value_weight, "accuracy": acc,
            "ci_low": lo, "ci_high": hi, "gen_tokens_per_problem": gen,
            "verified_sampling_accuracy_at_equal_tokens": interpolate_accuracy(verified, gen),
            "verified_calc_sampling_accuracy_at_equal_tokens": interpolate_accuracy(calc, gen)}


def unique_run_summary(results: list[UniqueResult], *, budget: int, wall_s: float) -> dict[str, Any]:
    """Per problem, over the run to the largest budget: what the chains ended in and what else was paid."""
    n = max(1, len(results))
    outcomes = sorted({k for r in results for k in r.outcomes})
    return {"budget": budget, "wall_s": wall_s,
            "gen_tokens_per_problem": sum(r.gen_tokens for r in results) / n,
            "forced_tokens_per_problem": sum(r.forced_tokens for r in results) / n,
            "prefill_tokens_per_problem": sum(r.prefill_tokens for r in results) / n,
            "scorer_tokens_per_problem": sum(r.scorer_tokens for r in results) / n,
            "chains_per_problem": sum(r.chains for r in results) / n,
            "chain_outcomes_per_problem": {k: sum(r.outcomes.get(k, 0) for r in results) / n for k in outcomes},
            "exhausted_problems": sum(r.exhausted for r in results),
            "solved_within_chains": solved_within_chains(results)}


def solved_within_chains(results: list[UniqueResult]) -> dict[int, float]:
    """Fraction of problems solved by their k-th chain, for k = 1, 2, 4, ... up to the fewest chains an
    unsolved problem's search finished (beyond that, some problems were not searched k chains deep):
    pass@k per chain, to set against independent sampling's pass@k."""
    deepest = min((r.chains for r in results if r.solved_at is None), default=max((r.chains for r in results),
                                                                                  default=0))
    n, out, k = max(1, len(results)), {}, 1
    while k <= deepest:
        out[k] = sum(r.solved_at is not None and r.chains <= k for r in results) / n
        k *= 2
    return out
