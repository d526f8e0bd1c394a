"""Code tasks graded for real: the completion's code and the tests run in the sandbox (scalerl.sandbox).

HumanEval's own canonical solutions all pass and a wrong one fails with the fraction of asserts it
passed; the generated training problems' gold solutions pass; completions that attack the grader or the
host (an infinite loop, a memory bomb, a socket, a fork bomb, a flood of output, an early exit with
status 0, replacing the names the tests count with) are each wrong with their verdict, within the
task's time limit; `scalerl score` prints one JSON line per completion and refuses a bad file (exit 2)
before grading anything. No server is needed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from scalerl.tasks import build_task, code_problems
from scalerl.tasks.code import CodeTask, humaneval_records
from scalerl.tasks.code_grading import CodeReference
from scalerl.verifier.verifier import Verifier

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux-only")

WALL_S = 5.0


@pytest.fixture(scope="module")
def task() -> CodeTask:
    t = build_task("code", seed=0, train_size=300, code_wall_s=WALL_S)
    assert isinstance(t, CodeTask)
    return t


def _answer(task: CodeTask, pid: str) -> str:
    return next(p.answer for p in task.problems("eval") if p.id == pid)


def test_every_humaneval_canonical_solution_passes(task) -> None:
    records = humaneval_records()
    answers = {p.id: p.answer for p in task.problems("eval")}
    with ThreadPoolExecutor(task.concurrent_grading) as pool:
        grades = list(pool.map(lambda r: task.grade(r["canonical_solution"], answers[r["task_id"]]), records))
    failed = [(r["task_id"], g) for r, g in zip(records, grades, strict=True) if not g.correct]
    assert failed == []
    assert all(g.metrics == {"tests_passed": 1.0} and g.verdict == "pass" for g in grades)


def test_a_wrong_solution_fails_with_the_fraction_of_asserts_it_passed(task) -> None:
    # HumanEval/0 (has_close_elements): 7 asserts, "True" is right for 4 of them
    g = task.grade("    return True\n", _answer(task, "HumanEval/0"))
    assert (g.correct, g.verdict) == (False, "fail")
    assert g.metrics == {"tests_passed": pytest.approx(4 / 7)} and "3 of 7" in g.detail
    # the whole function in a fenced block (chat style) replaces the prelude's
    right = "Sure.\n```python\ndef has_close_elements(numbers, threshold):\n    return any(abs(a - b) < threshold " \
            "for i, a in enumerate(numbers) for b in numbers[i + 1:])\n```\n"
    assert task.grade(right, _answer(task, "HumanEval/0")).correct


def test_the_generated_training_problems_gold_solutions_pass(task) -> None:
    assert len({p.prompt for p in task.problems("train")}) > 250
    # each family with its first and its last parameter values, through the sandbox
    sample = []
    for i, family in enumerate(code_problems._FAMILIES):
        for pick in (0, -1):
            g = code_problems.build((i, tuple(values[pick] for values in family.params.values())))
            sample.append((g.entry_point, CodeReference(g.prelude, g.tests, g.entry_point).to_answer(),
                           f"```python\n{g.solution}```"))
    with ThreadPoolExecutor(task.concurrent_grading) as pool:
        grades = list(pool.map(lambda s: task.grade(s[2], s[1]), sample))
    assert [name for (name, _, _), g in zip(sample, grades, strict=True) if not g.correct] == []
    assert len(sample) == 28


ATTACKS = {
    "timeout": "    while True:\n        pass\n",
    "memory": "    x = bytearray(4 << 30)\n",
    "forbidden": "    import socket\n    socket.create_connection(('1.1.1.1', 53), timeout=1)\n",
    "output_limit": "    print('x' * 10_000_000)\n",
    # an early exit with status 0, before any test ran: no summary, so not a pass
    "error": "import os\nos._exit(0)\n",
}


@pytest.mark.parametrize("verdict", sorted(ATTACKS))
def test_attacks_come_back_wrong_with_their_verdict_within_the_time_limit(task, verdict) -> None:
    answer = _answer(task, "HumanEval/0")
    # the attack runs where the tests call the function (body) or as the program itself (module level)
    t0 = time.monotonic()
    g = task.grade(ATTACKS[verdict], answer)
    took = time.monotonic() - t0
    assert (g.correct, g.verdict) == (False, verdict), g
    assert took < WALL_S + 5, f"graded in {took:.1f} s"
    assert task.grade("    return False\n", answer).verdict == "fail"  # the grader still works afterwards


def test_a_fork_bomb_is_contained() -> None:
    t = build_task("code", seed=0, train_size=5, eval_size=1, code_wall_s=3.0)
    answer = t.problems("eval")[0].answer
    g = t.grade("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n", answer)
    assert not g.correct and g.verdict in ("timeout", "killed", "forbidden"), g


def test_replacing_the_names_the_tests_count_with_does_not_make_a_pass(task) -> None:
    answer = _answer(task, "HumanEval/0")
    cheat = ("__scalerl_record__ = lambda *a: None\n__scalerl_Exception__ = BaseException\n"
             "def has_close_elements(numbers, threshold):\n    return True\n")
    g = task.grade(cheat, answer)
    assert (g.correct, g.verdict) == (False, "fail"), g
    assert Verifier(task).grade(cheat, answer, "length").verdict == "truncated"  # cut: never graded


def test_scalerl_score_prints_one_line_per_completion_and_refuses_bad_input(tmp_path: Path, task) -> None:
    spec = tmp_path / "code.yaml"
    spec.write_text("name: code-check\ntask:\n  kind: code\n  code_wall_s: 5\n")
    train = task.problems("train")[0]
    rows = [{"prompt_id": "HumanEval/0", "completion": humaneval_records()[0]["canonical_solution"]},
            {"prompt_id": "HumanEval/0", "completion": ATTACKS["timeout"]},
            {"prompt": train.prompt, "completion": train.solution},
            {"prompt_id": "HumanEval/0", "completion": "    return True\n", "finish_reason": "length"}]
    good = tmp_path / "c.jsonl"
    good.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cli = [sys.executable, "-m", "scalerl.cli", "score", str(spec)]
    proc = subprocess.run([*cli, str(good)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(r["line"], r["correct"], r["verdict"], r["reward"]) for r in out] == [
        (1, True, "pass", 1.0), (2, False, "timeout", -1.0), (3, True, "pass", 1.0), (4, False, "truncated", -1.0)]
    assert out[2]["prompt_id"] == train.id and out[0]["tests_passed"] == 1.0
    assert WALL_S <= out[1]["seconds"] < WALL_S + 5
    assert "4 completions graded, 2 correct (50.0%)" in proc.stderr

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_id": "nope", "completion": "x"}\nnot json\n'
                   + json.dumps({"prompt_id": "HumanEval/1", "completion": ATTACKS["timeout"], "finish_reason": "eos"})
                   + "\n")
    t0 = time.monotonic()
    proc = subprocess.run([*cli, str(bad)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 3 and all(line.startswith("scalerl score: error: ") for line in lines), proc.stderr
    assert "bad.jsonl:1" in lines[0] and "bad.jsonl:2" in lines[1] and "finish_reason" in lines[2]
    assert time.monotonic() - t0 < 60  # refused before grading (nothing ran into the 5 s limit)
