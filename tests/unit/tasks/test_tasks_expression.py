"""The safe expression evaluator: exact values, literals, rules and guards."""

from __future__ import annotations

from fractions import Fraction

import pytest

from scalerl.tasks import ExpressionError, evaluate_expression


@pytest.mark.parametrize(
    ("text", "value", "literals"),
    [
        ("1+2*3", 7, (1, 2, 3)),  # precedence: 2*3 first
        ("(1+2)*3", 9, (1, 2, 3)),
        ("20-3-2", 15, (20, 3, 2)),  # left associative: (20-3)-2
        ("24/3/2", 4, (24, 3, 2)),
        (" 50 * 3 - 25 ", 125, (50, 3, 25)),
        ("((7))", 7, (7,)),
        ("6×7", 42, (6, 7)),
        ("84÷2−2", 40, (84, 2, 2)),
    ],
)
def test_values_and_literals(text: str, value: int, literals: tuple[int, ...]) -> None:
    result = evaluate_expression(text)
    assert result.value == Fraction(value)
    assert result.literals == literals


def test_fractions_only_without_the_integer_rule() -> None:
    assert evaluate_expression("7/2*4", integer_steps=False).value == Fraction(14)
    assert evaluate_expression("1/3", integer_steps=False).value == Fraction(1, 3)
    assert evaluate_expression("2-5", integer_steps=False).value == Fraction(-3)
    with pytest.raises(ExpressionError, match="positive integer"):
        evaluate_expression("7/2*4")
    with pytest.raises(ExpressionError, match="positive integer"):
        evaluate_expression("2-5+10")
    with pytest.raises(ExpressionError, match="positive integer"):
        evaluate_expression("5-5")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("1/0", "division by zero"),
        ("", "empty"),
        ("1+", "end of expression"),
        ("(1+2", "end of expression"),
        ("1+2)", "after a complete expression"),
        ("-1+2", "expected a number"),
        ("2**3", "expected a number"),
        ("__import__('os').system('rm -rf /')", "unexpected character"),
        ("eval('1')", "unexpected character"),
        ("1.5+1", "unexpected character"),
        ("1" * 20, "too long"),
        ("1+" * 200 + "1", "longer than"),
        ("(" * 33 + "1" + ")" * 33, "nested deeper"),
    ],
)
def test_rejections(text: str, reason: str) -> None:
    with pytest.raises(ExpressionError, match=reason):
        evaluate_expression(text, integer_steps=False)
