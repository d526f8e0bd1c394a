"""`scalerl eval`'s work for one checkpoint: sample, score, search, and count what it cost.

One sampling pass of `samples` completions per problem serves `sample`, `majority` and `best-of-n`
at every k (strategies.py); `greedy`, each budget-forcing budget and each tree search run their own
generation. The generator is the torch engine in-process (embedded) or a generator service (grpc);
the scorer and the verifier run here.

Each generation phase draws from its own named stream of the eval seed (`Backend.use_stream`), so what
one phase samples does not depend on which other phases ran before it: `--strategy best-of-n` alone
samples the same completions as `--strategy greedy,sample,best-of-n` (greedy decoding still draws the
interruption cut points), and a saved scorer reused later rates the same samples it was first run on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scalerl.evaluation.context import Backend as Backend
from scalerl.evaluation.context import Context as Context
from scalerl.evaluation.context import EvalOptions as EvalOptions
from scalerl.evaluation.context import stream_seed as stream_seed
from scalerl.evaluation.metrics import bootstrap_ci
from scalerl.evaluation.rollouts import sample_problems
from scalerl.evaluation.scorer import Scorer, load_scorer
from scalerl.evaluation.scorer_training import (
    LabelledRollout,
    train_outcome_scorer,
)
from scalerl.evaluation.strategies import (
    ProblemSamples,
    StrategyPoint,
    best_of_n_points,
    majority_points,
    random_points,
    renamed,
    sample_points,
)
from scalerl.evaluation.tree_eval import tree_record, tree_uses_value
from scalerl.generator.engine import LengthControl, SamplingParams, budget_forcing
from scalerl.generator.role import length_control
from scalerl.messages import Completion
from scalerl.model.tokenizer import THINK_CLOSE
from scalerl.tasks import Problem, Task

SCORER_DIR = "scorer"
SELECTION_STRATEGIES = ("sample", "majority", "best-of-n")


def _sample(ctx: Context, problems: list[Problem], n: int, sampling: SamplingParams, length: LengthControl,
            desc: str, stream: str) -> tuple[list[ProblemSamples], float]:
    """Samples of every problem (drawn from the eval seed's stream `stream`) and the generation wall time
    in seconds."""
    ctx.backend.use_stream(stream)
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
                         "scorer rollouts", stream="scorer rollouts")
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
        greedy, _ = _sample(ctx, problems, 1, SamplingParams(0.0), base, "greedy", stream="greedy")
        points += [renamed(p, "greedy") for p in sample_points(greedy, [1], seed=o.seed)]
    needs_samples = any(s in o.strategies for s in (*SELECTION_STRATEGIES, "tree"))
    samples: list[ProblemSamples] = []
    if needs_samples:
        samples, wall_s = _sample(ctx, problems, o.samples, sampling, base, f"sampling n={o.samples}",
                                  stream="samples")
        tokens = sum(sum(s.tokens) for s in samples)
        record["inference"] = {"gen_tokens": tokens, "wall_s": wall_s, "tokens_per_s": tokens / max(wall_s, 1e-9),
                               "device_hours_per_token": ctx.spec.runtime.devices * wall_s / 3600 / max(tokens, 1)}
    if "sample" in o.strategies:
        points += sample_points(samples, o.ks, seed=o.seed)
    if "majority" in o.strategies:
        points += majority_points(samples, o.ks, _majority_judge(ctx.task), seed=o.seed)
    scorer: Scorer | None = None
    if "best-of-n" in o.strategies or (tree_uses_value(o) and o.tree_value in ("scorer", "prefix")):
        scorer, record["scorer"] = resolve_scorer(ctx)
    if "best-of-n" in o.strategies and scorer is not None:
        _attach_scores(scorer, samples)
        points += best_of_n_points(samples, o.ks, seed=o.seed)
        points += random_points(samples, o.ks, seed=o.seed)
        if "sample" not in o.strategies:
            points += [renamed(p, "oracle") for p in sample_points(samples, o.ks, seed=o.seed)]
    record["points"] = points
    if "budget-forcing" in o.strategies:
        record["budget_forcing"] = budget_forcing_rows(ctx, problems, base, sampling)
    if "tree" in o.strategies:
        record.update(tree_record(ctx, problems, samples, scorer, sampling, base))
    return record


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
        samples, _ = _sample(ctx, problems, o.samples, sampling, length, f"budget forcing max={max_thinking}",
                             stream=f"budget forcing {max_thinking}")
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


class EmbeddedBackend:
    """The torch engine in this process (the checkpoint's weights); `seed` is the eval seed."""

    def __init__(self, engine: Any, *, seed: int) -> None:
        self.engine = engine
        self.seed = seed

    def use_stream(self, name: str) -> None:
        self.engine.reseed(stream_seed(self.seed, name))

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingParams,
                 length: LengthControl) -> list[Completion]:
        return list(self.engine.generate([p for p in prompt_ids for _ in range(n)], sampling, length))

    def next_probs(self, prefix_ids: list[list[int]], sampling: SamplingParams) -> np.ndarray:
        """The next-token distribution after each prefix, [B, V] (the unique tree search's draws)."""
        probs: np.ndarray = self.engine.next_token_probs(prefix_ids, sampling).numpy()
        return probs
