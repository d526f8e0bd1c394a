"""Verifiable tasks: generated (addition, multiplication, Countdown) and JSONL datasets.

`build_task(kind, ...)` is the entry point; `Task` / `Problem` (base.py) the interface. Each task's
module docstring gives its exact prompt and solution format.
"""

from scalerl.tasks.arithmetic import (
    AdditionTask,
    MultiplicationTask,
    addition_solution,
    multiplication_solution,
)
from scalerl.tasks.base import Problem, Split, Task, answer_after_think, problem_set_fingerprint
from scalerl.tasks.countdown import (
    CountdownTask,
    check_countdown_answer,
    format_countdown_prompt,
    steps_to_expression,
)
from scalerl.tasks.countdown_search import (
    apply_op,
    arithmetic_only_failure,
    countdown_moves,
    countdown_step,
    parse_countdown_prompt,
    solvable_state,
    solve_countdown,
    step_result,
)
from scalerl.tasks.expression import ExpressionError, evaluate_expression
from scalerl.tasks.jsonl import DatasetError, JsonlTask, read_jsonl, validate_jsonl
from scalerl.tasks.math_answer import extract_math_answer, math_equal
from scalerl.tasks.registry import TASK_KINDS, build_task

__all__ = [
    "TASK_KINDS",
    "AdditionTask",
    "CountdownTask",
    "DatasetError",
    "ExpressionError",
    "JsonlTask",
    "MultiplicationTask",
    "Problem",
    "Split",
    "Task",
    "addition_solution",
    "answer_after_think",
    "apply_op",
    "arithmetic_only_failure",
    "build_task",
    "check_countdown_answer",
    "countdown_moves",
    "countdown_step",
    "evaluate_expression",
    "extract_math_answer",
    "format_countdown_prompt",
    "math_equal",
    "multiplication_solution",
    "parse_countdown_prompt",
    "problem_set_fingerprint",
    "read_jsonl",
    "solvable_state",
    "solve_countdown",
    "step_result",
    "steps_to_expression",
    "validate_jsonl",
]
