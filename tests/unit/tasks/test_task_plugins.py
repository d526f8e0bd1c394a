"""Tasks from other packages (`scalerl.tasks` entry points): found, validated, built, refused clearly.

The example plugin (examples/plugin, `reverse`) and a few broken ones are "installed" as dist-info
folders in the test's own temporary folder put on `sys.path` (tests/plugin_dist.py), so the shared
environment is never changed and nothing is left behind.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from plugin_dist import REPO, forget_modules, install_example_plugin, write_dist
from scalerl.config import TASK_KINDS, SpecError, spec_from_dict
from scalerl.plugins import task_plugin_names
from scalerl.tasks import Task, build_task

BUILTIN = "addition, multiplication, countdown, jsonl, code (built in)"


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The example plugin plus broken ones, on sys.path for this test only."""
    root = install_example_plugin(tmp_path / "site")
    write_dist(tmp_path / "site", "broken-plugins", {"scalerl.tasks": {
        "no_options": "broken_tasks:NoOptions",
        "not_a_task": "broken_tasks:not_a_task",
        "missing": "no_such_module:Task",
        "twice": "broken_tasks:NoOptions",
        "addition": "broken_tasks:not_a_task",  # shadowed by the built-in kind, never loaded
    }}, {"broken_tasks.py": (
        "from scalerl.tasks import AdditionTask\n"
        "class NoOptions(AdditionTask):\n"
        "    def __init__(self, *, seed, train_size, eval_size, phrasing, options):\n"
        "        assert options is None\n"
        "        super().__init__(digits=1, seed=seed, train_size=train_size, eval_size=eval_size, phrasing=phrasing)\n"
        "def not_a_task(**kw):\n"
        "    return 'a string'\n")})
    write_dist(tmp_path / "site", "other-twice", {"scalerl.tasks": {"twice": "other_module:Twice"}})
    monkeypatch.syspath_prepend(str(root))
    yield root
    forget_modules("scalerl_reverse", "broken_tasks")


def _refusal(task: dict) -> str:
    with pytest.raises(SpecError) as exc:
        spec_from_dict({"task": task})
    return str(exc.value)


def test_plugin_names_leave_out_builtins(plugins) -> None:
    assert task_plugin_names(TASK_KINDS) == ("missing", "no_options", "not_a_task", "reverse", "twice")


def test_unknown_kind_lists_builtins_and_installed_plugins(plugins) -> None:
    assert _refusal({"kind": "subtraction"}) == (
        f"task.kind: unknown task kind; allowed: {BUILTIN}, or a plugin task (missing, no_options, not_a_task, "
        "reverse, twice; entry-point group scalerl.tasks) (got 'subtraction')")


def test_unknown_kind_without_plugins() -> None:
    assert _refusal({"kind": "reverse"}) == (
        f"task.kind: unknown task kind; allowed: {BUILTIN}, or a plugin task (none installed; entry-point group "
        "scalerl.tasks) (got 'reverse')")


def test_plugin_kind_and_its_options_are_validated(plugins) -> None:
    spec = spec_from_dict({"task": {"kind": "reverse", "options": {"length": 3}}})
    assert spec.task.kind == "reverse" and spec.task.options == {"length": 3}
    assert _refusal({"kind": "reverse", "options": {"length": 30}}).startswith(
        "task.options.length: Input should be less than or equal to 12 (got 30)")
    assert _refusal({"kind": "reverse", "options": {"colour": "red"}}).startswith(
        "task.options.colour: unknown field")


def test_options_are_refused_where_nothing_reads_them(plugins) -> None:
    assert _refusal({"kind": "addition", "options": {"digits": 2}}) == (
        "task.options: only plugin tasks take options; task.kind 'addition' is built in (set its task.* fields)")
    assert _refusal({"kind": "no_options", "options": {"x": 1}}).startswith(
        "task.options: plugin task 'no_options' takes no options (it declares no Options model); got ['x']")
    assert isinstance(build_task("no_options", train_size=5, eval_size=2), Task)


def test_broken_plugins_are_refused_in_one_line(plugins) -> None:
    missing = _refusal({"kind": "missing"})
    assert missing.startswith("task.kind: plugin task 'missing' (no_such_module:Task) cannot be loaded: "
                              "ModuleNotFoundError: No module named 'no_such_module'")
    assert "\n" not in missing
    twice = _refusal({"kind": "twice"})
    assert twice.startswith("task.kind: plugin task 'twice' is registered twice: ") and "uninstall one" in twice
    with pytest.raises(ValueError, match=r"kind: plugin task 'not_a_task' built a str, not a scalerl\.tasks\.Task"):
        build_task("not_a_task")


def test_the_example_plugin_builds_a_task(plugins) -> None:
    task = build_task("reverse", seed=3, train_size=50, eval_size=5, options={"length": 3, "letters": 4})
    train, held = task.problems("train"), task.problems("eval")
    assert len(train) == 50 and len(held) == 5
    assert not {p.prompt for p in train} & {p.prompt for p in held}
    p = held[0]
    word = p.prompt.removeprefix("rev ").removesuffix("=")
    assert len(word) == 3 and set(word) <= set("abcd") and p.answer == word[::-1]
    assert p.solution == f"<think>{' '.join(word[::-1])}</think>{word[::-1]}"
    assert task.is_correct(p.solution, p.answer) and not task.is_correct(f"<think></think>{word}x", p.answer)
    # the data seed decides the problems
    assert build_task("reverse", seed=3, train_size=50, eval_size=5).problems("eval") != held
    with pytest.raises(ValueError, match=r"options.length: Input should be less than or equal to 12 \(got 13\)"):
        build_task("reverse", options={"length": 13})


def test_a_bad_kind_is_refused_without_importing_torch(plugins, tmp_path: Path) -> None:
    """Real processes: `scalerl run` exits 2 with one line naming task.kind and the installed plugin; the spec's
    validation that refuses it (plugin discovery included) imports no torch."""
    spec = tmp_path / "bad.yaml"
    spec.write_text("task:\n  kind: revers\n")
    env = {"PYTHONPATH": f"{plugins}:{REPO / 'services'}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "scalerl.cli", "run", str(spec), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and "error: task.kind: unknown task kind; allowed: " in proc.stderr
    assert "reverse" in proc.stderr and not (tmp_path / "out").exists()
    probe = ("import sys\nfrom scalerl.config import SpecError, load_spec\n"
             "try:\n    load_spec(sys.argv[1])\nexcept SpecError as exc:\n    print(exc)\n"
             "print('torch imported:', 'torch' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", probe, str(spec)], capture_output=True, text=True, timeout=120,
                          env=env, check=True)
    assert proc.stdout.splitlines()[1:] == ["torch imported: False"], proc.stdout


def test_spec_with_a_plugin_task_round_trips(plugins) -> None:
    spec = spec_from_dict({"task": {"kind": "reverse", "options": {"letters": 5}}})
    again = spec_from_dict(json.loads(spec.model_dump_json()))
    assert again.task == spec.task


NO_SOLUTIONS = '''
from scalerl.tasks import Problem, Task

class NoSolutions(Task):
    """Prompts and answers only (says nothing of its solutions: Task.has_solutions looks at the problems)."""
    name = "nosol"

    def __init__(self, *, seed, train_size, eval_size, phrasing, options):
        self.sizes = {"train": train_size, "eval": eval_size}

    def problems(self, split):
        start = 0 if split == "train" else 10_000
        return [Problem(id=f"{split}-{i}", prompt=f"{i}+1=", answer=str(i + 1), solution="")
                for i in range(start, start + self.sizes[split])]

    def is_correct(self, completion, answer):
        return completion.rpartition("</think>")[2].strip() == answer
'''
# budgets that fit the tiny model's positions, so that SFT is the spec's only problem
BUDGETS = {"thinking_budget_tokens": 48, "answer_budget_tokens": 8, "interruption": {"window_tokens": [40, 48]}}


def test_sft_of_a_plugin_task_without_gold_solutions_is_refused(plugins) -> None:
    """Like SFT of a JSONL task: refused when the spec is checked, not skipped with a warning (before: the run
    started and skipped SFT). `Task.has_solutions` says; by default it looks at the training problems."""
    from scalerl.runtime.preflight import spec_problems

    write_dist(plugins, "no-solutions", {"scalerl.tasks": {"no_solutions": "no_solutions:NoSolutions"}},
               {"no_solutions.py": NO_SOLUTIONS})
    try:
        tree = {"generation": BUDGETS, "task": {"kind": "no_solutions", "train_size": 20, "eval_size": 5}}
        assert spec_problems(spec_from_dict(tree)) == [
            "sft.steps: 300 SFT steps asked for, but task kind 'no_solutions' has no gold solutions to imitate "
            "(the plugin's Task.has_solutions is False); allowed: sft.steps: 0 (RL from the model as it is: give "
            "model.path a model that can answer) or model.init_checkpoint: an SFT'd model folder"]
        assert spec_problems(spec_from_dict({**tree, "sft": {"steps": 0}})) == []
        assert not build_task("no_solutions", train_size=20, eval_size=5).has_solutions
    finally:
        forget_modules("no_solutions")
    # the example plugin has gold solutions (its own has_solutions says so; the default agrees)
    reverse = {"generation": BUDGETS, "task": {"kind": "reverse", "train_size": 50, "eval_size": 5}}
    assert spec_problems(spec_from_dict(reverse)) == []
    task = build_task("reverse", train_size=50, eval_size=5)
    assert task.has_solutions and Task.has_solutions.fget(task)  # type: ignore[attr-defined]
