"""A safe evaluator for the arithmetic expressions models write (Countdown answers).

Model output is untrusted, so nothing here calls `eval`, `ast.literal_eval` or sympy: a small
recursive-descent parser accepts exactly

    expr   := term (("+" | "-") term)*
    term   := factor (("*" | "/") factor)*
    factor := INTEGER | "(" expr ")"

over non-negative integer literals (no unary minus, no exponent, no names). "×", "x", "÷" and "−"
are read as "*", "*", "/" and "-". Arithmetic is exact (`Fraction`). With `integer_steps=True` (the
Countdown rule) every intermediate result must be a positive integer. Any violation raises
`ExpressionError`; callers that verify model output catch it and score the completion as wrong.

Guards keep hostile input cheap: at most `MAX_EXPRESSION_CHARS` characters, `MAX_DEPTH` nested
parentheses, `MAX_LITERAL_DIGITS` digits per literal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

MAX_EXPRESSION_CHARS = 256  # a 6-number Countdown answer needs ~40
MAX_DEPTH = 32  # Python's recursion limit is far away; a real answer nests at most 5 deep
MAX_LITERAL_DIGITS = 9  # Countdown numbers are < 10**4; bounds the cost of every multiplication

_TOKEN = re.compile(r"\s*(?:(\d+)|([-+*/()]))")
_ALIASES = str.maketrans({"×": "*", "x": "*", "X": "*", "÷": "/", "−": "-", "–": "-"})


class ExpressionError(ValueError):
    """The text is not a valid expression under the rules above; the message says why."""


@dataclass(frozen=True, slots=True)
class Evaluation:
    value: Fraction
    """Exact value of the expression."""
    literals: tuple[int, ...]
    """Integer literals in the order they appear (the numbers the expression uses)."""


def _tokenize(text: str) -> list[str]:
    text = text.translate(_ALIASES).strip()
    tokens, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ExpressionError(f"unexpected character {text[pos:].lstrip()[:1]!r} at {pos}")
        if m.group(1) is not None and len(m.group(1)) > MAX_LITERAL_DIGITS:
            raise ExpressionError(f"number {m.group(1)[:12]}... is too long")
        tokens.append(m.group(1) or m.group(2))
        pos = m.end()
    return tokens


class _Parser:
    def __init__(self, tokens: list[str], integer_steps: bool) -> None:
        self.tokens, self.pos, self.integer_steps = tokens, 0, integer_steps
        self.literals: list[int] = []

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise ExpressionError("unexpected end of expression")
        self.pos += 1
        return tok

    def expr(self, depth: int) -> Fraction:
        value = self.term(depth)
        while self.peek() in ("+", "-"):
            op = self.take()
            value = self.apply(value, op, self.term(depth))
        return value

    def term(self, depth: int) -> Fraction:
        value = self.factor(depth)
        while self.peek() in ("*", "/"):
            op = self.take()
            value = self.apply(value, op, self.factor(depth))
        return value

    def factor(self, depth: int) -> Fraction:
        tok = self.take()
        if tok == "(":
            if depth >= MAX_DEPTH:
                raise ExpressionError(f"parentheses nested deeper than {MAX_DEPTH}")
            value = self.expr(depth + 1)
            if self.take() != ")":
                raise ExpressionError("expected ')'")
            return value
        if tok.isdigit():
            self.literals.append(int(tok))
            return Fraction(int(tok))
        raise ExpressionError(f"expected a number or '(', got {tok!r}")

    def apply(self, a: Fraction, op: str, b: Fraction) -> Fraction:
        if op == "+":
            out = a + b
        elif op == "-":
            out = a - b
        elif op == "*":
            out = a * b
        else:
            if b == 0:
                raise ExpressionError("division by zero")
            out = a / b
        if self.integer_steps and (out.denominator != 1 or out <= 0):
            raise ExpressionError(f"{a} {op} {b} = {out} is not a positive integer")
        return out


def evaluate_expression(text: str, *, integer_steps: bool = True) -> Evaluation:
    """Parse and evaluate `text` exactly; raise `ExpressionError` if it breaks any rule."""
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    tokens = _tokenize(text)
    if not tokens:
        raise ExpressionError("empty expression")
    parser = _Parser(tokens, integer_steps)
    value = parser.expr(0)
    if parser.peek() is not None:
        raise ExpressionError(f"unexpected {parser.peek()!r} after a complete expression")
    return Evaluation(value=value, literals=tuple(parser.literals))
