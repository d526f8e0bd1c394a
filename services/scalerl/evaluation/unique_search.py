"""Tree search without replacement over the policy's Countdown steps (`scalerl eval --tree-method unique`).

Independent sampling pays again for every chain it has already drawn: a policy whose first steps are
a handful of favourites draws the same few chains over and over. This search keeps every token it has
generated in one tree per problem (a trie over tokens, with the step rules of `tree_search`) and draws
each new chain *without replacement* (Shi et al. 2020, "Incremental Sampling Without Replacement for
Sequence Models"): at a node, token t is drawn with probability proportional to the policy's
probability mass still unexplored below t. A finished chain (verified, lost, illegal, malformed) takes
its probability mass out of every ancestor, so it is never drawn again, and the next chain shares the
prefix it has in common with earlier ones for free. Chains come out in the order the policy would
sample them, minus the repeats: the same distribution as sampling, conditioned on "not seen yet".

Step rules (the same as `tree_search`'s calculator and `calc_chains`, so the baselines differ only in
the search): the model writes `a op` (an `a` not in the pool ends the chain: illegal), then `b=` (a `b`
not in the pool, or no positive-integer result: illegal); the result's digits are forced, a pool
holding the target forces `</think>`, then the model writes the answer, ended by EOS, and the task's
verifier checks it (it needs the prompt only). A `</think>` on a pool without the target, or one
number left that is not the target, is lost; any other token where the rules expect a digit, an
operator, "=" or "," is malformed. A verified answer solves the problem and ends its search.

Value (optional): each new state (a step's result written, thinking not over) is rated by a `Scorer`.
A state rated below `prune_below` is dropped with its whole subtree (its mass taken out as if it were
a finished chain). With `value_weight` β > 0, later draws weigh a state's unexplored mass by v^β (and
by its ancestor states' factors): still without replacement, but the order favours states the value
likes (the first visit to a state is drawn by the policy alone: its value is not known before).

Cost: every edge of the tree is one token, generated or forced, counted once however many chains pass
through it (the search keeps the tree, as a serving engine's prefix cache keeps the keys and values).
`next_probs` is called once per node that gets a child, on its whole prefix: our torch engine keeps no
per-node cache and re-reads it, reported as prefill. Memory: one next-token distribution (V floats)
per such node, fine for the character vocabulary; a large vocabulary would want a truncated store.
The search is anytime and its draws do not depend on the budget, so one run to the largest budget
gives the accuracy at every smaller one: a problem counts as solved at budget b if its verified answer
came within b tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scalerl.evaluation.scorer import Scorer
from scalerl.generator.role import encode_prompt
from scalerl.model.tokenizer import THINK_CLOSE, THINK_OPEN
from scalerl.tasks import Problem, Task, parse_countdown_prompt, step_result
from scalerl.tasks.countdown_search import STEP_SEPARATOR

NextProbsFn = Callable[[list[list[int]]], np.ndarray]
"""Prefix ids (prompt + tokens so far), one row each -> the next-token distribution [B, V]."""

OPS = "+-*/"
EXHAUSTED = 1e-12
"""A node whose unexplored mass fell below this fraction of its own probability is done (rounding)."""
VALUE_FLOOR = 1e-3
"""Values below this weigh like it (`value_weight`): a state rated 0 is put last, not removed."""


@dataclass(frozen=True, slots=True)
class UniqueSearchConfig:
    budget: int
    """Tokens (generated + forced) per problem after which its search stops."""
    answer_budget: int
    """Most answer tokens after `</think>`; a longer answer is malformed."""
    max_digits: int = 6
    """Most digits of an operand; more is malformed."""
    prune_below: float | None = None
    """Drop states the value rates below this (None: keep every state)."""
    value_weight: float = 0.0
    """β: weigh each state's unexplored mass by value^β in later draws (0: the policy alone)."""
    batch_rows: int = 1024
    """Most prefixes per `next_probs` call."""
    seed: int = 0

    @property
    def rates_states(self) -> bool:
        """Whether new states wait for the value (pruning or weighing)."""
        return self.prune_below is not None or self.value_weight > 0


@dataclass(slots=True, eq=False)
class _Node:
    parent: _Node | None
    token: int
    """The edge into this node (-1 at the root)."""
    reach: float
    """Probability of the path from the root."""
    mass: float
    """`reach` minus the probability of the finished chains below."""
    wmass: float
    """`mass` with each state's value factor applied below it: what the draw weighs."""
    phase: str
    """"start" (a step begins), "a"/"b" (operand digits), "after" (a result written), "forced",
    "answer", or "leaf"."""
    pool: tuple[int, ...]
    wfactor: float = 1.0
    """Product of the value factors of the states on the path (1 without `value_weight`)."""
    digits: str = ""
    a: int = 0
    op: str = ""
    forced: tuple[int, ...] = ()
    """Tokens that must follow, in order (the calculator's digits, `</think>`)."""
    answer_tokens: int = 0
    probs: np.ndarray | None = None
    value: float | None = None
    kids: dict[int, _Node] = field(default_factory=dict)


@dataclass(slots=True)
class UniqueResult:
    problem_id: str
    solved_at: int | None = None
    """Tokens spent when the verified answer was written (None: not solved within the budget)."""
    completion: str | None = None
    gen_tokens: int = 0
    forced_tokens: int = 0
    prefill_tokens: int = 0
    scorer_tokens: int = 0
    chains: int = 0
    """Finished chains: verified, wrong answer, lost, illegal, malformed, pruned."""
    outcomes: dict[str, int] = field(default_factory=dict)
    exhausted: bool = False
    """The whole tree was explored before the budget ran out."""

    def solved_by(self, budget: int) -> bool:
        """Whether the search stopped at `budget` tokens has the verified answer."""
        return self.solved_at is not None and self.solved_at <= budget

    def tokens_at(self, budget: int) -> float:
        """Tokens this problem's search spends when stopped at `budget`."""
        if self.solved_at is not None and self.solved_at <= budget:
            return float(self.solved_at)
        return float(min(self.gen_tokens, budget))


class _Search:
    """One problem's tree."""

    def __init__(self, problem: Problem, task: Task, tok: Any, cfg: UniqueSearchConfig,
                 rng: np.random.Generator, ids: dict[str, int]) -> None:
        numbers, self.target = parse_countdown_prompt(problem.prompt)
        self.problem, self.task, self.tok, self.cfg, self.rng, self.ids = problem, task, tok, cfg, rng, ids
        self.prompt_ids = [*encode_prompt(tok, problem.prompt), ids[THINK_OPEN]]
        self.root = _Node(parent=None, token=-1, reach=1.0, mass=1.0, wmass=1.0, phase="start",
                          pool=tuple(numbers))
        self.result = UniqueResult(problem_id=problem.id)
        self.cursor = self.root
        """Where the chain being drawn waits for the model or the value."""
        self._enter_pool(self.root)

    # -- the rules -------------------------------------------------------------------------------------
    def _enter_pool(self, node: _Node) -> None:
        """A node whose pool was just made: won (force `</think>`), lost, or a state to continue."""
        if self.target in node.pool:
            node.phase, node.forced = "forced", (self.ids[THINK_CLOSE],)
        elif len(node.pool) == 1:
            self._finish(node, "lost")
        elif node.parent is not None:
            node.phase = "after"

    def _child(self, node: _Node, t: int) -> _Node:
        """The node after token t (charged to the budget), its phase set by the rules; a chain the token
        ends is finished here."""
        p = 1.0 if node.forced else float(node.probs[t])  # type: ignore[index]
        kid = _Node(parent=node, token=t, reach=node.reach * p, mass=node.reach * p,
                    wmass=node.wfactor * node.reach * p, wfactor=node.wfactor, phase=node.phase,
                    pool=node.pool, digits=node.digits, a=node.a, op=node.op, forced=node.forced[1:],
                    answer_tokens=node.answer_tokens)
        node.kids[t] = kid
        r = self.result
        r.gen_tokens += 1
        if node.forced:
            r.forced_tokens += 1
            if kid.forced:
                return kid
            if t == self.ids[THINK_CLOSE]:
                kid.phase = "answer"
            else:
                self._enter_pool(kid)
            return kid
        if node.phase == "answer":
            if t == self.ids["eos"]:
                self._finish_answer(kid)
            elif node.answer_tokens + 1 >= self.cfg.answer_budget:
                self._finish(kid, "malformed")
            else:
                kid.answer_tokens += 1
        else:
            self._step_token(node, kid, t)
        return kid

    def _step_token(self, node: _Node, kid: _Node, t: int) -> None:
        """Thinking: token t after `node` on the way through `a op b=`, "," or `</think>`."""
        ch = self.tok.convert_ids_to_tokens(t)
        digit = len(ch) == 1 and ch.isdigit()
        if digit and node.phase in ("start", "a", "b"):
            kid.phase, kid.digits = ("b" if node.phase == "b" else "a"), node.digits + ch
            if len(kid.digits) > self.cfg.max_digits:
                self._finish(kid, "malformed")
        elif node.phase == "a" and ch in OPS and node.digits:
            a = int(node.digits)
            if a in node.pool:
                kid.phase, kid.a, kid.op, kid.digits = "b", a, ch, ""
            else:
                self._finish(kid, "illegal")
        elif node.phase == "b" and ch == "=" and node.digits:
            self._calculate(node, kid, int(node.digits))
        elif node.phase == "after" and ch == STEP_SEPARATOR:
            kid.phase = "start"
        elif node.phase in ("start", "after") and t == self.ids[THINK_CLOSE]:
            self._finish(kid, "lost")  # a won pool forces `</think>`: a sampled one gives up
        else:
            self._finish(kid, "malformed")

    def _calculate(self, node: _Node, kid: _Node, b: int) -> None:
        """`a op b=` written: illegal, or the new pool with the result's digits to force."""
        result = step_result(node.pool, node.a, node.op, b)
        if result is None:
            self._finish(kid, "illegal")
            return
        rest = list(node.pool)
        rest.remove(node.a)
        rest.remove(b)
        kid.pool, kid.digits = (*rest, int(result)), ""
        kid.phase, kid.forced = "forced", tuple(int(self.tok.convert_tokens_to_ids(c)) for c in result)

    def _finish_answer(self, leaf: _Node) -> None:
        text = self.text(leaf.parent)  # type: ignore[arg-type]
        ok = self.task.is_correct(text, self.problem.answer)
        self._finish(leaf, "verified" if ok else "wrong_answer")
        if ok:
            self.result.solved_at, self.result.completion = self.result.gen_tokens, text

    def _finish(self, leaf: _Node, outcome: str) -> None:
        """A finished chain: its remaining mass leaves every ancestor, so it is never drawn again."""
        leaf.phase, gone, wgone = "leaf", leaf.mass, leaf.wmass
        node: _Node | None = leaf
        while node is not None:
            node.mass -= gone
            node.wmass -= wgone
            node = node.parent
        r = self.result
        r.chains += 1
        r.outcomes[outcome] = r.outcomes.get(outcome, 0) + 1

    # -- the draw --------------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        r = self.result
        if self.root.mass <= EXHAUSTED * self.root.reach:
            r.exhausted = True
        return r.solved_at is not None or r.exhausted or r.gen_tokens >= self.cfg.budget

    def awaits_value(self, node: _Node) -> bool:
        """A new state the value must rate before the draw goes on below it."""
        return self.cfg.rates_states and node.phase == "after" and node.value is None

    def descend(self) -> _Node | None:
        """Draw chains until one reaches a node the model (or the value) must see first, and return it:
        the next call goes on from there, so every chain is one whole draw from the root (restarting
        at the root instead would favour chains through nodes already seen). None: the search is over."""
        node = self.cursor
        while not self.done:
            if node.phase == "leaf":
                node = self.root
                continue
            if self.awaits_value(node):
                break
            if not node.forced and node.probs is None:
                break
            t = self._draw(node)
            if t is None:  # rounding left a little mass: close the node
                self._finish(node, "rounding")
                node = self.root
                continue
            node = node.kids.get(t) or self._child(node, t)
        else:
            return None
        self.cursor = node
        return node

    def rate(self, state: _Node, value: float) -> None:
        """A new state's value: prune it, or (with `value_weight`) scale its weighed mass by value^β."""
        state.value = value
        if self.cfg.prune_below is not None and value < self.cfg.prune_below:
            self._finish(state, "pruned")
            return
        if self.cfg.value_weight > 0:
            factor = max(value, VALUE_FLOOR) ** self.cfg.value_weight
            delta = state.wmass * (factor - 1.0)
            state.wfactor *= factor
            node: _Node | None = state
            while node is not None:
                node.wmass += delta
                node = node.parent

    def _draw(self, node: _Node) -> int | None:
        if node.forced:
            return node.forced[0]
        assert node.probs is not None
        if node.mass <= EXHAUSTED * node.reach:
            return None
        w: np.ndarray = node.probs * (node.reach * node.wfactor)  # weighed unexplored mass below each token
        for t, kid in node.kids.items():
            w[t] = max(kid.wmass, 0.0)
        total = float(w.sum())
        if total <= 0.0:
            return None
        pick = int(np.searchsorted(np.cumsum(w), self.rng.random() * total, side="right"))
        return min(pick, len(w) - 1)

    def path(self, node: _Node) -> list[int]:
        out = []
        while node.parent is not None:
            out.append(node.token)
            node = node.parent
        return out[::-1]

    def text(self, node: _Node) -> str:
        return THINK_OPEN + str(self.tok.decode(self.path(node), skip_special_tokens=False))


def unique_search(problems: Sequence[Problem], task: Task, *, next_probs: NextProbsFn, tokenizer: Any,
                  cfg: UniqueSearchConfig, value: Scorer | None = None,
                  on_round: Callable[[int, int], None] | None = None) -> list[UniqueResult]:
    """Search every problem (batched across problems: one `next_probs` call per round serves one node
    of each live problem); one `UniqueResult` each, in order."""
    if cfg.rates_states and value is None:
        raise ValueError("prune_below and value_weight need a value (a Scorer)")
    ids = {s: int(tokenizer.convert_tokens_to_ids(s)) for s in (THINK_OPEN, THINK_CLOSE)}
    ids["eos"] = int(tokenizer.eos_token_id)
    rng = np.random.default_rng(cfg.seed)
    searches = [_Search(p, task, tokenizer, cfg, rng, ids) for p in problems]
    rounds = 0
    while True:
        wants = [(s, n) for s in searches if (n := s.descend()) is not None]
        if not wants:
            break
        rated = [(s, n) for s, n in wants if s.awaits_value(n)]
        if rated:
            assert value is not None
            scored = value.score([s.problem.prompt for s, _ in rated], [s.text(n) for s, n in rated])
            for (s, n), v, k in zip(rated, scored.values, scored.forward_tokens, strict=True):
                s.result.scorer_tokens += k
                s.rate(n, float(v))
        todo = [(s, n) for s, n in wants if n.probs is None and n.phase != "leaf" and not s.awaits_value(n)]
        for start in range(0, len(todo), cfg.batch_rows):
            part = todo[start:start + cfg.batch_rows]
            rows = [s.prompt_ids + s.path(n) for s, n in part]
            probs = next_probs(rows)
            for (s, n), row, p in zip(part, rows, probs, strict=True):
                n.probs = np.asarray(p, dtype=np.float64)
                s.result.prefill_tokens += len(row)
        rounds += 1
        if on_round is not None:
            on_round(rounds, sum(s.result.solved_at is not None for s in searches))
    return [s.result for s in searches]


def accuracy_at(results: Sequence[UniqueResult], budget: int) -> tuple[float, float]:
    """(fraction solved, mean tokens spent per problem) with every search stopped at `budget` tokens."""
    n = max(1, len(results))
    solved = sum(r.solved_by(budget) for r in results)
    return solved / n, sum(r.tokens_at(budget) for r in results) / n
