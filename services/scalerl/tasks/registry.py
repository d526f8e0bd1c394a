"""`build_task`: one entry point from the `task` section of a job spec to a `Task`.

Kinds dispatch through `_BUILDERS` (one small function each), not an if/elif ladder; any other kind
is a plugin's, found in the `scalerl.tasks` entry-point group (scalerl/plugins.py). Every bad value
raises ValueError naming the parameter and what is allowed, so a direct caller (tests, the CLI's
`eval`) gets the same quality of message as `JobSpec` validation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from scalerl.config import TaskConfig
from scalerl.plugins import PluginError, check_options, load_task_plugin, options_problems
from scalerl.tasks.arithmetic import MAX_DIGITS, MAX_MULTIPLIER_DIGITS, AdditionTask, MultiplicationTask
from scalerl.tasks.base import Task, check_phrasing, check_range
from scalerl.tasks.code import CodeTask
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
                              eval_size=kw["eval_size"], phrasing=kw["phrasing"],
                              multiplier_digits=kw["multiplier_digits"])


def _countdown(**kw: Any) -> Task:
    return CountdownTask(num_numbers=kw["countdown_numbers"], max_number=kw["countdown_max_number"],
                         seed=kw["seed"], train_size=kw["train_size"], eval_size=kw["eval_size"],
                         phrasing=kw["phrasing"])


def _jsonl(**kw: Any) -> Task:
    if not kw["train_path"]:
        raise ValueError("train_path is required when kind is 'jsonl'")
    return JsonlTask(train_path=kw["train_path"], eval_path=kw["eval_path"] or None,
                     eval_size=kw["eval_size"], seed=kw["seed"], phrasing=kw["phrasing"])


def _code(**kw: Any) -> Task:
    from scalerl.sandbox import Limits

    limits = Limits.from_spec(kw["code_wall_s"], kw["code_memory_mb"])
    return CodeTask(seed=kw["seed"], train_size=kw["train_size"], eval_size=kw["eval_size_given"],
                    train_path=kw["train_path"] or None, eval_path=kw["eval_path"] or None,
                    phrasing=kw["phrasing"], limits=limits)


_BUILDERS: dict[str, Callable[..., Task]] = {
    "addition": _addition,
    "multiplication": _multiplication,
    "countdown": _countdown,
    "jsonl": _jsonl,
    "code": _code,
}
TASK_KINDS: tuple[str, ...] = tuple(_BUILDERS)


def build_task(
    kind: str,
    *,
    seed: int = 0,
    train_size: int = 20_000,
    eval_size: int | None = None,
    digits: int = 3,
    multiplier_digits: int = 1,
    countdown_numbers: int = 4,
    countdown_max_number: int = 25,
    train_path: str | Path | None = None,
    eval_path: str | Path | None = None,
    phrasing: str = "symbolic",
    options: Mapping[str, Any] | None = None,
    code_wall_s: float = 10.0,
    code_memory_mb: int = 512,
) -> Task:
    """The task `kind` ("addition", "multiplication", "countdown", "jsonl", "code" or a plugin's) with these settings.

    Generated kinds ignore the paths; "jsonl" ignores the generator settings and `train_size`
    (the file decides) and needs `train_path`. A plugin task gets `seed`, `train_size`, `eval_size`,
    `phrasing` and its `options` (plugins.py); the other settings are the built-in kinds'.
    "code" takes the paths (both optional: generated training problems, HumanEval to evaluate; an
    `eval_size` left None means all of HumanEval) and its sandbox limits, `code_wall_s` and `code_memory_mb`.
    `eval_size` None is 200 for the other kinds. `phrasing`: "symbolic" or "chat" (tasks/base.py).
    Problems are generated lazily, on the first `problems()` call; a JSONL dataset is read and validated
    here (`DatasetError`).
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    check_range("train_size", train_size, 1, MAX_TRAIN_SIZE)
    eval_size_given = eval_size
    eval_size = 200 if eval_size is None else eval_size
    check_range("eval_size", eval_size, 1, MAX_EVAL_SIZE)
    if not (isinstance(code_wall_s, int | float) and 0.1 <= code_wall_s <= 600):
        raise ValueError(f"code_wall_s must be a number of seconds in [0.1, 600], got {code_wall_s!r}")
    check_range("code_memory_mb", code_memory_mb, 16, 65536)
    check_range("digits", digits, 1, MAX_DIGITS)
    check_range("multiplier_digits", multiplier_digits, 1, MAX_MULTIPLIER_DIGITS)
    check_range("countdown_numbers", countdown_numbers, 3, 6)
    check_range("countdown_max_number", countdown_max_number, 2, 1000)
    if kind not in _BUILDERS:
        return _plugin_task(kind, seed=seed, train_size=train_size, eval_size=eval_size,
                            phrasing=check_phrasing(phrasing), options=options or {})
    if options:
        raise ValueError(f"options: only plugin tasks take options; kind {kind!r} is built in")
    return _BUILDERS[kind](seed=seed, train_size=train_size, eval_size=eval_size, digits=digits,
                           multiplier_digits=multiplier_digits,
                           countdown_numbers=countdown_numbers, countdown_max_number=countdown_max_number,
                           train_path=train_path, eval_path=eval_path, phrasing=check_phrasing(phrasing),
                           eval_size_given=eval_size_given, code_wall_s=code_wall_s, code_memory_mb=code_memory_mb)


def task_from_config(t: TaskConfig) -> Task:
    """The task of a job spec's `task` section; its problems and split depend on `data_seed` only."""
    eval_size = t.eval_size if "eval_size" in t.model_fields_set or t.kind != "code" else None
    return build_task(t.kind, seed=t.data_seed, train_size=t.train_size, eval_size=eval_size, digits=t.digits,
                      multiplier_digits=t.multiplier_digits, countdown_numbers=t.countdown_numbers,
                      countdown_max_number=t.countdown_max_number,
                      train_path=t.train_path, eval_path=t.eval_path, phrasing=t.phrasing, options=t.options,
                      code_wall_s=t.code_wall_s, code_memory_mb=t.code_memory_mb)


def plugin_task_problem(t: TaskConfig) -> str | None:
    """Why a plugin task cannot be built with these settings (one line naming `task`), or None; None for
    the built-in kinds, whose settings JobSpec validation and the dataset checks cover."""
    if t.kind in TASK_KINDS:
        return None
    try:
        task_from_config(t)
    except ValueError as exc:
        return f"task: {exc}"
    return None


def _plugin_task(kind: str, *, options: Mapping[str, Any], **settings: Any) -> Task:
    """The plugin task `kind` (entry-point group `scalerl.tasks`), built and checked to be a `Task`."""
    try:
        factory = load_task_plugin(kind, TASK_KINDS)
        checked = check_options(kind, factory, options)
    except PluginError as exc:
        raise ValueError(f"kind: {exc}") from None
    except ValidationError as exc:
        raise ValueError(options_problems(exc)) from None
    task = factory(**settings, options=checked)
    if not isinstance(task, Task):
        raise ValueError(f"kind: plugin task {kind!r} built a {type(task).__name__}, not a scalerl.tasks.Task")
    return task
