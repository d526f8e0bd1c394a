"""Real datasets from JSON Lines files: one `{"prompt": str, "answer": str | number, "id"?: str}` a line.

Loading validates everything up front and fails with `DatasetError`, whose message names the file,
the 1-based line number and what is wrong, so a bad dataset stops a job before any compute is
spent. Blank lines are skipped; other keys are ignored (datasets carry metadata).

Choices:

1. Ids: the record's `"id"` if present, else `"<split>-L<line>"` (e.g. `"train-L17"`), stable as
   long as the file is (held-out eval records keep their `"train-L<line>"`). Duplicate ids across
   both splits are an error.
2. Without `eval_path`, `eval_size` records are held out of the training file by a seeded shuffle;
   with it, the whole eval file is the eval split (`eval_size` is not used).
   With or without it, training records whose prompt is also an eval prompt are dropped, so no
   eval prompt appears in train (decontamination by exact prompt text).
   Chat phrasing (`phrasing="chat"`) appends "Put your final answer in \\boxed{}." to every prompt; the
   answer is read by `extract_math_answer` either way (`\\boxed{}`, `####`, "answer is", else the last
   number: already free-text tolerant).
3. Numeric answers become strings (`2` → `"2"`, `0.5` → `"0.5"`); non-finite numbers and booleans
   are rejected. `solution` is `""`: there is no gold chain of thought.
4. The verifier is `extract_math_answer` + `math_equal` (math_verify, then sympy, then strings).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalerl.tasks.base import Phrasing, Problem, Split, Task, check_phrasing, check_split
from scalerl.tasks.math_answer import extract_math_answer, math_equal


class DatasetError(ValueError):
    """A dataset file that cannot be used; the message names the file and, if any, the line."""


@dataclass(frozen=True, slots=True)
class _Record:
    line: int
    id: str | None
    prompt: str
    answer: str


def _type_name(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


def _parse_record(obj: Any, where: str, line: int) -> _Record:
    if not isinstance(obj, dict):
        raise DatasetError(f"{where}: expected a JSON object, got {_type_name(obj)}")
    if "prompt" not in obj:
        raise DatasetError(f'{where}: missing "prompt"')
    if not isinstance(obj["prompt"], str) or not obj["prompt"].strip():
        raise DatasetError(f'{where}: "prompt" must be a non-empty string, got {_type_name(obj["prompt"])}')
    if "answer" not in obj:
        raise DatasetError(f'{where}: missing "answer"')
    answer = obj["answer"]
    if isinstance(answer, bool) or not isinstance(answer, str | int | float):
        raise DatasetError(f'{where}: "answer" must be a string or a number, got {_type_name(answer)}')
    if isinstance(answer, float) and not math.isfinite(answer):
        raise DatasetError(f'{where}: "answer" must be finite, got {answer}')
    if isinstance(answer, str) and not answer.strip():
        raise DatasetError(f'{where}: "answer" is empty')
    record_id = obj.get("id")
    if record_id is not None and (not isinstance(record_id, str) or not record_id):
        raise DatasetError(f'{where}: "id" must be a non-empty string, got {_type_name(record_id)}')
    return _Record(line=line, id=record_id, prompt=obj["prompt"], answer=str(answer).strip())


def json_lines(path: str | Path) -> list[tuple[int, Any]]:
    """(1-based line number, decoded JSON) of every non-blank line of `path`; `DatasetError` naming the file
    (and line) when it cannot be read, a line is not JSON, or there are none."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DatasetError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DatasetError(f"{path}: cannot read: {e}") from None
    out = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append((number, json.loads(line)))
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path}:{number}: not JSON ({e.msg} at column {e.colno})") from None
    if not out:
        raise DatasetError(f"{path}: no records")
    return out


def read_jsonl(path: str | Path) -> list[_Record]:
    """All records of `path`, validated; raises `DatasetError` on the first problem."""
    return [_parse_record(obj, f"{path}:{number}", number) for number, obj in json_lines(path)]


def validate_jsonl(path: str | Path) -> int:
    """Validate a dataset file up front; the number of records. Raises `DatasetError`."""
    return len(read_jsonl(path))


CHAT_SUFFIX = "\n\nPut your final answer in \\boxed{}."


def _to_problems(records: list[_Record], source: str, suffix: str = "") -> list[Problem]:
    return [Problem(id=r.id or f"{source}-L{r.line}", prompt=r.prompt + suffix, answer=r.answer, solution="")
            for r in records]


class JsonlTask(Task):
    """Math problems from JSONL files, verified with `math_equal` (see the module docstring)."""

    def __init__(self, *, train_path: str | Path, eval_path: str | Path | None, eval_size: int,
                 seed: int, phrasing: Phrasing = "symbolic") -> None:
        suffix = CHAT_SUFFIX if check_phrasing(phrasing) == "chat" else ""
        self.name = f"jsonl:{Path(train_path).stem}"
        train = read_jsonl(train_path)
        if eval_path is not None:
            eval_records = read_jsonl(eval_path)
        else:
            if eval_size >= len(train):
                raise ValueError(f"eval_size={eval_size} must be smaller than the {len(train)} records "
                                 f"of {train_path} (or give eval_path)")
            held = set(random.Random(f"jsonl/{seed}").sample(range(len(train)), eval_size))
            eval_records = [r for i, r in enumerate(train) if i in held]
            train = [r for i, r in enumerate(train) if i not in held]
        eval_prompts = {r.prompt for r in eval_records}
        train = [r for r in train if r.prompt not in eval_prompts]
        if not train:
            raise DatasetError(f"{train_path}: every training prompt is also an eval prompt")
        # Default ids name the file a record came from: held-out eval records keep "train-L<line>".
        self._problems: dict[Split, list[Problem]] = {
            "train": _to_problems(train, "train", suffix),
            "eval": _to_problems(eval_records, "eval" if eval_path is not None else "train", suffix),
        }
        seen: dict[str, str] = {}
        for split, problems in self._problems.items():
            for p in problems:
                if p.id in seen:
                    raise DatasetError(f"duplicate id {p.id!r} in {split} (first seen in {seen[p.id]})")
                seen[p.id] = split

    def problems(self, split: Split) -> list[Problem]:
        return list(self._problems[check_split(split)])

    @property
    def has_solutions(self) -> bool:
        return False  # a record holds a prompt and an answer, no chain of thought

    def extract_answer(self, completion: str) -> str | None:
        return extract_math_answer(completion)

    def is_correct(self, completion: str, answer: str) -> bool:
        try:
            return math_equal(extract_math_answer(completion), answer)
        except Exception:  # the contract is "never raises"; math_equal already guards its parsers
            return False
