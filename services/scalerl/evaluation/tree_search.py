"""Step-level beam search over the model's Countdown steps (`scalerl eval --strategy tree --tree-method beam`).

A Countdown chain of thought is a list of steps `"a op b=c"` separated by "," inside `<think>`, the
last one followed by `</think>` and the answer; each step replaces two numbers of the pool by one
(`tasks.countdown_search`). The search:

1. Expand: every node of every unsolved problem's beam is continued `expansions` times (the root
   `root_width * expansions` times, as Snell et al. 2024 sample a whole beam's worth of first steps),
   all in one batched call of the same generator as sampling. With the calculator (default) a step
   is proposed in two short calls, because the search knows a step's structure:
   a. the model writes `",a op"` (no "," at the root) or `</think>`; an `a` that is not in the node's
      pool is rejected here, before the rest of the step is paid for;
   b. it writes `"b="`; a `b` not in the pool (after `a` is taken) or an operation without a positive
      integer result is rejected; otherwise the result `c` is *computed* (`step_result`) and its
      digits are fed as forced tokens, counted in `gen_tokens` like generated ones (and in
      `forced_tokens`): the model never writes a wrong result.
   Without the calculator (`calculator=False`, the first version) the model writes whole steps,
   stopped at "," or `</think>`, and a step with a wrong result is discarded.
   Expansions of one node that repeat a step it already proposed are duplicates (`duplicate_steps`):
   their tokens count, and the node may be re-sampled once per duplicate, at most `resample_rounds`
   more times per depth (sampling without replacement at the step level, bounded; off by default,
   it did not pay on Countdown). With the calculator a duplicate is stopped at "a op" when every
   legal "a op b" was already proposed, else at "b=", and its result is never paid for.
2. End of thinking. With the calculator a state whose pool holds the target is won by the rules and
   its `</think>` is forced (one token, counted). A sampled `</think>` (or whole step ending with it)
   on a pool without the target is lost. A won state's answer is written by the model (a batched
   call, at most `answer_expansions` per problem and depth) and checked by the task's verifier. A
   child with one number left that is not the target is lost too. Won and lost follow from the
   game's rules and the prompt alone; Countdown's verifier needs no hidden reference either (the
   numbers and the target are in the prompt), as for the `verified` sampling baseline. A verified
   answer solves the problem and ends its search (anytime).
3. Select: children that reach the same pool are merged; children whose pool holds the target are
   kept first; the rest are rated by the value (a `Scorer` on the partial completion), and the best
   `beam_width` kept.

Cost: every generated or forced token counts, discarded continuations included (`gen_tokens`); the
scorer's input tokens are counted apart (`scorer_tokens`); `prefill_tokens` are the prompt + prefix
tokens fed again with each call row (our engine shares no prefix cache, a serving engine would).

`calc_chains` is the matching baseline: independent chains with the same calculator and the same
early rejection (a beam of one, one expansion, no value), scored by the verifier like sampling.

Departures: the `<think>` that opens every chain is put in the root's prefix rather than sampled
(one token a problem, not counted); without a value, children keep their generation order.

`SolverValue` is a diagnostic, not a test-time method: it rates a state 1 if the exhaustive solver
can still reach the target from its pool, else 0 (privileged information, the counterpart of oracle
best-of-N). It measures what the search would gain from a perfect value estimate.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from scalerl.evaluation.rollouts import GenerateFn
from scalerl.evaluation.scorer import Scorer, Scores
from scalerl.evaluation.strategies import ProblemSamples
from scalerl.generator.engine import LengthControl, SamplingParams
from scalerl.generator.role import encode_prompt
from scalerl.model.tokenizer import THINK_CLOSE, THINK_OPEN
from scalerl.tasks import Problem, Task, countdown_step, parse_countdown_prompt, solvable_state, step_result
from scalerl.tasks.countdown_search import STEP_SEPARATOR

OPS = "+-*/"
_HEAD = re.compile(r"(\d{1,15})([-+*/])")  # "a op", what call (a) writes after the separator
_TAIL = re.compile(r"(\d{1,15})=")  # "b=", what call (b) writes


@dataclass(frozen=True, slots=True)
class TreeSearchConfig:
    beam_width: int = 2
    expansions: int = 4
    """Continuations sampled per beam node and depth."""
    step_tokens: int = 16
    """Most tokens one call may take (a whole step, or each half with the calculator)."""
    answer_expansions: int = 2
    """Answers written per problem and depth, from distinct won states (thinking ended on the target)."""
    calculator: bool = True
    """Propose "a op b=" and compute the result (forced tokens); False: the model writes whole steps."""
    resample_rounds: int = 0
    """Extra calls per depth that re-sample a node once per duplicate step it proposed (0: keep none)."""
    root_width: int = 1
    """The root is expanded `root_width * expansions` times (Snell et al. 2024 sample beam x expansions
    first steps: the root is one node where the beam will hold many)."""


@dataclass(slots=True)
class _Node:
    prefix: str
    """The completion so far, e.g. "<think>50+25=75" (with the calculator) or "<think>50+25=75,"."""
    pool: list[int]
    won: bool = False


@dataclass(slots=True)
class TreeResult:
    problem_id: str
    solved: bool
    completion: str | None
    """The verified completion, if one was found."""
    gen_tokens: int = 0
    """Generated + forced tokens."""
    forced_tokens: int = 0
    thinking_tokens: int = 0
    prefill_tokens: int = 0
    scorer_tokens: int = 0
    expansions: int = 0
    illegal_steps: int = 0
    duplicate_steps: int = 0
    lost_states: int = 0
    leaves: int = 0
    depth: int = 0
    states: list[str] = field(default_factory=list, repr=False)
    """Prefixes of the states kept in the beam, depth by depth (for a chain: its states in order)."""
    beams: list[_Node] = field(default_factory=list, repr=False)


def step_length_control(cfg: TreeSearchConfig, *, answer_budget: int, tokenizer: Any,
                        stops: str = STEP_SEPARATOR) -> LengthControl:
    """One call of a step: stop at any of the `stops` characters or at `</think>`."""
    close = int(tokenizer.convert_tokens_to_ids(THINK_CLOSE))
    ids = tuple(int(tokenizer.convert_tokens_to_ids(s)) for s in stops)
    return LengthControl(thinking_budget=cfg.step_tokens, answer_budget=answer_budget, think_close_ids=(close,),
                         eos_id=int(tokenizer.eos_token_id), stop_ids=(*ids, close))


def answer_length_control(*, answer_budget: int, tokenizer: Any) -> LengthControl:
    """The answer after `</think>` (already in the prompt): up to `answer_budget` tokens, then EOS."""
    close = tokenizer.convert_tokens_to_ids(THINK_CLOSE)
    return LengthControl(thinking_budget=answer_budget, answer_budget=1, think_close_ids=(int(close),),
                         eos_id=int(tokenizer.eos_token_id))


def _ended(node: _Node, text: str) -> tuple[str, _Node | None]:
    """A continuation that wrote `</think>` after `text`'s step (or bare): won or lost."""
    if not node.won:
        return "lost", None
    return "won", _Node(prefix=node.prefix + text, pool=node.pool, won=True)


def _child(node: _Node, text: str, pool: list[int], target: int) -> tuple[str, _Node | None]:
    nxt = _Node(prefix=node.prefix + text, pool=pool, won=target in pool)
    if len(pool) == 1 and not nxt.won:
        return "lost", None
    return "child", nxt


def _classify(node: _Node, text: str, finish: str, target: int) -> tuple[str, _Node | None]:
    """Whole-step mode: ("won" | "child" | "illegal" | "lost" | "dead", next node) for one continuation."""
    if finish == "length" or not text.endswith((STEP_SEPARATOR, THINK_CLOSE)):
        return "dead", None  # too long, or EOS inside thinking
    closes = text.endswith(THINK_CLOSE)
    step = text.removesuffix(THINK_CLOSE if closes else STEP_SEPARATOR)
    pool = countdown_step(node.pool, step) if step else (list(node.pool) if closes else None)
    if pool is None:
        return "illegal", None
    if closes:
        won = target in pool
        return ("won", _Node(prefix=node.prefix + text, pool=pool, won=True)) if won else ("lost", None)
    return _child(node, text, pool, target)


def classify_head(node: _Node, text: str, finish: str) -> tuple[str, int | None]:
    """Calculator mode, call (a): ("head", a) for `",a op"` with `a` in the pool, ("close", None) for a bare
    `</think>`, ("illegal", None) for an `a` not in the pool, ("dead", None) for anything else."""
    at_root = node.prefix == THINK_OPEN
    if text == THINK_CLOSE:
        return "close", None
    if finish == "length" or not text or text[-1] not in OPS:
        return "dead", None
    body = text if at_root else text.removeprefix(STEP_SEPARATOR)
    m = _HEAD.fullmatch(body)
    if m is None or (not at_root and not text.startswith(STEP_SEPARATOR)):
        return "dead", None
    a = int(m.group(1))
    return ("head", a) if a in node.pool else ("illegal", None)


def _completions(pool: Sequence[int], a: int, op: str) -> list[str]:
    """Every legal step key `"a op b="` that starts with `a op` on this pool."""
    rest = list(pool)
    rest.remove(a)
    return [f"{a}{op}{b}=" for b in dict.fromkeys(rest) if step_result(pool, a, op, b) is not None]


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


class _Expander:
    """Proposes one step for each (problem, node) row and charges every token to the problem's result."""

    def __init__(self, problems: Sequence[Problem], results: list[TreeResult], targets: list[int], *,
                 generate: GenerateFn, tokenizer: Any, cfg: TreeSearchConfig, sampling: SamplingParams,
                 answer_budget: int) -> None:
        self.results, self.targets, self.generate, self.tok = results, targets, generate, tokenizer
        self.cfg, self.sampling = cfg, sampling
        self.prompt_ids = [encode_prompt(tokenizer, p.prompt) for p in problems]
        kw = {"answer_budget": answer_budget, "tokenizer": tokenizer}
        self.whole = step_length_control(cfg, **kw)
        self.head = step_length_control(cfg, stops=OPS, **kw)
        self.tail = step_length_control(cfg, stops="=" + STEP_SEPARATOR, **kw)

    def _call(self, rows: list[tuple[int, str]], rules: LengthControl) -> list[Any]:
        inputs = [self.prompt_ids[i] + _ids(self.tok, prefix) for i, prefix in rows]
        outs = self.generate(inputs, self.sampling, rules)
        for (i, _), inp, c in zip(rows, inputs, outs, strict=True):
            r = self.results[i]
            r.gen_tokens += len(c.token_ids)
            r.thinking_tokens += c.thinking_tokens
            r.prefill_tokens += len(inp)
        return list(outs)

    def propose(self, rows: list[tuple[int, int, _Node]], seen: set[tuple[int, int, str]]
                ) -> list[tuple[str, _Node | None]]:
        """(kind, next node) per (problem, beam index, node) row; kind as in `_classify`, or "duplicate"
        for a step (or `</think>`) that node already proposed (`seen`, updated here). With the
        calculator a duplicate is known at "a op b=", before its result is paid for."""
        def fresh(i: int, j: int, key: str) -> bool:
            if (i, j, key) in seen:
                return False
            seen.add((i, j, key))
            return True

        if not self.cfg.calculator:
            outs = self._call([(i, node.prefix) for i, _, node in rows], self.whole)
            found = [_classify(node, c.text, c.finish_reason, self.targets[i])
                     for (i, _, node), c in zip(rows, outs, strict=True)]
            return [(kind, nxt) if kind in ("illegal", "dead") or fresh(i, j, c.text) else ("duplicate", None)
                    for (i, j, _), (kind, nxt), c in zip(rows, found, outs, strict=True)]
        heads = self._call([(i, node.prefix) for i, _, node in rows], self.head)
        out: list[tuple[str, _Node | None]] = []
        pending: list[int] = []
        for k, ((i, j, node), c) in enumerate(zip(rows, heads, strict=True)):
            kind, a = classify_head(node, c.text, c.finish_reason)
            if kind == "close":
                out.append(_ended(node, c.text) if fresh(i, j, c.text) else ("duplicate", None))
            elif kind == "head" and a is not None and all((i, j, step) in seen for step in
                                                          _completions(node.pool, a, c.text[-1])):
                out.append(("duplicate", None))  # every legal "a op b" was proposed already: stop at "a op"
            else:
                out.append((kind, None))
                if kind == "head":
                    pending.append(k)
        if not pending:
            return out
        tails = self._call([(rows[k][0], rows[k][2].prefix + heads[k].text) for k in pending], self.tail)
        for k, c in zip(pending, tails, strict=True):
            (i, j, node), head = rows[k], heads[k].text
            m, m_head = _TAIL.fullmatch(c.text), _HEAD.fullmatch(head.removeprefix(STEP_SEPARATOR))
            assert m_head is not None  # classify_head accepted it
            result = None if m is None else step_result(node.pool, int(m_head.group(1)), m_head.group(2),
                                                       int(m.group(1)))
            if result is None:
                out[k] = ("illegal" if m is not None else "dead", None)
                continue
            step = head.removeprefix(STEP_SEPARATOR) + c.text
            if not fresh(i, j, step):
                out[k] = ("duplicate", None)
                continue
            self.charge_forced(i, result)
            pool = countdown_step(node.pool, step + result)
            assert pool is not None  # the calculator made it legal
            out[k] = _child(node, head + c.text + result, pool, self.targets[i])
        return out

    def charge_forced(self, i: int, text: str) -> None:
        """Forced tokens (the calculator's result, the `</think>` of a won state) cost like generated ones."""
        forced = len(_ids(self.tok, text))
        r = self.results[i]
        r.gen_tokens += forced
        r.forced_tokens += forced
        r.thinking_tokens += forced

    def answer(self, task: Task, problems: Sequence[Problem], won: dict[int, dict[str, _Node]]) -> None:
        """Write the answer of every won state (one batched call) and verify it."""
        rows = [(i, node.prefix) for i, states in won.items() for node in states.values()]
        if not rows:
            return
        rules = answer_length_control(answer_budget=self.whole.answer_budget, tokenizer=self.tok)
        for (i, prefix), c in zip(rows, self._call(rows, rules), strict=True):
            r = self.results[i]
            r.leaves += 1
            if not r.solved and task.is_correct(prefix + c.text, problems[i].answer):
                r.solved, r.completion = True, prefix + c.text


def beam_search(problems: Sequence[Problem], task: Task, *, generate: GenerateFn, tokenizer: Any,
                scorer: Scorer | None, cfg: TreeSearchConfig, sampling: SamplingParams, answer_budget: int,
                on_depth: Callable[[int, int], None] | None = None) -> list[TreeResult]:
    """Search every problem (batched across problems); one `TreeResult` each, in order."""
    parsed = [parse_countdown_prompt(p.prompt) for p in problems]
    results = [TreeResult(problem_id=p.id, solved=False, completion=None,
                          beams=[_Node(prefix=THINK_OPEN, pool=numbers, won=target in numbers)])
               for p, (numbers, target) in zip(problems, parsed, strict=True)]
    ex = _Expander(problems, results, [t for _, t in parsed], generate=generate, tokenizer=tokenizer, cfg=cfg,
                   sampling=sampling, answer_budget=answer_budget)
    max_depth = max((len(r.beams[0].pool) for r in results), default=0)
    for depth in range(max_depth):
        live = [i for i, r in enumerate(results) if not r.solved and r.beams]
        if not live:
            break
        children, won = _expand(ex, results, live, cfg, depth)
        ex.answer(task, problems, won)
        _select(results, problems, children, scorer, cfg.beam_width)
        if on_depth is not None:
            on_depth(depth + 1, sum(r.solved for r in results))
    for r in results:
        r.beams = []
    return results


def _expand(ex: _Expander, results: list[TreeResult], live: list[int], cfg: TreeSearchConfig, depth: int
            ) -> tuple[dict[int, dict[tuple[int, ...], _Node]], dict[int, dict[str, _Node]]]:
    """One depth: every live beam node's proposals (re-sampled once per duplicate, bounded), sorted into
    children (merged by pool) and won states (to answer); counts charged to each problem's result."""
    children: dict[int, dict[tuple[int, ...], _Node]] = {i: {} for i in live}
    won: dict[int, dict[str, _Node]] = {i: {} for i in live}
    want: dict[tuple[int, int], int] = {}
    for i in live:
        for j, node in enumerate(results[i].beams):
            if cfg.calculator and node.won:  # the target is made: end thinking (one forced token)
                ex.charge_forced(i, THINK_CLOSE)
                if len(won[i]) < cfg.answer_expansions:
                    won[i].setdefault(node.prefix + THINK_CLOSE, replace(node, prefix=node.prefix + THINK_CLOSE))
            else:
                want[(i, j)] = cfg.expansions * (cfg.root_width if depth == 0 else 1)
    seen: set[tuple[int, int, str]] = set()
    for _ in range(1 + cfg.resample_rounds):
        rows = [(i, j) for (i, j), n in want.items() for _ in range(n)]
        if not rows:
            break
        want = {}
        found = ex.propose([(i, j, results[i].beams[j]) for i, j in rows], seen)
        for (i, j), (kind, nxt) in zip(rows, found, strict=True):
            r = results[i]
            r.expansions += 1
            r.depth = depth + 1
            if kind == "duplicate":  # a step this node already proposed: re-sample instead
                r.duplicate_steps += 1
                want[(i, j)] = want.get((i, j), 0) + 1
            elif kind in ("illegal", "dead"):
                r.illegal_steps += 1
            elif kind == "lost":
                r.lost_states += 1
            elif kind == "won" and nxt is not None and len(won[i]) < cfg.answer_expansions:
                won[i].setdefault(nxt.prefix, nxt)
            elif kind == "child" and nxt is not None:
                children[i].setdefault(tuple(sorted(nxt.pool)), nxt)
    return children, won


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
        results[i].states += [t[3].prefix for t in best]


def calc_chains(problems: Sequence[Problem], task: Task, *, n: int, generate: GenerateFn, tokenizer: Any,
                cfg: TreeSearchConfig, sampling: SamplingParams, answer_budget: int
                ) -> tuple[list[ProblemSamples], list[list[TreeResult]]]:
    """n independent chains per problem with the search's calculator and early rejection (a beam of one,
    one expansion, no value, no re-sampling): the `sample+calc` baseline, as `ProblemSamples` for the
    verified-sampling curve, and each chain's `TreeResult` (its states, for value labels)."""
    chain_cfg = replace(cfg, beam_width=1, expansions=1, resample_rounds=0, answer_expansions=1, root_width=1)
    flat = [p for p in problems for _ in range(n)]
    results = beam_search(flat, task, generate=generate, tokenizer=tokenizer, scorer=None, cfg=chain_cfg,
                          sampling=sampling, answer_budget=answer_budget)
    samples, chains = [], []
    for k, p in enumerate(problems):
        group = results[k * n:(k + 1) * n]
        chains.append(group)
        samples.append(ProblemSamples(
            problem_id=p.id, answers=[None] * n, correct=[r.solved for r in group],
            tokens=[r.gen_tokens for r in group], thinking_tokens=[r.thinking_tokens for r in group],
            prompt=p.prompt, reference=p.answer, texts=[r.completion or "" for r in group],
            forced_tokens=[r.forced_tokens for r in group]))
    return samples, chains


class SolverValue:
    """Diagnostic value (see the module docstring): 1.0 if the state's pool can still make the target."""

    name = "solver-oracle"

    def score(self, prompts: Sequence[str], completions: Sequence[str]) -> Scores:
        values = []
        for prompt, prefix in zip(prompts, completions, strict=True):
            values.append(float(solvable_state(prompt, prefix)))
        return Scores(values=values, forward_tokens=[0] * len(values))
