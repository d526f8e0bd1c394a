"""Countdown: solver (against a naive reference), steps, expressions, safe verification, generation."""

from __future__ import annotations

import random
from itertools import combinations

import pytest

from cpu_budget import cpu_budget
from scalerl.tasks import (
    CountdownTask,
    build_task,
    check_countdown_answer,
    countdown_moves,
    countdown_step,
    parse_countdown_prompt,
    solve_countdown,
    steps_to_expression,
)


def naive_min_steps(numbers: list[int], target: int) -> int | None:
    """Breadth-first over pools with every pair and op written out by hand: fewest steps or None."""
    frontier, steps = [tuple(numbers)], 0
    while frontier:
        if any(target in pool for pool in frontier):
            return steps
        nxt = set()
        for pool in frontier:
            for i, j in combinations(range(len(pool)), 2):
                a, b = max(pool[i], pool[j]), min(pool[i], pool[j])
                rest = [x for k, x in enumerate(pool) if k not in (i, j)]
                results = [a + b, a * b] + ([a - b] if a > b else []) + ([a // b] if a % b == 0 else [])
                nxt.update(tuple(sorted([*rest, c])) for c in results)
        frontier, steps = list(nxt), steps + 1
    return None


def replay(numbers: list[int], steps: list[str]) -> list[int]:
    pool = list(numbers)
    for step in steps:
        new = countdown_step(pool, step)
        assert new is not None, (pool, step)
        pool = new
    return pool


def test_solver_is_exhaustive_and_shortest() -> None:
    rng = random.Random(0)
    for _ in range(300):
        numbers = [rng.randint(1, 12) for _ in range(rng.randint(3, 4))]
        target = rng.randint(1, 120)
        expected = naive_min_steps(numbers, target)
        steps = solve_countdown(numbers, target)
        if expected is None:
            assert steps is None, (numbers, target)
        else:
            assert steps is not None and len(steps) == expected, (numbers, target, steps)
            assert target in replay(numbers, steps)


def test_solver_hand_cases() -> None:
    assert solve_countdown([3, 7, 25, 50], 50) == []
    # 75 = 50+25 = 25*3: one step either way
    assert solve_countdown([3, 7, 25, 50], 75) in (["50+25=75"], ["25*3=75"])
    # 4 = 7-3 (one step) beats 50/25*... (two)
    assert solve_countdown([3, 7, 25, 50], 4) == ["7-3=4"]
    assert solve_countdown([1, 1, 1], 4) is None  # (1+1)+1 = 3 is the largest value
    steps = solve_countdown([2, 3, 5, 7, 11, 13], 30030)  # 2*3*5*7*11*13: all five steps needed
    assert steps is not None and len(steps) == 5 and replay([2, 3, 5, 7, 11, 13], steps) == [30030]


def test_steps_to_expression_parenthesises_only_when_needed() -> None:
    assert steps_to_expression([3, 7, 25, 50], ["50+25=75", "75*3=225"], 225) == "(50+25)*3"
    assert steps_to_expression([2, 3, 20], ["3-2=1", "20-1=19"], 19) == "20-(3-2)"
    assert steps_to_expression([2, 3, 24], ["3*2=6", "24/6=4"], 4) == "24/(3*2)"
    assert steps_to_expression([2, 3, 24], ["24/3=8", "8*2=16"], 16) == "24/3*2"
    assert steps_to_expression([5, 6, 20], ["6-5=1", "20+1=21"], 21) == "20+6-5"


def test_countdown_step_rules() -> None:
    assert countdown_step([3, 7, 25, 50], "50+25=75") == [3, 7, 75]
    assert countdown_step([3, 7, 25, 50], " 50 + 25 = 75 ") == [3, 7, 75]
    assert countdown_step([3, 7, 25, 50], "50+25=76") is None  # wrong result
    assert countdown_step([3, 7, 25, 50], "50+50=100") is None  # 50 only once
    assert countdown_step([50, 50], "50+50=100") == [100]
    assert countdown_step([3, 7, 25, 50], "3-7=-4") is None  # bad form / negative
    assert countdown_step([3, 7, 25, 50], "7-7=0") is None
    assert countdown_step([3, 7, 25, 50], "25/7=3") is None  # not exact
    assert countdown_step([3, 7, 25, 50], "11+3=14") is None  # 11 not in pool
    assert countdown_step([3, 7], "7+3") is None
    assert countdown_step([3, 7], "9" * 5000 + "+3=1") is None
    pool = [3, 7, 25, 50]
    countdown_step(pool, "50+25=75")
    assert pool == [3, 7, 25, 50]  # pure


def test_countdown_moves_are_the_legal_steps() -> None:
    moves = dict(countdown_moves([2, 4, 4]))
    # pairs (2,4) twice and (4,4): 4+2, 4-2, 4*2, 4/2 and 4+4, 4*4, 4/4 (4-4=0 is illegal)
    assert set(moves) == {"4+2=6", "4-2=2", "4*2=8", "4/2=2", "4+4=8", "4*4=16", "4/4=1"}
    assert moves["4+4=8"] == [2, 8]
    for step, pool in moves.items():
        assert countdown_step([2, 4, 4], step) == pool


def test_prompt_round_trip() -> None:
    assert parse_countdown_prompt("3 7 25 50 -> 125:") == ([3, 7, 25, 50], 125)
    assert parse_countdown_prompt("3 7 25 50 -> 125") == ([3, 7, 25, 50], 125)
    with pytest.raises(ValueError, match="not a Countdown prompt"):
        parse_countdown_prompt("3+4=")


NUMBERS, TARGET = [3, 7, 25, 50], 125


@pytest.mark.parametrize(
    ("expression", "ok"),
    [
        ("(50-25)*(7-3)-75", False),  # 75 is not given
        ("50*3-25", True),  # 150-25 = 125
        ("(7-3)*25+50-25", False),  # 25 used twice
        ("(50+25)*3", False),  # 225
        ("50/(7-7)", False),  # division by zero (and 7 twice)
        ("50*3-25=125", True),  # a trailing "= target" is tolerated
        ("50 × 3 − 25", True),
        ("25/3*50-7*7", False),  # non-integer intermediate 25/3
        ("__import__('os').system('true')", False),
        ("50*3-25; import os", False),
        ("", False),
        ("(" * 40 + "50" + ")" * 40 + "*3-25", False),  # nesting guard
        ("-50+175", False),  # no unary minus, 175 not given
        ("50**3", False),
        ("5e1*3-25", False),
    ],
)
def test_check_countdown_answer(expression: str, ok: bool) -> None:
    assert check_countdown_answer(expression, NUMBERS, TARGET) is ok


def test_is_correct_uses_the_numbers_in_the_answer() -> None:
    task = CountdownTask(num_numbers=4, max_number=25, seed=0, train_size=10, eval_size=5)
    answer = "3 7 25 50 -> 125"
    assert task.is_correct("<think>50*3=150,150-25=125</think>50*3-25", answer)
    assert task.is_correct("<think>...</think> (50*3)-25 ", answer)
    assert not task.is_correct("<think>...</think>125", answer)  # 125 is not a given number
    assert not task.is_correct("50*3-25", answer)  # no </think>
    assert not task.is_correct("<think>...</think>50*3-25", "3 7 25 51 -> 125")
    assert task.extract_answer("<think>a</think>x</think> 50*3-25 ") == "50*3-25"


@pytest.mark.parametrize(("n", "max_number"), [(3, 25), (4, 25), (5, 25), (6, 25), (4, 100)])
def test_generated_problems_verify(n: int, max_number: int) -> None:
    task = CountdownTask(num_numbers=n, max_number=max_number, seed=7, train_size=200, eval_size=50)
    train, eval_ = task.problems("train"), task.problems("eval")
    assert len(train) == 200 and len(eval_) == 50
    assert not {p.prompt for p in train} & {p.prompt for p in eval_}
    for p in train + eval_:
        numbers, target = parse_countdown_prompt(p.prompt)
        assert len(numbers) == n and numbers == sorted(numbers)
        assert all(1 <= x <= max_number for x in numbers) and 10 <= target <= 999
        assert target not in numbers
        assert p.answer == p.prompt.removesuffix(":")
        think, _, expression = p.solution.removeprefix("<think>").partition("</think>")
        steps = think.split(",")
        assert target in replay(numbers, steps)
        assert len(steps) == naive_min_steps(numbers, target) if n <= 4 else len(steps) <= n - 1
        assert check_countdown_answer(expression, numbers, target)
        assert task.is_correct(p.solution, p.answer)


def test_countdown_is_deterministic_by_seed() -> None:
    a = build_task("countdown", seed=5, train_size=100, eval_size=20)
    b = build_task("countdown", seed=5, train_size=100, eval_size=20)
    c = build_task("countdown", seed=6, train_size=100, eval_size=20)
    assert a.problems("train") == b.problems("train") and a.problems("eval") == b.problems("eval")
    assert a.problems("eval") != c.problems("eval")


def test_impossible_settings_fail_clearly() -> None:
    task = CountdownTask(num_numbers=3, max_number=2, seed=0, train_size=5, eval_size=5)
    with pytest.raises(ValueError, match="countdown_max_number"):
        task.problems("train")


def test_generation_is_fast() -> None:
    with cpu_budget(5.0, "3000 countdown problems"):
        task = build_task("countdown", train_size=3000, eval_size=200)
        assert len(task.problems("train")) == 3000
