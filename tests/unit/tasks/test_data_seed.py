"""`task.data_seed` alone decides the problems and the held-out split; the run's `seed` does not.

The held-out sets are compared by their prompts (ids are positions and equal for every seed) and by
`problem_set_fingerprint`, which is what runs record in their eval records.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scalerl.config import SpecError, spec_from_dict
from scalerl.parts import make_task
from scalerl.tasks import Problem, problem_set_fingerprint

SAMPLE = Path(__file__).resolve().parents[3] / "examples" / "datasets" / "arith_sample.jsonl"
TASKS = {
    "addition": {"kind": "addition", "digits": 3, "train_size": 300, "eval_size": 40},
    "countdown": {"kind": "countdown", "train_size": 200, "eval_size": 30},
    "jsonl": {"kind": "jsonl", "train_path": str(SAMPLE), "eval_size": 10},
}


def _split(task: dict[str, object], *, seed: int, data_seed: int | None) -> tuple[list[Problem], list[Problem]]:
    tree = {"seed": seed, "task": {**task, **({} if data_seed is None else {"data_seed": data_seed})}}
    t = make_task(spec_from_dict(tree))
    return t.problems("train"), t.problems("eval")


@pytest.mark.parametrize("kind", list(TASKS))
def test_run_seed_leaves_the_split_alone(kind: str) -> None:
    train0, eval0 = _split(TASKS[kind], seed=0, data_seed=None)
    train1, eval1 = _split(TASKS[kind], seed=1, data_seed=None)
    assert [(p.id, p.prompt, p.answer) for p in eval0] == [(p.id, p.prompt, p.answer) for p in eval1]
    assert [p.prompt for p in train0] == [p.prompt for p in train1]
    assert problem_set_fingerprint(eval0) == problem_set_fingerprint(eval1)


@pytest.mark.parametrize("kind", list(TASKS))
def test_data_seed_changes_the_split(kind: str) -> None:
    _, eval0 = _split(TASKS[kind], seed=0, data_seed=0)
    train1, eval1 = _split(TASKS[kind], seed=0, data_seed=1)
    prompts0, prompts1 = {p.prompt for p in eval0}, {p.prompt for p in eval1}
    assert prompts0 != prompts1
    assert not prompts1 & {p.prompt for p in train1}  # still disjoint under the new data seed
    assert problem_set_fingerprint(eval0) != problem_set_fingerprint(eval1)


def test_default_data_seed_is_the_old_seed_0_split() -> None:
    """Runs before `data_seed` existed used `seed` for the data: seed 0 runs keep their held-out set."""
    from scalerl.tasks import build_task

    _, eval_default = _split(TASKS["addition"], seed=7, data_seed=None)
    old = build_task("addition", seed=0, digits=3, train_size=300, eval_size=40).problems("eval")
    assert [p.prompt for p in eval_default] == [p.prompt for p in old]


def test_fingerprint_reads_ids_prompts_answers_and_order() -> None:
    a = Problem(id="x-0", prompt="1+2=", answer="3", solution="")
    b = Problem(id="x-1", prompt="2+2=", answer="4", solution="")
    base = problem_set_fingerprint([a, b])
    assert len(base) == 16 and int(base, 16) >= 0
    assert problem_set_fingerprint([a, b]) == base
    assert problem_set_fingerprint([b, a]) != base
    assert problem_set_fingerprint([a, Problem(id="x-1", prompt="2+2=", answer="5", solution="")]) != base
    assert problem_set_fingerprint([Problem(id="x-0", prompt="1+2", answer="=3", solution=""), b]) != base


@pytest.mark.parametrize("bad", [-1, "one", 1.5])
def test_bad_data_seed_names_the_field(bad: object) -> None:
    with pytest.raises(SpecError, match=r"^task\.data_seed: "):
        spec_from_dict({"task": {"data_seed": bad}})
