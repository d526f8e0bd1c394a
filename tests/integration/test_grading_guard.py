"""A scorer that never returns cannot hang the verifier (scalerl/verifier/guard.py), with real processes.

A plugin task whose grade loops forever on one completion and sleeps inside C code on another (both
unbounded, as a buggy or hostile scorer can be) is graded through `Verifier.from_spec`: each such
completion comes back wrong with the verdict `timeout` within its `task.grade_time_limit_s`, the next
completion is graded correctly by a fresh child, and a scorer that raises gives the verdict `error`.
Tasks bounded by construction (arithmetic, code) grade in process, without a child.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from plugin_dist import forget_modules, write_dist
from scalerl.config import JobSpec
from scalerl.tasks import build_task
from scalerl.verifier.verifier import Verifier

LIMIT_S = 1.5
STALL_TASK = """
import time
from scalerl.tasks import AdditionTask


class Stall(AdditionTask):
    grading_is_bounded = False  # (the default for a plugin: stated for the reader)

    def __init__(self, *, seed, train_size, eval_size, phrasing, options):
        super().__init__(digits=1, seed=seed, train_size=train_size, eval_size=eval_size, phrasing=phrasing)

    def is_correct(self, completion, answer):
        if completion == "loop":
            while True:
                pass
        if completion == "sleep":
            time.sleep(3600)  # inside C: no Python-level interrupt would reach it
        if completion == "raise":
            raise RuntimeError("a scorer bug")
        return completion == "ok"
"""


@pytest.fixture
def stall_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    root = write_dist(tmp_path / "site", "stall-plugin", {"scalerl.tasks": {"stall": "stall_task:Stall"}},
                      {"stall_task.py": STALL_TASK})
    monkeypatch.syspath_prepend(str(root))  # the spawned child inherits sys.path
    yield
    forget_modules("stall_task")


def test_a_scorer_that_never_returns_times_out_and_the_next_completion_is_graded(stall_plugin) -> None:
    spec = JobSpec(name="stall", task={"kind": "stall", "grade_time_limit_s": LIMIT_S, "train_size": 5,
                                       "eval_size": 2})
    from scalerl.tasks.registry import task_from_config

    verifier = Verifier.from_spec(spec, task_from_config(spec.task))
    assert verifier.guard is not None
    try:
        assert verifier.grade("ok", "x").verdict == "correct"  # starts the child (not counted in the limit)
        for hang in ("loop", "sleep"):
            t0 = time.monotonic()
            g = verifier.grade(hang, "x")
            took = time.monotonic() - t0
            assert (g.correct, g.verdict) == (False, "timeout"), g
            assert LIMIT_S <= took < LIMIT_S + 2.0, f"{hang}: {took:.2f} s"
            assert "task.grade_time_limit_s" in g.detail
            assert verifier.grade("ok", "x").correct  # a new child took over
        g = verifier.grade("raise", "x")
        assert (g.correct, g.verdict) == (False, "error") and "a scorer bug" in g.detail
        assert verifier.grade("nope", "x").verdict in ("wrong", "no_answer")
        assert (verifier.guard.timeouts, verifier.guard.starts) == (2, 3)
        assert verifier.verdicts["timeout"] == 2
    finally:
        verifier.close()


def test_bounded_tasks_grade_in_process_and_a_jsonl_task_is_guarded(tmp_path: Path) -> None:
    for kind in ("addition", "countdown", "code"):
        spec = JobSpec(name="b", task={"kind": kind, "train_size": 5, "eval_size": 2})
        task = build_task(kind, train_size=5, eval_size=2)
        assert task.grading_is_bounded and Verifier.from_spec(spec, task).guard is None
    data = tmp_path / "math.jsonl"
    data.write_text("".join(f'{{"prompt": "What is {i}+{i}?", "answer": {2 * i}}}\n' for i in range(10)))
    spec = JobSpec(name="j", task={"kind": "jsonl", "train_path": str(data), "eval_size": 2})
    from scalerl.tasks.registry import task_from_config

    verifier = Verifier.from_spec(spec, task_from_config(spec.task))
    try:
        assert verifier.guard is not None and verifier.guard.time_limit_s == 10.0
        assert verifier.grade("The answer is \\boxed{4}", "4").correct
        assert verifier.grade("The answer is \\boxed{5}", "4").verdict == "wrong"
    finally:
        verifier.close()
