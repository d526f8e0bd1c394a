"""`build_task`: dispatch and parameter validation with messages naming the parameter."""

from __future__ import annotations

import re

import pytest

from scalerl.config import TASK_KINDS as CONFIG_KINDS
from scalerl.tasks import TASK_KINDS, AdditionTask, CountdownTask, MultiplicationTask, build_task


def test_kinds() -> None:
    assert TASK_KINDS == ("addition", "multiplication", "countdown", "jsonl", "code") == CONFIG_KINDS
    assert isinstance(build_task("addition", train_size=5, eval_size=2), AdditionTask)
    assert isinstance(build_task("multiplication", train_size=5, eval_size=2), MultiplicationTask)
    assert isinstance(build_task("countdown", train_size=5, eval_size=2), CountdownTask)
    assert build_task("addition", digits=5, train_size=5, eval_size=2).name == "add5"
    prompt = build_task("multiplication", digits=4, train_size=5, eval_size=2).problems("eval")[0].prompt
    assert prompt.endswith("=") and "*" in prompt


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "subtraction"}, re.escape("kind: unknown task kind; allowed: addition, multiplication, "
                                            "countdown, jsonl, code (built in), or a plugin task (")),
        ({"kind": "addition", "options": {"digits": 2}}, "options: only plugin tasks take options"),
        ({"kind": "addition", "digits": 0}, r"digits must be an integer in \[1, 12\], got 0"),
        ({"kind": "addition", "digits": 13}, r"digits must be an integer in \[1, 12\]"),
        ({"kind": "addition", "digits": 2.5}, "digits must be an integer"),
        ({"kind": "addition", "train_size": 0}, r"train_size must be an integer in \[1, "),
        ({"kind": "addition", "eval_size": -1}, r"eval_size must be an integer in \[1, "),
        ({"kind": "countdown", "countdown_numbers": 7}, r"countdown_numbers must be an integer in \[3, 6\]"),
        ({"kind": "countdown", "countdown_max_number": 1}, r"countdown_max_number must be an integer in \[2, 1000\]"),
        ({"kind": "addition", "seed": "0"}, "seed must be an integer"),
        ({"kind": "jsonl"}, "train_path is required when kind is 'jsonl'"),
    ],
)
def test_bad_values_name_the_parameter(kwargs: dict, message: str) -> None:
    rest = {k: v for k, v in kwargs.items() if k != "kind"}
    with pytest.raises(ValueError, match=message):
        build_task(kwargs["kind"], **rest)


def test_split_is_checked() -> None:
    task = build_task("addition", train_size=5, eval_size=2)
    with pytest.raises(ValueError, match=r"split must be one of \['train', 'eval'\]"):
        task.problems("test")  # type: ignore[arg-type]
