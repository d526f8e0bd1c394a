"""Checks of what a valid spec points at, made before any heavy import (torch, transformers, vLLM, gRPC).

`JobSpec` validation (config.py) checks the spec's own values; this module checks that the spec can run
here: its datasets read and are large enough for the split it asks for, its model files exist, the task
can do the SFT the spec asks for, the token budgets fit the model's positions, and the engine is
installed. Every problem is reported, one line each naming the field and what is allowed, so that
`scalerl run/sft` refuses a bad spec in well under a second of CPU and with nothing written.

Only the standard library, `scalerl.config`, `scalerl.tasks` (plain Python) and `scalerl.model.sources`
(paths only) are imported here; `tests/unit/core/test_cli_bad_input.py` measures a refusal's CPU time and
peak memory in a real process.
"""

from __future__ import annotations

import json
from pathlib import Path

from scalerl.config import JobSpec, SpecError
from scalerl.generator.factory import engine_problem
from scalerl.tasks.registry import TASK_KINDS, plugin_task_problem, task_from_config


def _dataset_problems(spec: JobSpec) -> list[str]:
    """A JSONL task's files: readable, valid, and large enough for the held-out split."""
    from scalerl.tasks.jsonl import DatasetError, validate_jsonl

    t, problems, records = spec.task, [], {}
    for field in ("train_path", "eval_path"):
        path = getattr(t, field)
        if path is None:
            continue
        try:
            records[field] = validate_jsonl(path)
        except DatasetError as exc:
            problems.append(f"task.{field}: {exc}")
    n = records.get("train_path")
    if t.eval_path is None and n is not None and t.eval_size >= n:
        problems.append(f"task.eval_size: {t.eval_size} held-out prompts cannot come out of the {n} records of "
                        f"{t.train_path} and leave any to train on; allowed: 1 to {n - 1} (e.g. {max(1, n // 5)}), "
                        "or task.eval_path: a separate held-out file")
    return problems


def _code_task_problems(spec: JobSpec) -> list[str]:
    """A code task's datasets and eval set, read and checked (one line, naming the field)."""
    from scalerl.tasks.jsonl import DatasetError

    try:
        task_from_config(spec.task)
    except DatasetError as exc:
        in_eval = bool(spec.task.eval_path) and str(exc).startswith(str(spec.task.eval_path))
        return [f"{'task.eval_path' if in_eval else 'task.train_path'}: {exc}"]
    except ValueError as exc:
        return [f"task: {exc}"]
    return []


def _sft_problem(spec: JobSpec) -> str | None:
    """SFT asked for, with no `model.init_checkpoint` to start from, on a task without gold chains of thought
    (`Task.has_solutions`): a JSONL dataset, a built-in task in chat phrasing, a plugin's task that has none."""
    steps, kind = spec.sft.steps, spec.task.kind
    if steps <= 0 or spec.model.init_checkpoint is not None:
        return None
    if kind == "jsonl":
        why = "its records hold a prompt and an answer"
    elif kind == "code" and spec.task.train_path:
        why = "task.train_path's records hold tests, not solutions; the generated problems have them"
    else:
        try:
            task = task_from_config(spec.task)
        except ValueError:  # a plugin's task that cannot be built: plugin_task_problem names why
            return None
        if task.has_solutions:
            return None
        why = ("in task.phrasing 'chat', for instruct models; the symbolic phrasing has them" if kind in TASK_KINDS
               else "the plugin's Task.has_solutions is False")
    return (f"sft.steps: {steps} SFT steps asked for, but task kind {kind!r} has no gold solutions to imitate "
            f"({why}); allowed: sft.steps: 0 (RL from the model as it is: give model.path a model that can answer) "
            "or model.init_checkpoint: an SFT'd model folder")


def _folder_positions(folder: Path) -> int | None:
    """max_position_embeddings (or n_positions) of a Hugging Face folder's config.json, if it says."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = config.get("max_position_embeddings", config.get("n_positions")) if isinstance(config, dict) else None
    return value if isinstance(value, int) and value > 0 else None


def _model_positions(spec: JobSpec) -> tuple[int, str] | None:
    """(positions, which setting says so) of the model RL starts from, when known without loading it."""
    m = spec.model
    if m.init_checkpoint is not None:
        n = _folder_positions(Path(m.init_checkpoint))
        return None if n is None else (n, f"max_position_embeddings of {m.init_checkpoint}/config.json")
    if m.path is None:
        return m.tiny.max_positions, "model.tiny.max_positions"
    local = Path(m.path).expanduser()
    n = _folder_positions(local) if local.is_dir() else None  # a .gguf or a package file: known once converted
    return None if n is None else (n, f"max_position_embeddings of {m.path}/config.json")


def _budget_problem(spec: JobSpec) -> str | None:
    """The thinking and answer budgets, and the interruption phrase forced at a cut (`length_control:
    interruption`), must leave room for the prompt within the model's positions. The phrase is bounded by
    its UTF-8 byte count, as `scalerl.bus.validate.Limits.from_spec` bounds it: no tokenizer makes more
    tokens than bytes (byte-level BPE included), and the tokenizer is not loaded here."""
    known = _model_positions(spec)
    if known is None:
        return None
    positions, source = known
    g = spec.generation
    phrase = len(g.interruption.phrase.encode("utf-8")) if g.length_control == "interruption" else 0
    total = g.thinking_budget_tokens + g.answer_budget_tokens + phrase
    if total < positions:
        return None
    names = "generation.thinking_budget_tokens + generation.answer_budget_tokens"
    terms = f"{g.thinking_budget_tokens} + {g.answer_budget_tokens}"
    if phrase:
        names += " + generation.interruption.phrase"
        terms += f" + {phrase} (the phrase's UTF-8 bytes, the most tokens it can take)"
    return (f"{names}: {terms} = {total} tokens do not fit the model's {positions} positions ({source}), which "
            f"also hold the prompt; allowed: a sum less than {positions} tokens minus the prompt's "
            "(examples/quickstart.yaml: 48 + 8 + 81 with interruption.window_tokens [40, 48] and the default "
            "phrase), a shorter phrase, or a model with more positions")


def _model_problems(spec: JobSpec) -> list[str]:
    from scalerl.model.sources import ModelSourceError, check_model_path

    problems = []
    if spec.model.path is not None:
        try:
            check_model_path(spec.model.path)
        except ModelSourceError as exc:
            problems.append(f"model.path: {exc}")
    init = spec.model.init_checkpoint
    if init is not None and not (Path(init) / "config.json").is_file():
        problems.append(f"model.init_checkpoint: {init} is not a Hugging Face model folder (no config.json)")
    return problems


def task_problems(spec: JobSpec) -> list[str]:
    """Why the spec's task cannot be built here: its datasets, HumanEval for code, a plugin's settings."""
    problems = []
    if spec.task.kind == "jsonl":
        problems += _dataset_problems(spec)
    if spec.task.kind == "code":
        problems += _code_task_problems(spec)
    if (problem := plugin_task_problem(spec.task)) is not None:
        problems.append(problem)
    return problems


def spec_problems(spec: JobSpec) -> list[str]:
    """Every reason this valid spec cannot run here (one line each, naming the field), in field order."""
    problems = _model_problems(spec) + task_problems(spec)
    for problem in (_sft_problem(spec), _budget_problem(spec), engine_problem(spec)):
        if problem is not None:
            problems.append(problem)
    return problems


def check_spec(spec: JobSpec) -> None:
    """Raise SpecError listing every problem of `spec_problems`, one line each."""
    problems = spec_problems(spec)
    if problems:
        raise SpecError("\n".join(problems))
