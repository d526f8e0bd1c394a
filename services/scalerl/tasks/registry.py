"""`build_task`: one entry point from the `task` section of a job spec to a `Task`.

Kinds dispatch through `_BUILDERS` (one small function each), not an if/elif ladder. Every bad value
raises ValueError naming the parameter and what is allowed, so a direct caller (tests, the CLI's
`eval`) gets the same quality of message as `JobSpec` validation.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from scalerl.tasks.arithmetic import MAX_DIGITS, AdditionTask, MultiplicationTask
from scalerl.tasks.base import Task, check_phrasing, check_range
from scalerl.tasks.countdown import CountdownTask
from scalerl.tasks.jsonl import JsonlTask

# Same bounds as `TaskConfig` in config.py.
MAX_TRAIN_SIZE = 10_000_000
MAX_EVAL_SIZE = 100_000


def _addition(**kw: Any) -> Task:
    return AdditionTask(digits=kw["digits"], seed=kw["seed"], train_size=kw["train_size"],
                        eval_size=kw["eval_size"], phrasing=kw["phrasing"])


def _multiplication(**kw: Any) -> Task:
    return MultiplicationTask(digits=kw["digits"], seed=kw["seed"], train_size=kw["train_size"],
                              eval_size=kw["eval_size"], phrasing=kw["phrasing"])


def _countdown(**kw: Any) -> Task:
    return CountdownTask(num_numbers=kw["countdown_numbers"], max_number=kw["countdown_max_number"],
                         seed=kw["seed"], train_size=kw["train_size"], eval_size=kw["eval_size"],
                         phrasing=kw["phrasing"])


def _jsonl(**kw: Any) -> Task:
    if not kw["train_path"]:
        raise ValueError("train_path is required when kind is 'jsonl'")
    return JsonlTask(train_path=kw["train_path"], eval_path=kw["eval_path"] or None,
                     eval_size=kw["eval_size"], seed=kw["seed"], phrasing=kw["phrasing"])


_BUILDERS: dict[str, Callable[..., Task]] = {
    "addition": _addition,
    "multiplication": _multiplication,
    "countdown": _countdown,
    "jsonl": _jsonl,
}
TASK_KINDS: tuple[str, ...] = tuple(_BUILDERS)


def build_task(
    kind: str,
    *,
    seed: int = 0,
    train_size: int = 20_000,
    eval_size: int = 200,
    digits: int = 3,
    countdown_numbers: int = 4,
    countdown_max_number: int = 25,
    train_path: str | Path | None = None,
    eval_path: str | Path | None = None,
    phrasing: str = "symbolic",
) -> Task:
    """The task `kind` ("addition", "multiplication", "countdown" or "jsonl") with these settings.

    Generated kinds ignore the paths; "jsonl" ignores the generator settings and `train_size`
    (the file decides) and needs `train_path`.
    `phrasing`: "symbolic" or "chat" (tasks/base.py). Problems are generated lazily, on the first
    `problems()` call; a JSONL dataset is read and validated here (`DatasetError`).
    """
    if kind not in _BUILDERS:
        raise ValueError(f"kind must be one of {list(TASK_KINDS)}, got {kind!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    check_range("train_size", train_size, 1, MAX_TRAIN_SIZE)
    check_range("eval_size", eval_size, 1, MAX_EVAL_SIZE)
    check_range("digits", digits, 1, MAX_DIGITS)
    check_range("countdown_numbers", countdown_numbers, 3, 6)
    check_range("countdown_max_number", countdown_max_number, 2, 1000)
    return _BUILDERS[kind](seed=seed, train_size=train_size, eval_size=eval_size, digits=digits,
                           countdown_numbers=countdown_numbers, countdown_max_number=countdown_max_number,
                           train_path=train_path, eval_path=eval_path, phrasing=check_phrasing(phrasing))
