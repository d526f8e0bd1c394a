"""Step-level beam search over the model's own Countdown steps (`scalerl eval --strategy tree`).

A Countdown chain of thought is a list of steps `"a op b=c"` separated by "," inside `<think>`, the
last one followed by `</think>` and the answer; each step replaces two numbers of the pool by one
(`tasks.countdown_search`). The search:

1. Expand: every node of every unsolved problem's beam is continued `expansions` times, all in one
   batched call of the same generator as sampling; a continuation stops at the step separator or
   at `</think>` (`LengthControl.stop_ids`), or is discarded after `step_tokens`.
2. Check each continuation's step on the node's pool (`countdown_step`: right arithmetic, numbers
   available, positive-integer results): an illegal step is discarded. A step followed by "," is a
   child. A step followed by `</think>` (or a bare `</think>`) ends thinking: if the pool then holds
   the target the state is won and the model writes its answer (a second batched call, at most
   `answer_expansions` per problem and depth), which the task's verifier checks; otherwise thinking
   ended without making the target, and the continuation is dropped before any answer is paid
   for. A child with one number left that is not the target is lost and dropped too. Won and lost
   follow from the game's rules and the prompt alone, like legality; Countdown's verifier needs no
   hidden reference either (the numbers and the target are in the prompt), as for the `verified`
   sampling baseline. A verified answer solves the problem and ends its search (anytime).
3. Select: children that reach the same pool are merged; children whose pool holds the target are
   kept first; the rest are rated by the scorer (the learned outcome scorer's value of the partial
   completion), and the best `beam_width` kept.

Cost: every generated token counts, discarded continuations included (`gen_tokens`); the scorer's
input tokens are counted apart (`scorer_tokens`); `prefill_tokens` are the prompt + prefix tokens fed
again with each expansion (sampling reads its prompt once per sample; our engine shares no prefix
cache, a serving engine would).

Departures: the `<think>` that opens every chain is put in the root's prefix rather than sampled
(one token a problem, not counted); without a scorer, children keep their generation order.

`SolverValue` is a diagnostic, not a test-time method: it rates a state 1 if the exhaustive solver
can still reach the target from its pool, else 0 (privileged information, the counterpart of oracle
best-of-N). It measures what the search would gain from a perfect value estimate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from scalerl.evaluation.rollouts import GenerateFn
from scalerl.evaluation.scorer import Scorer, Scores
from scalerl.generator.engine import LengthControl, SamplingParams
from scalerl.generator.role import encode_prompt
from scalerl.model.tokenizer import THINK_CLOSE, THINK_OPEN
from scalerl.tasks import Problem, Task, countdown_step, parse_countdown_prompt, solve_countdown

STEP_SEPARATOR = ","


@dataclass(frozen=True, slots=True)
class TreeSearchConfig:
    beam_width: int = 2
    expansions: int = 4
    """Continuations sampled per beam node and depth."""
    step_tokens: int = 16
    """Most tokens one step may take before the continuation is discarded."""
    answer_expansions: int = 2
    """Answers written per problem and depth, from distinct won states (thinking ended on the target)."""


@dataclass(slots=True)
class _Node:
    prefix: str
    """The completion so far, e.g. "<think>50+25=75,"."""
    pool: list[int]
    won: bool = False


@dataclass(slots=True)
class TreeResult:
    problem_id: str
    solved: bool
    completion: str | None
    """The verified completion, if one was found."""
    gen_tokens: int = 0
    thinking_tokens: int = 0
    prefill_tokens: int = 0
    scorer_tokens: int = 0
    expansions: int = 0
    illegal_steps: int = 0
    lost_states: int = 0
    leaves: int = 0
    depth: int = 0
    beams: list[_Node] = field(default_factory=list, repr=False)


def step_length_control(cfg: TreeSearchConfig, *, answer_budget: int, tokenizer: Any) -> LengthControl:
    """One step at a time: stop at the separator or at `</think>`."""
    sep = tokenizer.convert_tokens_to_ids(STEP_SEPARATOR)
    close = tokenizer.convert_tokens_to_ids(THINK_CLOSE)
    return LengthControl(thinking_budget=cfg.step_tokens, answer_budget=answer_budget, think_close_id=int(close),
                         eos_id=int(tokenizer.eos_token_id), stop_ids=(int(sep), int(close)))


def answer_length_control(*, answer_budget: int, tokenizer: Any) -> LengthControl:
    """The answer after `</think>` (already in the prompt): up to `answer_budget` tokens, then EOS."""
    close = tokenizer.convert_tokens_to_ids(THINK_CLOSE)
    return LengthControl(thinking_budget=answer_budget, answer_budget=1, think_close_id=int(close),
                         eos_id=int(tokenizer.eos_token_id))


def _classify(node: _Node, text: str, finish: str, target: int) -> tuple[str, _Node | None]:
    """("won" | "child" | "illegal" | "lost" | "dead", next node) for one continuation's text.

    "won": thinking ended with the target in the pool (the node returned carries the prefix up to and
    including `</think>`); "lost": thinking ended, or one number is left, without the target."""
    if finish == "length" or not text.endswith((STEP_SEPARATOR, THINK_CLOSE)):
        return "dead", None  # too long, or EOS inside thinking
    closes = text.endswith(THINK_CLOSE)
    step = text.removesuffix(THINK_CLOSE if closes else STEP_SEPARATOR)
    pool = countdown_step(node.pool, step) if step else (list(node.pool) if closes else None)
    if pool is None:
        return "illegal", None
    nxt = _Node(prefix=node.prefix + text, pool=pool, won=target in pool)
    if closes:
        return ("won", nxt) if nxt.won else ("lost", None)
    if len(pool) == 1 and not nxt.won:
        return "lost", None
    return "child", nxt


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def beam_search(problems: Sequence[Problem], task: Task, *, generate: GenerateFn, tokenizer: Any,
                scorer: Scorer | None, cfg: TreeSearchConfig, sampling: SamplingParams, answer_budget: int,
                on_depth: Callable[[int, int], None] | None = None) -> list[TreeResult]:
    """Search every problem (batched across problems); one `TreeResult` each, in order."""
    step_rules = step_length_control(cfg, answer_budget=answer_budget, tokenizer=tokenizer)
    answer_rules = answer_length_control(answer_budget=answer_budget, tokenizer=tokenizer)
    prompt_ids = [encode_prompt(tokenizer, p.prompt) for p in problems]
    parsed = [parse_countdown_prompt(p.prompt) for p in problems]
    results = [TreeResult(problem_id=p.id, solved=False, completion=None,
                          beams=[_Node(prefix=THINK_OPEN, pool=numbers, won=target in numbers)])
               for p, (numbers, target) in zip(problems, parsed, strict=True)]
    max_depth = max((len(r.beams[0].pool) for r in results), default=0)
    for depth in range(max_depth):
        live = [i for i, r in enumerate(results) if not r.solved and r.beams]
        if not live:
            break
        rows = [(i, node) for i in live for node in results[i].beams for _ in range(cfg.expansions)]
        inputs = [prompt_ids[i] + _ids(tokenizer, node.prefix) for i, node in rows]
        children: dict[int, dict[tuple[int, ...], _Node]] = {i: {} for i in live}
        won: dict[int, dict[str, _Node]] = {i: {} for i in live}
        for (i, node), inp, c in zip(rows, inputs, generate(inputs, sampling, step_rules), strict=True):
            r = results[i]
            r.gen_tokens += len(c.token_ids)
            r.thinking_tokens += c.thinking_tokens
            r.prefill_tokens += len(inp)
            r.expansions += 1
            r.depth = depth + 1
            kind, nxt = _classify(node, c.text, c.finish_reason, parsed[i][1])
            if kind == "illegal":
                r.illegal_steps += 1
            elif kind == "lost":
                r.lost_states += 1
            elif kind == "won" and nxt is not None and len(won[i]) < cfg.answer_expansions:
                won[i].setdefault(nxt.prefix, nxt)
            elif kind == "child" and nxt is not None:
                children[i].setdefault(tuple(sorted(nxt.pool)), nxt)
        _answer(results, problems, task, won, generate=generate, prompt_ids=prompt_ids, tokenizer=tokenizer,
                sampling=sampling, rules=answer_rules)
        _select(results, problems, children, scorer, cfg.beam_width)
        if on_depth is not None:
            on_depth(depth + 1, sum(r.solved for r in results))
    for r in results:
        r.beams = []
    return results


def _answer(results: list[TreeResult], problems: Sequence[Problem], task: Task, won: dict[int, dict[str, _Node]],
            *, generate: GenerateFn, prompt_ids: list[list[int]], tokenizer: Any, sampling: SamplingParams,
            rules: LengthControl) -> None:
    """Write the answer of every won state (one batched call) and verify it."""
    rows = [(i, node) for i, states in won.items() for node in states.values()]
    if not rows:
        return
    inputs = [prompt_ids[i] + _ids(tokenizer, node.prefix) for i, node in rows]
    for (i, node), inp, c in zip(rows, inputs, generate(inputs, sampling, rules), strict=True):
        r = results[i]
        r.gen_tokens += len(c.token_ids)
        r.prefill_tokens += len(inp)
        r.leaves += 1
        if not r.solved and task.is_correct(node.prefix + c.text, problems[i].answer):
            r.solved, r.completion = True, node.prefix + c.text


def _select(results: list[TreeResult], problems: Sequence[Problem], children: dict[int, dict[tuple[int, ...], _Node]],
            scorer: Scorer | None, width: int) -> None:
    """Keep each unsolved problem's best `width` children: those whose pool holds the target first, then
    by the scorer's value (one batched call)."""
    todo = [(i, node) for i, kids in children.items() if not results[i].solved for node in kids.values()]
    values = [0.0] * len(todo)
    if scorer is not None and todo:
        scored = scorer.score([problems[i].prompt for i, _ in todo], [node.prefix for _, node in todo])
        values = scored.values
        for (i, _), n_tok in zip(todo, scored.forward_tokens, strict=True):
            results[i].scorer_tokens += n_tok
    ranked: dict[int, list[tuple[bool, float, int, _Node]]] = {i: [] for i in children}
    for order, ((i, node), v) in enumerate(zip(todo, values, strict=True)):
        ranked[i].append((not node.won, -v, order, node))
    for i in children:
        best = sorted(ranked[i], key=lambda t: t[:3])[:width]
        results[i].beams = [] if results[i].solved else [t[3] for t in best]


class SolverValue:
    """Diagnostic value (see the module docstring): 1.0 if the state's pool can still make the target."""

    name = "solver-oracle"

    def score(self, prompts: Sequence[str], completions: Sequence[str]) -> Scores:
        values = []
        for prompt, prefix in zip(prompts, completions, strict=True):
            pool, target = parse_countdown_prompt(prompt)
            for step in prefix.removeprefix(THINK_OPEN).split(STEP_SEPARATOR)[:-1]:
                pool = countdown_step(pool, step) or []
            values.append(float(bool(pool) and solve_countdown(pool, target) is not None))
        return Scores(values=values, forward_tokens=[0] * len(values))
