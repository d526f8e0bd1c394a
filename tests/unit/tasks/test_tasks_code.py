"""The code task's pure parts (scalerl.tasks.code, code_grading, code_problems): code extraction, the
tests' instrumentation and summary, decontamination, the JSONL format's errors, HumanEval from the
package, generated problems and the spec fields. The sandboxed grading itself: tests/integration/test_code_task.py."""

from __future__ import annotations

import ast
import json

import pytest

from scalerl.config import JobSpec
from scalerl.tasks import build_task
from scalerl.tasks.code import CodeTask, decontaminate, humaneval_records, read_code_jsonl
from scalerl.tasks.code_grading import CodeReference, extract_code, harness_input, instrument_tests, read_summary
from scalerl.tasks.code_problems import build, problem_space
from scalerl.tasks.jsonl import DatasetError
from scalerl.tasks.registry import task_from_config

PRELUDE = 'def add(a, b):\n    """Return a + b."""\n'
TESTS = ("def check(candidate):\n    assert candidate(1, 2) == 3\n"
         "    for i in range(3):\n        assert candidate(i, 0) == i\n")


def test_extract_code_takes_the_last_fenced_block_after_thinking() -> None:
    text = ("<think>try ```python\nwrong()\n```</think>Here:\n```python\ndef f():\n    return 1\n```\n"
            "and ```py\nx = 2\n```")
    assert extract_code(text) == "x = 2\n"
    assert extract_code("    return a + b\n") == "    return a + b\n"  # a body continuation, no fence
    assert extract_code("<think>only thoughts</think>  \n") is None
    assert extract_code("```python\ndef f():\n    pass") == "def f():\n    pass"  # cut before the closing fence


def test_every_assert_is_counted_and_the_next_still_runs() -> None:
    source, n = instrument_tests(TESTS)
    assert n == 2  # two assert statements, one inside a loop
    tree = ast.parse(source)
    assert not any(isinstance(node, ast.Assert) and not _inside_try(tree, node) for node in ast.walk(tree))
    passed: set[int] = set()
    failed: set[int] = set()
    ns = {"__scalerl_record__": lambda i, ok, e=None: (passed if ok else failed).add(i),
          "__scalerl_Exception__": Exception}
    exec(compile(source, "t", "exec"), ns)
    ns["check"](lambda a, b: a + b if a != 2 else -1)  # wrong for (2, 0) only: the loop goes on
    assert passed == {0, 1} and failed == {1}


def _inside_try(tree: ast.AST, target: ast.AST) -> bool:
    return any(isinstance(n, ast.Try) and target in n.body for n in ast.walk(tree))


def test_the_summary_needs_the_nonce_and_no_failure() -> None:
    nonce = "ab" * 16
    assert read_summary(f"noise\n{nonce} DONE [0,1] []\n", nonce, 2) == ("pass", 1.0, "")
    verdict, fraction, detail = read_summary(f"{nonce} DONE [0,1] [1]\n", nonce, 2)
    assert (verdict, fraction) == ("fail", 0.5) and "1 of 2" in detail
    # a forged line without the nonce, or nothing at all (an early exit with status 0): not a pass
    assert read_summary("deadbeef DONE [0,1] []\n", nonce, 2)[0] == "error"
    assert read_summary("", nonce, 2)[0] == "error"
    assert read_summary(f'{nonce} RAISED program "NameError: x"\n', nonce, 2)[:2] == ("error", 0.0)
    assert read_summary(f"{nonce} DONE [0,", nonce, 2)[0] == "error"  # cut by the output limit


def test_harness_input_carries_a_fresh_nonce_and_the_program() -> None:
    ref = CodeReference(PRELUDE, TESTS, "add")
    n1, stdin, n = harness_input(ref, "    return a + b\n")
    n2, _, _ = harness_input(ref, "    return a + b\n")
    assert n1 != n2 and len(n1) == 32 and n == 2
    first, _, rest = stdin.partition("\n")
    files = json.loads(rest)
    assert first == n1 and files["program"].startswith(PRELUDE) and files["entry_point"] == "add"


def test_decontamination_drops_shared_names_prompts_and_13_word_runs() -> None:
    held = [CodeReference('def rotate(s):\n    """Move every letter of the string one place to the right and wrap '
                          'the last one around to the front."""\n', TESTS, "rotate")]
    train = [
        CodeReference("def rotate(x):\n    pass\n", TESTS, "rotate"),  # same function name
        CodeReference('def spin(s):\n    """Please move every letter of the string one place to the right and '
                      'wrap the last one around."""\n', TESTS, "spin"),  # a 13-word run in common
        CodeReference('def spin(s):\n    """Move each letter one place right."""\n', TESTS, "spin"),  # kept
    ]
    assert decontaminate(train, held) == ([2], 2)


def test_code_jsonl_errors_name_the_file_line_and_field(tmp_path) -> None:
    def bad(obj: object) -> str:
        path = tmp_path / "d.jsonl"
        path.write_text(json.dumps(obj) + "\n")
        with pytest.raises(DatasetError) as info:
            read_code_jsonl(path)
        return str(info.value)

    good = {"prompt": PRELUDE, "tests": TESTS, "entry_point": "add"}
    assert "d.jsonl:1" in bad({**good, "entry_point": "no such"}) and "identifier" in bad({**good, "entry_point": "1x"})
    assert "does not define the entry point" in bad({**good, "entry_point": "sub"})
    assert '"tests" must define check' in bad({**good, "tests": "assert True\n"})
    assert '"tests" is not valid Python' in bad({**good, "tests": "def check(:\n"})
    assert '"prompt" must be a non-empty string' in bad({**good, "prompt": ""})
    path = tmp_path / "ok.jsonl"
    path.write_text(json.dumps({**good, "task_id": "mine/0"}) + "\n\n" + json.dumps(good) + "\n")
    assert [pid for pid, _ in read_code_jsonl(path)] == ["mine/0", None]


def test_humaneval_comes_from_the_package_and_eval_size_takes_a_seeded_subset() -> None:
    records = humaneval_records()
    assert len(records) == 164 and records[0]["task_id"] == "HumanEval/0"
    full = build_task("code", seed=0, train_size=10)
    assert len(full.problems("eval")) == 164 and full.problems("eval")[0].id == "HumanEval/0"
    sub = [p.id for p in build_task("code", seed=1, train_size=10, eval_size=20).problems("eval")]
    assert len(set(sub)) == 20 and sub == [p.id for p in build_task("code", seed=1, train_size=10,
                                                                    eval_size=20).problems("eval")]
    with pytest.raises(ValueError, match="eval_size: at most 164"):
        build_task("code", seed=0, train_size=10, eval_size=165)
    # the spec: unset eval_size is all of HumanEval; set, a subset
    assert len(task_from_config(JobSpec(name="c", task={"kind": "code"}).task).problems("eval")) == 164
    assert len(task_from_config(JobSpec(name="c", task={"kind": "code", "eval_size": 8}).task).problems("eval")) == 8


def test_generated_problems_are_deterministic_clean_and_carry_their_solution() -> None:
    assert problem_space() > 250
    a, b = (CodeTask(seed=3, train_size=400, eval_size=None).problems("train") for _ in range(2))
    assert [p.prompt for p in a] == [p.prompt for p in b] and len(a) == 400
    other = CodeTask(seed=4, train_size=400, eval_size=None).problems("train")
    assert [p.prompt for p in other] != [p.prompt for p in a]
    eval_names = {r["entry_point"] for r in humaneval_records()}
    for p in a[:50]:
        ref = CodeReference.from_answer(p.answer)
        assert ref.entry_point not in eval_names and p.prompt == ref.prelude  # symbolic: the code alone
        assert p.solution.startswith("<think>") and f"def {ref.entry_point}(" in p.solution
    g = build((0, (3,)))
    scope: dict = {}
    exec(g.solution + g.tests, scope)
    scope["check"](scope[g.entry_point])  # the generated tests hold for the reference solution
    assert g.tests.count("assert") == 6


def test_chat_phrasing_asks_for_a_fenced_function() -> None:
    p = build_task("code", seed=0, train_size=5, eval_size=3, phrasing="chat").problems("eval")[0]
    assert p.prompt.startswith("Complete the following Python function") and "```python\n" in p.prompt
    assert CodeReference.from_answer(p.answer).prelude in p.prompt


def test_spec_fields_of_the_code_task_are_checked() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="code_wall_s"):
        JobSpec(name="c", task={"kind": "code", "code_wall_s": 0})
    with pytest.raises(ValidationError, match="code_memory_mb"):
        JobSpec(name="c", task={"kind": "code", "code_memory_mb": 8})
    task = task_from_config(JobSpec(name="c", task={"kind": "code", "code_wall_s": 2.5, "code_memory_mb": 256}).task)
    assert isinstance(task, CodeTask)
    assert (task.limits.wall_s, task.limits.cpu_s, task.limits.memory_bytes) == (2.5, 2, 256 << 20)


def test_the_example_spec_passes_its_checks_and_a_bad_dataset_is_named(tmp_path) -> None:
    from pathlib import Path

    from scalerl.config import load_spec
    from scalerl.runtime.preflight import spec_problems

    example = Path(__file__).resolve().parents[3] / "examples" / "code.yaml"
    spec = load_spec(str(example), [])
    assert spec_problems(spec) == []
    assert len(task_from_config(spec.task).problems("eval")) == 32
    bad = tmp_path / "train.jsonl"
    bad.write_text(json.dumps({"prompt": PRELUDE, "tests": "assert True\n", "entry_point": "add"}) + "\n")
    spec = load_spec(str(example), [f"task.train_path={bad}"])
    assert [p for p in spec_problems(spec) if p.startswith("task.")] == [
        f'task.train_path: {bad}:1: "tests" must define check(candidate)']
