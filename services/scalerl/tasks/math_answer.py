"""Extracting and comparing final answers of math problems (the `jsonl` task's verifier).

`extract_math_answer` finds the answer in a completion; `math_equal` decides whether it matches the
reference, in three stages, each tried when the previous one did not say "equal":

1. `math_verify` (parse + verify), the checker ScaleRL-style math RL uses. Its default timeouts use
   `signal.alarm`, which raises outside the main thread, so both are disabled
   (`parsing_timeout=None`, `timeout_seconds=None`) and the verifier can run in worker threads.
   Hostile inputs that would then run unbounded (power towers, huge factorials) are refused
   beforehand by `_is_tame`.
2. sympy on a lightly de-LaTeXed form: equal if `simplify(a - b) == 0` or, for numbers, within
   `_REL_TOL`. The text is whitelisted (digits, operators, single-letter names, `sqrt`, `pi`) before
   `parse_expr`, which evaluates Python, ever sees it.
3. normalised string equality (spaces, `$`, `\\text{}` and a trailing period removed).

Nothing here raises on model output: every failure is "not equal".
"""

from __future__ import annotations

import math
import re
from typing import Any

from scalerl.model.tokenizer import THINK_CLOSE

_MAX_ANSWER_CHARS = 512  # longer "answers" are not answers, and they make the parsers slow
_MAX_EXPONENT = 4096  # 2**(2**30) alone takes math_verify 16 s; tame answers never need more
_REL_TOL = 1e-6
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_HASHES = re.compile(r"####\s*(.+)")
_ANSWER_IS = re.compile(r"answer is\s*:?\s*(.+)", re.IGNORECASE)
_WORD = re.compile(r"(?<!\\)\b[A-Za-z]{2,}\b")  # a word that is not a LaTeX command
_MATH_WORDS = frozenset({"sqrt", "pi", "sin", "cos", "tan", "log", "ln", "exp", "inf", "infty"})
_SAFE_SYMPY = re.compile(r"[0-9A-Za-z+\-*/().\s]*")
_NAMES = re.compile(r"[A-Za-z]+")


def last_boxed(text: str) -> str | None:
    r"""Content of the last `\boxed{...}` (or `\fbox{...}`) with balanced braces, else None."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, j = 1, i
    while j < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        j += 1
    return text[i : j - 1].strip() if depth == 0 else None


def _clean_tail(s: str) -> str:
    return s.strip().rstrip(".").strip().strip("$").strip()


def extract_math_answer(text: str) -> str | None:
    """The final answer in a completion, or None.

    Searched in the text after the last `</think>` if there is one, else in the whole text:
    `\\boxed{...}`, then `#### X`, then `answer is X` (last occurrence, to the end of the line);
    failing those, after `</think>` the whole remaining line if it is not prose, else the last
    number (`-12`, `3.5`, `1,000`, `3/4`).
    """
    _, sep, region = text.rpartition(THINK_CLOSE)
    candidates = [last_boxed(region)]
    for pattern in (_HASHES, _ANSWER_IS):
        matches = pattern.findall(region)
        candidates.append(matches[-1] if matches else None)
    for found in candidates:
        if found and _clean_tail(found):
            return _clean_tail(found)
    tail = _clean_tail(region)
    is_prose = any(w.lower() not in _MATH_WORDS for w in _WORD.findall(tail))
    if sep and tail and "\n" not in tail and not is_prose:
        return tail
    numbers = _NUMBER.findall(region)
    return numbers[-1].replace(",", "") if numbers else None


def _normalise(s: str) -> str:
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    s = s.replace("$", "").replace("\\!", "").replace("\\,", "").replace("\\ ", "")
    return "".join(s.split()).rstrip(".").lower()


def _constant_bound(expr: Any) -> float:
    """An upper bound on |expr| for a constant built from numbers with + and ×; inf for anything else."""
    import sympy

    if expr.is_Number:
        return float(abs(expr))
    if isinstance(expr, sympy.Add | sympy.Mul):
        bounds = [_constant_bound(a) for a in expr.args]
        return sum(bounds) if isinstance(expr, sympy.Add) else math.prod(bounds)
    if isinstance(expr, sympy.Pow):
        base, exp = _constant_bound(expr.base), _constant_bound(expr.exp)
        try:
            return math.inf if exp > _MAX_EXPONENT else max(base, 1.0) ** exp
        except OverflowError:
            return math.inf
    return math.inf


def _is_tame(expr: Any) -> bool:
    """False for sympy trees whose evaluation could run unbounded: a constant exponent or factorial
    argument that is not a sum/product of numbers at most `_MAX_EXPONENT` in size (power towers,
    `2^{4096*4096*4096}`, `(10!)!`). Symbolic exponents (`e^{x^2}`) are fine."""
    import sympy

    try:
        for node in sympy.preorder_traversal(expr):
            if isinstance(node, sympy.Pow):
                arg = node.exp
            elif isinstance(node, sympy.factorial | sympy.gamma | sympy.factorial2 | sympy.subfactorial):
                arg = node.args[0]
            else:
                continue
            if not arg.free_symbols and _constant_bound(arg) > _MAX_EXPONENT:
                return False
        return True
    except Exception:  # a tree sympy cannot even walk is not one we want to evaluate
        return False


class _DisabledTimeoutNotice:
    """Drops math_verify's notice that its timeouts are off (they are, on purpose: see the module
    docstring); every other record of its loggers passes."""

    def filter(self, record: object) -> bool:
        return not str(getattr(record, "msg", "")).startswith("Timeout is disabled")


_QUIET = _DisabledTimeoutNotice()


def _math_verify_equal(pred: str, ref: str) -> bool:
    import logging

    from math_verify import parse, verify  # sympy and math_verify are imported lazily: ~1 s

    for name in ("math_verify.grader", "math_verify.parser"):
        if _QUIET not in logging.getLogger(name).filters:
            logging.getLogger(name).addFilter(_QUIET)

    def parse_both(s: str) -> list[Any]:
        wrapped: list[Any] = parse(s if "$" in s else f"${s}$", parsing_timeout=None)  # type: ignore[arg-type]
        return wrapped or list(parse(s, parsing_timeout=None))  # type: ignore[arg-type]

    gold, target = parse_both(ref), parse_both(pred)
    if not gold or not target or not all(_is_tame(x) for x in (*gold, *target) if not isinstance(x, str)):
        return False
    return bool(verify(gold, target, timeout_seconds=None))


def _delatex(s: str) -> str:
    s = s.replace("$", "").replace("\\left", "").replace("\\right", "")
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    for _ in range(8):  # innermost first; 8 levels of nested \frac is plenty
        s = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"((\1)/(\2))", s)
        s = re.sub(r"\\sqrt\{([^{}]*)\}", r"sqrt(\1)", s)
    s = s.replace("\\cdot", "*").replace("\\times", "*").replace("\\div", "/").replace("\\pi", "pi")
    s = s.replace("^", "**").replace("{", "(").replace("}", ")")
    return re.sub(r"(?<=\d),(?=\d{3}\b)", "", s)  # thousands separators


def _to_sympy(s: str) -> Any:
    import sympy
    from sympy.parsing.sympy_parser import implicit_multiplication, parse_expr, standard_transformations

    transforms = (*standard_transformations, implicit_multiplication)
    s = _delatex(s)
    if not _SAFE_SYMPY.fullmatch(s) or any(n not in ("sqrt", "pi") and len(n) > 1 for n in _NAMES.findall(s)):
        raise ValueError("not a plain expression")
    names: dict[str, Any] = {c: sympy.Symbol(c) for c in set(_NAMES.findall(s)) if len(c) == 1}
    names.update(sqrt=sympy.sqrt, pi=sympy.pi)
    if not _is_tame(parse_expr(s, local_dict=names, transformations=transforms, evaluate=False)):
        raise ValueError("expression too large to evaluate")
    return parse_expr(s, local_dict=names, transformations=transforms)


def _sympy_equal(pred: str, ref: str) -> bool:
    import sympy

    a, b = _to_sympy(pred), _to_sympy(ref)
    if not a.free_symbols and not b.free_symbols:
        x, y = complex(sympy.N(a)), complex(sympy.N(b))
        if all(math.isfinite(abs(z)) for z in (x, y)):  # 3^1000 overflows to inf, which "equals" 1
            return abs(x - y) <= _REL_TOL * max(1.0, abs(x), abs(y))
    return bool(sympy.simplify(a - b) == 0)


def math_equal(pred: str | None, ref: str) -> bool:
    """Whether the answer `pred` equals the reference `ref` (see the module docstring). Never raises."""
    if pred is None or not pred.strip() or len(pred) > _MAX_ANSWER_CHARS:
        return False
    pred = last_boxed(pred) or pred
    ref = last_boxed(ref) or ref
    if _normalise(pred) == _normalise(ref):
        return True
    for stage in (_math_verify_equal, _sympy_equal):
        try:
            if stage(pred, ref):
                return True
        except Exception:  # any parser failure on model output means "not equal"
            continue
    return False
