"""Addition and multiplication with a digit-by-digit chain of thought a tiny model can learn.

Both tasks write the computation the way it is done on paper, least-significant digit first, with
the carry explicit, so every output character depends only on a few recent characters (what a
character-level transformer with a few layers can learn from SFT alone, before RL):

    addition        357+468=   <think>7+8+0=15,5+6+1=12,3+4+1=8</think>825
    multiplication  357*8=     <think>7*8+0=56,5*8+5=45,3*8+4=28</think>2856
    long            357*48=    <think>357*8=7*8+0=56,5*8+5=45,3*8+4=28=2856;357*4=7*4+0=28,5*4+2=22,
                               3*4+2=14=1428;2856+14280=6+0+0=6,5+8+0=13,8+2+1=11,2+4+1=7,0+1+0=1=17136
                               </think>17136                                   (one line, no spaces)

Addition has one step "c+d+carry=sum" per digit position of the longer operand (a missing digit
is 0). Multiplication has one step "c*m+carry=value" per digit of the first operand. The final
carry, if any, only appears in the answer: the answer is that carry followed by the last digit of
every step, read in reverse.

Long multiplication (`multiplier_digits` ≥ 2) is done on paper too, one digit of the multiplier at a
time from the units up: the partial product's chain `a*d=steps=value`, then (from the second digit on)
the running sum plus that partial shifted by its place, `sum+shifted=steps=value`, with the addition's
steps; the parts are separated by ";". Each part writes its value forward, so a later part reads its
operands nearby. 4 digits by 3 are ~300 characters of thought: the computation a tool does in one call.

Design choices:

1. Operands are uniform in [0, 10**digits), so they have *up to* `digits` digits (no leading
   zeros), as the quickstart has always drawn them.
2. Multiplication's second operand is one digit in 2..9 (0 and 1 are trivial): the "harder family"
   is longer carries (up to 8) and a different table, not a second partial-product stage. With
   `multiplier_digits` n ≥ 2 it is uniform over the n-digit numbers, [10**(n-1), 10**n).
3. `is_correct` compares integers: spaces are ignored, anything that is not an optional sign
   followed by at most `_MAX_ANSWER_DIGITS` digits is wrong.
4. Chat phrasing (`phrasing="chat"`, for an instruct model): "What is 357 + 468? End your reply with
   'Answer: <number>'." (multiplication: "357 * 8"); the answer is the first integer of the final
   `Answer:` line or `\boxed{}` (`final_answer_text`), else the **last integer** of the reply (after
   `</think>` if any); thousands separators are dropped. No gold solution (no SFT for instruct models).
"""

from __future__ import annotations

import random
import re
from abc import abstractmethod
from collections.abc import Sequence

from scalerl.model.tokenizer import THINK_CLOSE, THINK_OPEN
from scalerl.tasks.base import (
    Phrasing,
    Problem,
    Split,
    Task,
    answer_after_think,
    answer_region,
    check_phrasing,
    check_range,
    check_split,
    final_answer_text,
    sample_disjoint,
    tool_call,
)

_INTEGER = re.compile(r"[+-]?\d+")
_NUMBER_IN_TEXT = re.compile(r"-?\d[\d,]*")
_MAX_ANSWER_DIGITS = 64  # int() of a huge string is quadratic; no answer here has more than 25 digits
MAX_DIGITS = 12
MAX_MULTIPLIER_DIGITS = 6


def parse_integer(text: str | None) -> int | None:
    """`text` as an integer (whitespace ignored), or None if it is not one."""
    if text is None:
        return None
    compact = "".join(text.split())
    if len(compact) > _MAX_ANSWER_DIGITS + 1 or not _INTEGER.fullmatch(compact):
        return None
    return int(compact)


def chat_integer(completion: str) -> int | None:
    """The integer a free-text reply gives as its answer (rule 4 of the module docstring)."""
    stated = final_answer_text(completion)
    found = _NUMBER_IN_TEXT.findall(stated) if stated else []
    if not found:
        found = _NUMBER_IN_TEXT.findall(answer_region(completion))[-1:]
    return parse_integer(found[0].replace(",", "").rstrip(",")) if found else None


def _addition_steps(a: int, b: int) -> str:
    """`c+d+carry=sum` per digit position of a + b, from the units up, comma-separated."""
    da, db = str(a)[::-1], str(b)[::-1]
    steps, carry = [], 0
    for i in range(max(len(da), len(db))):
        c = int(da[i]) if i < len(da) else 0
        d = int(db[i]) if i < len(db) else 0
        total = c + d + carry
        steps.append(f"{c}+{d}+{carry}={total}")
        carry = total // 10
    return ",".join(steps)


def _times_digit_steps(a: int, m: int) -> str:
    """`c*m+carry=value` per digit of a (m one digit), from the units up, comma-separated."""
    steps, carry = [], 0
    for ch in reversed(str(a)):
        value = int(ch) * m + carry
        steps.append(f"{ch}*{m}+{carry}={value}")
        carry = value // 10
    return ",".join(steps)


def addition_solution(a: int, b: int) -> str:
    """Gold completion for `a+b=`: `<think>` steps `c+d+carry=sum` from the units up `</think>` + sum."""
    return f"<think>{_addition_steps(a, b)}</think>{a + b}"


def multiplication_solution(a: int, m: int) -> str:
    """Gold completion for `a*m=`: with m one digit, steps `c*m+carry=value` from the units up + product;
    with more, long multiplication (module docstring): per multiplier digit from the units up, the partial
    product `a*d=steps=value`, then the running sum plus it shifted, `sum+shifted=steps=value`; ";" between."""
    if m < 10:
        return f"<think>{_times_digit_steps(a, m)}</think>{a * m}"
    parts, total = [], 0
    for place, ch in enumerate(reversed(str(m))):
        d = int(ch)
        parts.append(f"{a}*{d}={_times_digit_steps(a, d)}={a * d}")
        shifted = a * d * 10**place
        if place:
            parts.append(f"{total}+{shifted}={_addition_steps(total, shifted)}={total + shifted}")
        total += shifted
    return f"<think>{';'.join(parts)}</think>{a * m}"


class _IntegerTask(Task):
    """Shared machinery: seeded disjoint sampling of operand pairs and integer verification."""

    prefix: str
    op: str
    grading_is_bounded = True  # an integer compare (CPython refuses int() of more than 4300 digits)

    def __init__(self, *, digits: int, seed: int, train_size: int, eval_size: int,
                 phrasing: Phrasing = "symbolic") -> None:
        self.digits = check_range("digits", digits, 1, MAX_DIGITS)
        self.phrasing = check_phrasing(phrasing)
        self.seed, self.train_size, self.eval_size = seed, train_size, eval_size
        self.name = f"{self.prefix}{digits}"
        self._cache: dict[Split, list[Problem]] | None = None

    @abstractmethod
    def _draw(self, rng: random.Random) -> tuple[int, int]:
        """One random operand pair."""

    @abstractmethod
    def _solution(self, a: int, b: int) -> str:
        """Gold completion for the pair; its text after `</think>` is the answer."""

    @property
    def has_solutions(self) -> bool:
        return self.phrasing == "symbolic"  # chat phrasing is for instruct models: no gold solution

    def problems(self, split: Split) -> list[Problem]:
        split = check_split(split)
        if self._cache is None:
            train, eval_ = sample_disjoint(self._draw, stream=f"{self.name}/{self.seed}",
                                           train_size=self.train_size, eval_size=self.eval_size)
            self._cache = {"train": self._build("train", train), "eval": self._build("eval", eval_)}
        return list(self._cache[split])

    def _build(self, split: Split, pairs: list[tuple[int, int]]) -> list[Problem]:
        problems = []
        chat = self.phrasing == "chat"
        for i, (a, b) in enumerate(pairs):
            solution = self._solution(a, b)
            answer = solution.rpartition("</think>")[2]
            prompt = (f"What is {a} {self.op} {b}? End your reply with 'Answer: <number>'." if chat
                      else f"{a}{self.op}{b}=")
            problems.append(Problem(id=f"{self.name}-{split}-{i:06d}", prompt=prompt, answer=answer,
                                    solution="" if chat else solution))
        return problems

    def tool_demonstration(self, problem: Problem, tools: Sequence[str]) -> list[str] | None:
        """Symbolic phrasing: ask the calculator for the prompt's expression (else print it with python),
        then answer with what it says: `<think><tool name="calculator">\\n357+468\\n</tool>` ·
        `</think>825`, the tool's answer between the two turns."""
        if self.phrasing == "chat":
            return None  # instruct models get no gold solution, with tools or without
        expression = problem.prompt.removesuffix("=")
        if "calculator" in tools:
            call = tool_call("calculator", expression)
        elif "python" in tools:
            call = tool_call("python", f"print({expression})")
        else:
            return None
        return [f"{THINK_OPEN}{call}", f"{THINK_CLOSE}{problem.answer}"]

    def extract_answer(self, completion: str) -> str | None:
        if self.phrasing == "chat":
            got = chat_integer(completion)
            return None if got is None else str(got)
        return answer_after_think(completion)

    def is_correct(self, completion: str, answer: str) -> bool:
        got = chat_integer(completion) if self.phrasing == "chat" else parse_integer(answer_after_think(completion))
        want = parse_integer(answer)
        return got is not None and got == want


class AdditionTask(_IntegerTask):
    """`a+b=` with a, b uniform in [0, 10**digits); see the module docstring for the CoT."""

    prefix, op = "add", "+"

    def _draw(self, rng: random.Random) -> tuple[int, int]:
        hi = 10**self.digits
        return rng.randrange(hi), rng.randrange(hi)

    def _solution(self, a: int, b: int) -> str:
        return addition_solution(a, b)


class MultiplicationTask(_IntegerTask):
    """`a*m=` with a uniform in [0, 10**digits) and m in 2..9, or with `multiplier_digits` n ≥ 2 uniform
    over the n-digit numbers (name `mul{digits}x{n}`); see the module docstring for the CoT."""

    prefix, op = "mul", "*"

    def __init__(self, *, digits: int, seed: int, train_size: int, eval_size: int,
                 phrasing: Phrasing = "symbolic", multiplier_digits: int = 1) -> None:
        super().__init__(digits=digits, seed=seed, train_size=train_size, eval_size=eval_size, phrasing=phrasing)
        self.multiplier_digits = check_range("multiplier_digits", multiplier_digits, 1, MAX_MULTIPLIER_DIGITS)
        if multiplier_digits > 1:
            self.name = f"{self.prefix}{digits}x{multiplier_digits}"

    def _draw(self, rng: random.Random) -> tuple[int, int]:
        if self.multiplier_digits == 1:
            return rng.randrange(10**self.digits), rng.randrange(2, 10)
        n = self.multiplier_digits
        return rng.randrange(10**self.digits), rng.randrange(10 ** (n - 1), 10**n)

    def _solution(self, a: int, b: int) -> str:
        return multiplication_solution(a, b)
