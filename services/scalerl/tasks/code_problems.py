"""Generated Python problems with generated tests: a training set that exists offline.

Each family is a small function specification with parameters (`_FAMILIES`); a problem is a family and
one choice of its parameters (the key `sample_disjoint` draws). Its reference solution is our own code,
run here (trusted) on inputs drawn from a seeded stream to make the tests: `assert candidate(<args>) ==
<expected>`, `TESTS_PER_PROBLEM` of them, HumanEval's `check(candidate)` convention. Prompts are a
signature and a docstring with one worked example, the shape of HumanEval's, so a model trained on these
is evaluated on HumanEval in the same format; `decontaminate` (tasks/code.py) drops any that share a
function name or a 13-word run with an eval problem.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TESTS_PER_PROBLEM = 6


@dataclass(frozen=True)
class _Family:
    name: str  # the function name, with {params}
    signature: str  # the parameter list and return annotation
    doc: str  # the docstring, with {params}
    body: str  # the reference body (one expression after `return`), with {params}
    params: dict[str, tuple[Any, ...]]  # each parameter's allowed values
    inputs: Callable[[random.Random], tuple[Any, ...]]  # one call's arguments


def _ints(rng: random.Random, lo: int = -20, hi: int = 50, n: tuple[int, int] = (0, 9)) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(rng.randint(*n))]


def _word(rng: random.Random) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 7)))


def _text(rng: random.Random) -> str:
    return " ".join(_word(rng) for _ in range(rng.randint(0, 6)))


_FAMILIES: tuple[_Family, ...] = (
    _Family("sum_multiples_of_{k}", "(xs: list[int]) -> int",
            "Return the sum of the elements of xs that are divisible by {k}.",
            "sum(x for x in xs if x % {k} == 0)", {"k": tuple(range(2, 13))}, lambda r: (_ints(r),)),
    _Family("count_above_{t}", "(xs: list[int]) -> int",
            "Return how many elements of xs are strictly greater than {t}.",
            "sum(1 for x in xs if x > {t})", {"t": tuple(range(-5, 31))}, lambda r: (_ints(r),)),
    _Family("scale_and_shift_{a}_{b}", "(xs: list[int]) -> list[int]",
            "Return a new list with every element x of xs replaced by {a} * x + {b}.",
            "[{a} * x + {b} for x in xs]", {"a": tuple(range(2, 8)), "b": tuple(range(-5, 6))},
            lambda r: (_ints(r),)),
    _Family("clamp_{lo}_{hi}", "(xs: list[int]) -> list[int]",
            "Return xs with every element below {lo} raised to {lo} and every element above {hi} lowered to {hi}.",
            "[min(max(x, {lo}), {hi}) for x in xs]", {"lo": tuple(range(-10, 1, 2)), "hi": tuple(range(5, 40, 5))},
            lambda r: (_ints(r),)),
    _Family("every_{k}th_element", "(xs: list[int]) -> list[int]",
            "Return the elements of xs at positions 0, {k}, 2*{k}, ... (every {k}th element, starting with the first).",
            "xs[::{k}]", {"k": tuple(range(2, 7))}, lambda r: (_ints(r, n=(0, 15)),)),
    _Family("repeat_with_sep_{k}", "(s: str, sep: str) -> str",
            "Return s repeated {k} times, with sep between consecutive copies.",
            "sep.join([s] * {k})", {"k": tuple(range(2, 7))}, lambda r: (_word(r), r.choice(["-", ", ", "", "|"]))),
    _Family("count_letter_{c}", "(s: str) -> int",
            "Return how many times the letter '{c}' occurs in s, upper or lower case.",
            "s.lower().count('{c}')", {"c": tuple("aeiostr")},
            lambda r: (r.choice([_text(r), _text(r).upper(), _text(r).title()]),)),
    _Family("words_longer_than_{n}", "(s: str) -> list[str]",
            "Return the words of s (separated by spaces) that have more than {n} letters, in order.",
            "[w for w in s.split() if len(w) > {n}]", {"n": tuple(range(1, 6))}, lambda r: (_text(r),)),
    _Family("shift_letters_{k}", "(s: str) -> str",
            "Return s with every lowercase letter moved {k} places forward in the alphabet, wrapping from 'z' "
            "to 'a'; other characters stay as they are.",
            "''.join(chr((ord(ch) - 97 + {k}) % 26 + 97) if 'a' <= ch <= 'z' else ch for ch in s)",
            {"k": tuple(range(1, 26))}, lambda r: (_text(r),)),
    _Family("is_multiple_of_{a}_or_{b}", "(n: int) -> bool",
            "Return True if n is divisible by {a} or by {b}, else False.",
            "n % {a} == 0 or n % {b} == 0", {"a": tuple(range(2, 10)), "b": tuple(range(10, 16))},
            lambda r: (r.randint(-100, 300),)),
    _Family("digit_sum_times_{k}", "(n: int) -> int",
            "Return {k} times the sum of the decimal digits of the non-negative integer n.",
            "{k} * sum(int(d) for d in str(n))", {"k": tuple(range(1, 10))}, lambda r: (r.randint(0, 10**6),)),
    _Family("running_total_from_{s}", "(xs: list[int]) -> list[int]",
            "Return the running totals of xs, starting from {s}: the i-th result is {s} plus the sum of xs[0..i].",
            "[{s} + sum(xs[:i + 1]) for i in range(len(xs))]", {"s": tuple(range(-3, 11))}, lambda r: (_ints(r),)),
    _Family("kth_largest_{k}", "(xs: list[int]) -> int | None",
            "Return the {k}th largest element of xs (1 is the largest; equal elements count separately), or None "
            "when xs has fewer than {k} elements.",
            "sorted(xs, reverse=True)[{k} - 1] if len(xs) >= {k} else None", {"k": tuple(range(1, 5))},
            lambda r: (_ints(r),)),
    _Family("pairs_summing_to_{t}", "(xs: list[int]) -> int",
            "Return how many pairs of positions i < j have xs[i] + xs[j] == {t}.",
            "sum(1 for i in range(len(xs)) for j in range(i + 1, len(xs)) if xs[i] + xs[j] == {t})",
            {"t": tuple(range(0, 21))}, lambda r: (_ints(r, 0, 20, (0, 10)),)),
)


@dataclass(frozen=True)
class GeneratedProblem:
    """One generated problem: the code the model completes, its tests, the function name and its solution."""

    key: tuple[int, tuple[Any, ...]]
    prelude: str
    tests: str
    entry_point: str
    solution: str  # the whole reference function


def problem_space() -> int:
    """How many distinct problems the families hold."""
    total = 0
    for f in _FAMILIES:
        n = 1
        for values in f.params.values():
            n *= len(values)
        total += n
    return total


def draw_key(rng: random.Random) -> tuple[int, tuple[Any, ...]]:
    """One problem key: a family (uniformly) and one value of each of its parameters."""
    i = rng.randrange(len(_FAMILIES))
    return i, tuple(rng.choice(v) for v in _FAMILIES[i].params.values())


def build(key: tuple[int, tuple[Any, ...]]) -> GeneratedProblem:
    """The problem of `key`, its tests drawn from a stream seeded by the key (the same on every machine)."""
    i, values = key
    f = _FAMILIES[i]
    p = dict(zip(f.params, values, strict=True))
    name = f.name.format(**{k: str(v).replace("-", "minus") for k, v in p.items()})  # clamp_minus2_15
    body = f.body.format(**p)
    source = f"def {name}{f.signature}:\n    return {body}\n"
    scope: dict[str, Any] = {}
    exec(compile(source, f"<generated {name}>", "exec"), scope)  # our own reference code, not a model's
    fn = scope[name]
    rng = random.Random(f"code-tests/{name}")
    calls = [f.inputs(rng) for _ in range(TESTS_PER_PROBLEM + 1)]
    example, calls = calls[0], calls[1:]
    args = ", ".join(map(repr, example))
    doc = f.doc.format(**p)
    prelude = (f"def {name}{f.signature}:\n    \"\"\"{doc}\n    >>> {name}({args})\n    {fn(*example)!r}\n"
               f"    \"\"\"\n")
    asserts = "".join(f"    assert candidate({', '.join(map(repr, c))}) == {fn(*c)!r}\n" for c in calls)
    return GeneratedProblem(key, prelude, f"def check(candidate):\n{asserts}", name, source)
