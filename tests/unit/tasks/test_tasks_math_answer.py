"""Math answer extraction and equivalence (math_verify → sympy → strings), also off the main thread."""

from __future__ import annotations

import threading

import pytest

from cpu_budget import cpu_budget
from scalerl.tasks import extract_math_answer, math_equal
from scalerl.tasks.math_answer import last_boxed


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{42}", "42"),
        ("\\boxed{\\frac{1}{2}} and later \\boxed{\\frac{3}{4}}", "\\frac{3}{4}"),  # the last one
        ("\\boxed{{a}+{b}}", "{a}+{b}"),  # balanced braces
        ("<think>maybe \\boxed{1}</think>\\boxed{2}", "2"),  # after the last </think>
        ("<think>\\boxed{1}</think>", None),  # nothing after </think>
        ("work\n#### 72\n", "72"),
        ("The answer is $\\frac{3}{4}$.", "\\frac{3}{4}"),
        ("<think>hmm</think>x+1", "x+1"),
        ("<think>hmm</think>\\sqrt{2}", "\\sqrt{2}"),
        ("<think>hmm</think>So it is 42 apples.", "42"),
        ("first 3 then 1,234 and finally -7.5", "-7.5"),
        ("ratio 3/4", "3/4"),
        ("no numbers here", None),
        ("", None),
    ],
)
def test_extract_math_answer(text: str, expected: str | None) -> None:
    assert extract_math_answer(text) == expected


def test_last_boxed_unbalanced() -> None:
    assert last_boxed("\\boxed{1") is None
    assert last_boxed("\\fbox{7}") == "7"


@pytest.mark.parametrize(
    ("pred", "ref", "equal"),
    [
        ("1/2", "0.5", True),
        ("\\frac{1}{2}", "0.5", True),
        ("\\dfrac{3}{4}", "0.75", True),
        ("\\boxed{42}", "42", True),
        ("42", "\\boxed{42}", True),
        ("x+1", "1+x", True),
        ("2x", "x*2", True),
        ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}", True),
        ("1,000", "1000", True),
        ("3.0", "3", True),
        ("-5", "-5.0", True),
        ("\\pi", "3.14159265358979", True),
        ("2^{10}", "1024", True),
        ("x^{2^{3}}", "x^8", True),  # a small constant power tower is fine
        ("e^{x^2}", "\\exp(x^2)", True),
        ("42", "41", False),
        ("3^{1000}", "1", False),  # overflows float: must not compare as inf ~ anything
        ("1+x", "1", False),
        ("x+2", "x+1", False),
        ("0.5001", "0.5", False),
        ("hello", "42", False),
        ("", "42", False),
        (None, "42", False),
    ],
)
def test_math_equal(pred: str | None, ref: str, equal: bool) -> None:
    assert math_equal(pred, ref) is equal


@pytest.mark.parametrize(
    "hostile",
    [
        "9^{9^{9^9}}",  # would run for ever without math_verify's (disabled) timeout
        "2^{2^{30}}",
        "10^{100000}",
        "100000!",
        "(10!)!",
        "2^{4096*4096*4096}",
        "__import__('os').system('echo pwned')",
        "().__class__.__bases__[0].__subclasses__()",
        "lambda: 1",
        "\\boxed{" * 50,
        "9" * 5000,
        "{" * 300 + "1" + "}" * 300,
    ],
)
def test_hostile_answers_are_wrong_and_fast(hostile: str) -> None:
    with cpu_budget(5.0, "math_equal on a hostile answer"):
        assert math_equal(hostile, "1") is False


def test_works_from_a_worker_thread() -> None:
    # math_verify's default timeouts use signal.alarm, which raises outside the main thread.
    results: list[bool] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            results.extend([math_equal("\\frac{1}{2}", "0.5"), math_equal("x+1", "1+x"),
                            math_equal("2", "3"), math_equal(extract_math_answer("#### 1/2"), "0.5")])
        except BaseException as e:  # pragma: no cover - the assertion below reports it
            errors.append(e)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=60)
    assert not errors and results == [True, True, False, True]


def test_math_verify_says_nothing_about_the_timeouts_it_was_told_to_skip(capsys, caplog) -> None:
    """math_verify warns once per process that its timeouts are off (on purpose here: `_is_tame` refuses
    the inputs that would need them); that notice stays off the terminal, its other records do not."""
    import logging

    import math_verify.grader
    import math_verify.parser

    from scalerl.tasks.math_answer import math_equal

    math_verify.grader.TIMEOUT_WARNING_SHOWN = False  # as in a fresh process (another test may have run it)
    math_verify.parser.TIMEOUT_WARNING_SHOWN = False
    with caplog.at_level(logging.WARNING):
        assert math_equal("\\frac{1}{3}", "2/6")
        logging.getLogger("math_verify.grader").warning("another problem")
    assert [r.getMessage() for r in caplog.records if r.name.startswith("math_verify")] == ["another problem"]
    assert "Timeout is disabled" not in capsys.readouterr().err
