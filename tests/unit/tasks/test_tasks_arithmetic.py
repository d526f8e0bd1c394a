"""Addition and multiplication: hand-worked chains of thought, verifier, splits, determinism."""

from __future__ import annotations

import pytest

from cpu_budget import cpu_budget
from scalerl.tasks import AdditionTask, MultiplicationTask, addition_solution, build_task, multiplication_solution
from scalerl.tasks.arithmetic import parse_integer


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        # units 7+8=15 (write 5, carry 1); tens 5+6+1=12 (2, carry 1); hundreds 3+4+1=8 → 825
        (357, 468, "<think>7+8+0=15,5+6+1=12,3+4+1=8</think>825"),
        # 9+1=10, 9+0+1=10, 9+0+1=10, final carry 1 only in the answer → 1000
        (999, 1, "<think>9+1+0=10,9+0+1=10,9+0+1=10</think>1000"),
        (1, 999, "<think>1+9+0=10,0+9+1=10,0+9+1=10</think>1000"),
        (0, 0, "<think>0+0+0=0</think>0"),
        (7, 5, "<think>7+5+0=12</think>12"),  # digits=1
        (3, 4, "<think>3+4+0=7</think>7"),
        # digits=5: 40302 + 59799: 2+9=11, 0+9+1=10, 3+7+1=11, 0+9+1=10, 4+5+1=10 → 100101
        (40302, 59799, "<think>2+9+0=11,0+9+1=10,3+7+1=11,0+9+1=10,4+5+1=10</think>100101"),
        (12345, 6, "<think>5+6+0=11,4+0+1=5,3+0+0=3,2+0+0=2,1+0+0=1</think>12351"),
    ],
)
def test_addition_solution_by_hand(a: int, b: int, expected: str) -> None:
    assert addition_solution(a, b) == expected


@pytest.mark.parametrize(
    ("a", "m", "expected"),
    [
        # 7*8=56 (6, carry 5); 5*8+5=45 (5, carry 4); 3*8+4=28 → 2856
        (357, 8, "<think>7*8+0=56,5*8+5=45,3*8+4=28</think>2856"),
        (0, 9, "<think>0*9+0=0</think>0"),
        (10, 2, "<think>0*2+0=0,1*2+0=2</think>20"),
        (999, 9, "<think>9*9+0=81,9*9+8=89,9*9+8=89</think>8991"),
    ],
)
def test_multiplication_solution_by_hand(a: int, m: int, expected: str) -> None:
    assert multiplication_solution(a, m) == expected


def test_addition_problem_format() -> None:
    task = AdditionTask(digits=3, seed=0, train_size=50, eval_size=10)
    for p in task.problems("train") + task.problems("eval"):
        a, b = (int(x) for x in p.prompt.removesuffix("=").split("+"))
        assert p.prompt == f"{a}+{b}="
        assert 0 <= a < 1000 and 0 <= b < 1000
        assert p.answer == str(a + b)
        assert p.solution == addition_solution(a, b)
    assert task.problems("train")[17].id == "add3-train-000017"
    assert task.problems("eval")[3].id == "add3-eval-000003"


@pytest.mark.parametrize("cls", [AdditionTask, MultiplicationTask])
@pytest.mark.parametrize("digits", [1, 3, 5, 12])
def test_gold_solutions_verify_and_wrong_answers_do_not(cls: type, digits: int) -> None:
    task = cls(digits=digits, seed=1, train_size=300, eval_size=20)
    for p in task.problems("train") + task.problems("eval"):
        assert task.is_correct(p.solution, p.answer), p
        assert task.extract_answer(p.solution) == p.answer
        wrong = p.solution.rpartition("</think>")[0] + "</think>" + str(int(p.answer) + 1)
        assert not task.is_correct(wrong, p.answer)


def test_is_correct_rules() -> None:
    task = AdditionTask(digits=3, seed=0, train_size=1, eval_size=1)
    assert task.is_correct("<think>x</think> 8 25 ", "825")  # spaces ignored
    assert task.is_correct("<think>a</think>b</think>825", "825")  # after the LAST </think>
    assert task.is_correct("<think>x</think>0825", "825")  # integer comparison
    assert not task.is_correct("825", "825")  # no </think>: no answer
    assert not task.is_correct("<think>825</think>", "825")
    assert not task.is_correct("<think>x</think>825.0", "825")
    assert not task.is_correct("<think>x</think>8a25", "825")
    assert not task.is_correct("<think>x</think>" + "9" * 5000, "825")
    assert parse_integer("-12") == -12 and parse_integer("+7") == 7 and parse_integer("1e3") is None


@pytest.mark.parametrize("cls", [AdditionTask, MultiplicationTask])
def test_train_and_eval_are_disjoint_and_deterministic(cls: type) -> None:
    task = cls(digits=2, seed=3, train_size=2000, eval_size=200)
    train, eval_ = task.problems("train"), task.problems("eval")
    assert len(train) == 2000 and len(eval_) == 200
    assert not {p.prompt for p in train} & {p.prompt for p in eval_}
    assert len({p.prompt for p in eval_}) == 200
    assert len({p.id for p in train + eval_}) == 2200
    again = cls(digits=2, seed=3, train_size=2000, eval_size=200)
    assert again.problems("train") == train and again.problems("eval") == eval_
    other = cls(digits=2, seed=4, train_size=2000, eval_size=200)
    assert other.problems("eval") != eval_
    # the eval set does not depend on train_size, and a smaller train set is a prefix
    small = cls(digits=2, seed=3, train_size=100, eval_size=200)
    assert small.problems("eval") == eval_ and small.problems("train") == train[:100]


def test_tiny_space_repeats_train_but_never_eval() -> None:
    # digits=1: only 100 pairs; 20 go to eval, train must repeat the other 80
    task = AdditionTask(digits=1, seed=0, train_size=500, eval_size=20)
    train_prompts = {p.prompt for p in task.problems("train")}
    assert len(train_prompts) == 80
    assert not train_prompts & {p.prompt for p in task.problems("eval")}


def test_eval_larger_than_the_space_is_an_error() -> None:
    task = AdditionTask(digits=1, seed=0, train_size=10, eval_size=100)
    with pytest.raises(ValueError, match="eval_size"):
        task.problems("train")
    with pytest.raises(ValueError, match="eval_size"):
        AdditionTask(digits=1, seed=0, train_size=10, eval_size=101).problems("eval")


def test_problems_returns_copies() -> None:
    task = AdditionTask(digits=3, seed=0, train_size=5, eval_size=2)
    task.problems("train").clear()
    assert len(task.problems("train")) == 5


def test_generation_is_fast() -> None:
    # (0.16-0.29 s of CPU in a process of its own on a loaded machine; 1.11 s inside a cold CI run's suite, where
    # process time counts the pytest process's other threads too: the budget catches a blow-up, not those)
    with cpu_budget(3.0, "20000 addition problems"):
        task = build_task("addition", train_size=20_000, eval_size=200, digits=3)
        assert len(task.problems("train")) == 20_000


def test_long_multiplication_by_hand() -> None:
    # 357*48 on paper: 357*8 = 2856 (7*8=56: 6 carry 5; 5*8+5=45: 5 carry 4; 3*8+4=28); 357*4 = 1428;
    # 2856 + 14280 (the partial shifted one place) = 17136
    assert multiplication_solution(357, 48) == (
        "<think>357*8=7*8+0=56,5*8+5=45,3*8+4=28=2856;357*4=7*4+0=28,5*4+2=22,3*4+2=14=1428;"
        "2856+14280=6+0+0=6,5+8+0=13,8+2+1=11,2+4+1=7,0+1+0=1=17136</think>17136")
    # a 0 digit: its partial is 0, added as 0
    assert multiplication_solution(12, 10) == (
        "<think>12*0=2*0+0=0,1*0+0=0=0;12*1=2*1+0=2,1*1+0=1=12;0+120=0+0+0=0,0+2+0=2,0+1+0=1=120</think>120")


def test_long_multiplication_chain_is_arithmetic_that_checks() -> None:
    task = build_task("multiplication", digits=4, multiplier_digits=3, seed=2, train_size=300, eval_size=50)
    assert task.name == "mul4x3"
    for p in task.problems("train") + task.problems("eval"):
        a, m = (int(x) for x in p.prompt.removesuffix("=").split("*"))
        assert 0 <= a < 10**4 and 100 <= m < 1000 and p.answer == str(a * m)
        parts = p.solution.removeprefix("<think>").rpartition("</think>")[0].split(";")
        assert len(parts) == 2 * len(str(m)) - 1  # a partial per multiplier digit, a sum from the second on
        total = 0
        for i, part in enumerate(parts):
            head, value = part.partition("=")[0], int(part.rpartition("=")[2])
            x, op, y = head.partition("*") if "*" in head else head.partition("+")
            assert value == (int(x) * int(y) if op == "*" else int(x) + int(y)), part
            if op == "+":
                assert int(x) == total and int(y) % 10 ** (i // 2) == 0
                total = value
            elif i == 0:
                total = value
        assert total == a * m
        assert task.is_correct(p.solution, p.answer)


def test_multiplier_digits_reaches_the_task_from_a_spec_and_is_checked() -> None:
    from scalerl.config import JobSpec
    from scalerl.tasks.registry import task_from_config

    task_section = {"kind": "multiplication", "digits": 2, "multiplier_digits": 2}
    spec = JobSpec.model_validate({"name": "m", "task": task_section})
    task = task_from_config(spec.task)
    assert task.name == "mul2x2"
    assert all(10 <= int(p.prompt[:-1].split("*")[1]) < 100 for p in task.problems("eval"))
    assert build_task("multiplication", digits=2, train_size=50, eval_size=5).problems("train") == \
        MultiplicationTask(digits=2, seed=0, train_size=50, eval_size=5).problems("train")  # default: as before
    with pytest.raises(ValueError, match="multiplier_digits"):
        build_task("multiplication", multiplier_digits=7)
    with pytest.raises(ValueError, match=r"multiplier_digits is for task\.kind 'multiplication' only"):
        JobSpec.model_validate({"name": "m", "task": {"kind": "addition", "multiplier_digits": 2}})
