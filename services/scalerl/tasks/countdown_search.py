"""The Countdown state space: legal steps, their enumeration, and an exhaustive shortest solver.

A state is the pool of numbers still available; a step `"a op b=c"` replaces a and b by c, larger
operand first, every result a positive integer. `countdown_step` and `countdown_moves` are pure
functions over pools, so a tree search expands exactly the states the model writes in its
chain of thought; `solve_countdown` produces the gold solutions of `CountdownTask`. `step_result` is
the tree search's calculator; `arithmetic_only_failure` and `solvable_state` read chains of thought
(diagnostics: how sampled chains fail, and the solver's verdict on a search state).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from scalerl.model.tokenizer import THINK_CLOSE, THINK_OPEN

# One step "a op b=c". At most 15 digits a number: int() of a long digit run is slow (and past
# 4300 digits it raises), and no Countdown value comes near.
STEP_PATTERN = re.compile(r"\s*(\d{1,15})\s*([-+*/])\s*(\d{1,15})\s*=\s*(\d{1,15})\s*")
STEP_SEPARATOR = ","
# A prompt "3 7 25 50 -> 125:" or an answer "3 7 25 50 -> 125" (the numbers, then the target).
_PROMPT = re.compile(r"\s*((?:\d+\s+)*\d+)\s*->\s*(\d+)\s*:?\s*")


def parse_countdown_prompt(prompt: str) -> tuple[list[int], int]:
    """`(numbers, target)` from a prompt `"3 7 25 50 -> 125:"` or an answer `"3 7 25 50 -> 125"`."""
    m = _PROMPT.fullmatch(prompt)
    if m is None:
        raise ValueError(f"not a Countdown prompt: {prompt[:80]!r}")
    return [int(x) for x in m.group(1).split()], int(m.group(2))


def apply_op(a: int, op: str, b: int) -> int | None:
    """`a op b` if it is a positive integer (the Countdown rule), else None."""
    if op == "+":
        return a + b
    if op == "*":
        return a * b
    if op == "-":
        return a - b if a > b else None
    if op == "/":
        return a // b if b > 0 and a % b == 0 else None
    return None


def countdown_step(numbers: list[int], step_text: str) -> list[int] | None:
    """The pool after one step `"a op b=c"` (a, b removed, c appended), or None if it is illegal.

    Illegal: not of that form, `a` or `b` not in the pool (a == b needs two copies), a result that
    is not a positive integer, or `c` that is not the result. Pure: `numbers` is not modified.
    """
    m = STEP_PATTERN.fullmatch(step_text)
    if m is None:
        return None
    a, op, b, c = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
    result = apply_op(a, op, b)
    if result is None or result != c:
        return None
    pool = list(numbers)
    for x in (a, b):
        if x not in pool:
            return None
        pool.remove(x)
    return [*pool, c]


def countdown_moves(numbers: list[int]) -> list[tuple[str, list[int]]]:
    """Every legal step from `numbers` as `(step_text, new_pool)`, larger operand first, no repeats."""
    moves, seen = [], set()
    for i in range(len(numbers)):
        for j in range(i + 1, len(numbers)):
            a, b = max(numbers[i], numbers[j]), min(numbers[i], numbers[j])
            rest = numbers[:i] + numbers[i + 1 : j] + numbers[j + 1 :]
            for op in "+-*/":
                c = apply_op(a, op, b)
                step = f"{a}{op}{b}={c}"
                if c is None or step in seen:
                    continue
                seen.add(step)
                moves.append((step, [*rest, c]))
    return moves


def solve_countdown(numbers: list[int], target: int) -> list[str] | None:
    """A shortest list of steps after which `target` is in the pool; None if there is none.

    Exhaustive, over subsets rather than step orders (`_Solver`): subsets of size 2, 3, ... are
    tried in turn, so the first hit uses the fewest numbers, i.e. the fewest steps. `[]` if
    `target` is one of the numbers.
    """
    if target in numbers:
        return []
    solver = _Solver(numbers)
    n = len(numbers)
    for size in range(2, n + 1):
        for mask in range(1, 1 << n):
            if mask.bit_count() == size and (steps := solver.find(mask, target)) is not None:
                return steps
    return None


# A value made from the numbers of a subset, and how: None for a given number, else
# (subset of the first operand, first operand, op, subset of the second operand, second operand).
_Made = tuple[int, int, str, int, int] | None


class _Solver:
    """Reachability over subsets of the numbers (bit masks), the classic Countdown dynamic program.

    `reach(mask)` maps every value that uses *all* numbers of `mask` to one way of making it. Tables
    are built only for subsets of up to n-2 numbers; larger subsets are searched backwards
    (`find`): for each split into a small part and the rest, each value v of the small part fixes
    the few values w the rest would need (t = v+w, v*w, v-w, w-v, v/w, w/v), and the rest is asked
    for w recursively. This keeps 6-number problems fast (the 5-number tables are the costly ones).
    """

    def __init__(self, numbers: list[int]) -> None:
        self.numbers, self.n = numbers, len(numbers)
        self.tables: dict[int, dict[int, _Made]] = {1 << i: {x: None} for i, x in enumerate(numbers)}
        self.memo: dict[tuple[int, int], list[str] | None] = {}

    def splits(self, mask: int) -> list[tuple[int, int]]:
        """Unordered splits of `mask` into two non-empty parts, smaller part first."""
        out, low = [], mask & -mask
        sub = (mask - 1) & mask
        while sub:
            if sub & low:
                rest = mask ^ sub
                out.append((sub, rest) if sub.bit_count() <= rest.bit_count() else (rest, sub))
            sub = (sub - 1) & mask
        return out

    def reach(self, mask: int) -> dict[int, _Made]:
        if mask not in self.tables:
            table: dict[int, _Made] = {}
            for s1, s2 in self.splits(mask):
                for a in self.reach(s1):
                    for b in self.reach(s2):
                        (mx, x), (my, y) = ((s1, a), (s2, b)) if a >= b else ((s2, b), (s1, a))
                        for op in "+-*/":
                            c = apply_op(x, op, y)
                            if c is not None and c not in table:
                                table[c] = (mx, x, op, my, y)
            self.tables[mask] = table
        return self.tables[mask]

    def steps(self, mask: int, value: int) -> list[str]:
        made = self.reach(mask)[value]
        if made is None:
            return []
        mx, x, op, my, y = made
        return [*self.steps(mx, x), *self.steps(my, y), f"{x}{op}{y}={value}"]

    def find(self, mask: int, target: int) -> list[str] | None:
        """Steps that make `target` from exactly the numbers in `mask`, or None."""
        if mask in self.tables or mask.bit_count() <= self.n - 2:
            table = self.reach(mask)
            return self.steps(mask, target) if target in table else None
        key = (mask, target)
        if key not in self.memo:
            self.memo[key] = self._search(mask, target)
        return self.memo[key]

    def _search(self, mask: int, t: int) -> list[str] | None:
        for small, rest in self.splits(mask):
            for v in self.reach(small):
                for w, step in _partners(v, t):
                    found = self.find(rest, w)
                    if found is not None:
                        return [*self.steps(small, v), *found, step]
        return None


def _partners(v: int, t: int) -> list[tuple[int, str]]:
    """Values w with `v op w = t` or `w op v = t` under the Countdown rules, with the step text.

    Steps with a neutral operand (×1, ÷1, or w = t) are left out: they only help if `t` can be
    made from fewer numbers, which `solve_countdown` has already ruled out when it gets here.
    """
    out = []
    if t > v:
        out.append((t - v, f"{max(v, t - v)}+{min(v, t - v)}={t}"))
    if 1 < v < t and t % v == 0:
        out.append((t // v, f"{max(v, t // v)}*{min(v, t // v)}={t}"))
    out.append((t + v, f"{t + v}-{v}={t}"))
    if v > t:
        out.append((v - t, f"{v}-{v - t}={t}"))
    if v > t and v % t == 0:
        out.append((v // t, f"{v}/{v // t}={t}"))
    if v > 1:
        out.append((t * v, f"{t * v}/{v}={t}"))
    return out


def step_result(pool: Sequence[int], a: int, op: str, b: int) -> str | None:
    """The result digits the search feeds after `"a op b="`, or None when the step breaks the rules
    (a or b not in the pool, a == b without two copies, no positive-integer result)."""
    rest = list(pool)
    for x in (a, b):
        if x not in rest:
            return None
        rest.remove(x)
    c = apply_op(a, op, b)
    return None if c is None else str(c)


def arithmetic_only_failure(prompt: str, completion: str) -> bool:
    """True iff a chain's steps are all well formed with available operands (pool updated by the results
    as written) and legal operations, but at least one written result is wrong: a calculator alone would
    have fixed its arithmetic (whether it then reaches the target is another matter)."""
    pool, _ = parse_countdown_prompt(prompt)
    thinking = completion.removeprefix(THINK_OPEN).split(THINK_CLOSE, 1)[0]
    wrong = False
    for step in filter(None, thinking.split(STEP_SEPARATOR)):
        m = re.fullmatch(r"(\d{1,15})([-+*/])(\d{1,15})=(\d{1,15})", step)
        if m is None:
            return False
        a, op, b, c = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
        right = step_result(pool, a, op, b)
        if right is None:
            return False
        wrong |= int(right) != c
        pool = [*pool, c]
        pool.remove(a)
        pool.remove(b)
    return wrong


def solvable_state(prompt: str, prefix: str) -> bool:
    """Whether the exhaustive solver can still make the target from the pool after `prefix`'s steps
    (both "a op b=c," and calculator "a op b=c" prefixes)."""
    pool, target = parse_countdown_prompt(prompt)
    for step in filter(None, prefix.removeprefix(THINK_OPEN).split(THINK_CLOSE, 1)[0].split(STEP_SEPARATOR)):
        pool = countdown_step(pool, step) or []
    return bool(pool) and solve_countdown(pool, target) is not None

