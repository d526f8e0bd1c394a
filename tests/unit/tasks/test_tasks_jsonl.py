"""JSONL datasets: loading, hold-out, decontamination, and errors that name file, line and cause."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalerl.tasks import DatasetError, JsonlTask, build_task, validate_jsonl

SAMPLE = Path(__file__).resolve().parents[3] / "examples" / "datasets" / "arith_sample.jsonl"


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_sample_dataset_loads_and_every_answer_verifies() -> None:
    n = validate_jsonl(SAMPLE)
    assert 40 <= n <= 60
    task = build_task("jsonl", train_path=SAMPLE, eval_size=10)
    train, eval_ = task.problems("train"), task.problems("eval")
    assert len(train) + len(eval_) == n and len(eval_) == 10
    assert not {p.prompt for p in train} & {p.prompt for p in eval_}
    for p in train + eval_:
        assert p.solution == ""
        assert task.is_correct(f"<think>...</think>\\boxed{{{p.answer}}}", p.answer), p
        assert task.is_correct(f"<think>...</think>{p.answer}", p.answer), p
        assert not task.is_correct("<think>...</think>\\boxed{123456789}", p.answer), p


def test_good_file(tmp_path: Path) -> None:
    path = write(tmp_path / "train.jsonl", [
        json.dumps({"prompt": "1+1=", "answer": 2}),
        "",
        "   ",
        json.dumps({"prompt": "half of 1", "answer": "\\frac{1}{2}", "id": "half", "extra": [1]}),
        json.dumps({"prompt": "0.25*2", "answer": 0.5}),
    ])
    eval_path = write(tmp_path / "eval.jsonl", [json.dumps({"prompt": "2+2=", "answer": "4"})])
    task = JsonlTask(train_path=path, eval_path=eval_path, eval_size=200, seed=0)
    train = task.problems("train")
    assert [(p.id, p.prompt, p.answer) for p in train] == [
        ("train-L1", "1+1=", "2"), ("half", "half of 1", "\\frac{1}{2}"), ("train-L5", "0.25*2", "0.5")]
    assert [p.id for p in task.problems("eval")] == ["eval-L1"]
    assert task.is_correct("<think>x</think>The answer is 0.5.", "\\frac{1}{2}")
    assert task.is_correct("reasoning... #### 2", "2")
    assert not task.is_correct("<think>x</think>3", "2")


def test_holdout_is_deterministic_and_decontaminated(tmp_path: Path) -> None:
    lines = [json.dumps({"prompt": f"{i}+1=", "answer": i + 1}) for i in range(30)]
    lines.append(json.dumps({"prompt": "0+1=", "answer": 1}))  # duplicate prompt of line 1
    path = write(tmp_path / "t.jsonl", lines)
    a = JsonlTask(train_path=path, eval_path=None, eval_size=10, seed=1)
    b = JsonlTask(train_path=path, eval_path=None, eval_size=10, seed=1)
    c = JsonlTask(train_path=path, eval_path=None, eval_size=10, seed=2)
    assert a.problems("eval") == b.problems("eval") and a.problems("train") == b.problems("train")
    assert a.problems("eval") != c.problems("eval")
    for task in (a, c):
        train_prompts = {p.prompt for p in task.problems("train")}
        assert not train_prompts & {p.prompt for p in task.problems("eval")}
        assert all(p.id.startswith("train-L") for p in task.problems("eval"))  # ids name the source file


def test_eval_file_prompts_are_removed_from_train(tmp_path: Path) -> None:
    train = write(tmp_path / "a.jsonl", [json.dumps({"prompt": p, "answer": 1}) for p in ("x", "y", "z")])
    eval_ = write(tmp_path / "b.jsonl", [json.dumps({"prompt": "y", "answer": 1})])
    task = JsonlTask(train_path=train, eval_path=eval_, eval_size=1, seed=0)
    assert [p.prompt for p in task.problems("train")] == ["x", "z"]


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "expected a JSON object, got array"),
        ('{"answer": 1}', 'missing "prompt"'),
        ('{"prompt": 5, "answer": 1}', '"prompt" must be a non-empty string, got number'),
        ('{"prompt": ""  , "answer": 1}', '"prompt" must be a non-empty string'),
        ('{"prompt": "p"}', 'missing "answer"'),
        ('{"prompt": "p", "answer": null}', '"answer" must be a string or a number, got null'),
        ('{"prompt": "p", "answer": true}', 'got boolean'),
        ('{"prompt": "p", "answer": [1]}', 'got array'),
        ('{"prompt": "p", "answer": NaN}', "must be finite"),
        ('{"prompt": "p", "answer": " "}', '"answer" is empty'),
        ('{"prompt": "p", "answer": 1, "id": 7}', '"id" must be a non-empty string'),
    ],
)
def test_malformed_line_names_file_line_and_cause(tmp_path: Path, bad_line: str, message: str) -> None:
    good = json.dumps({"prompt": "1+1=", "answer": 2})
    path = write(tmp_path / "bad.jsonl", [good, "", good, bad_line, good])  # bad record on line 4
    with pytest.raises(DatasetError) as info:
        validate_jsonl(path)
    assert str(info.value).startswith(f"{path}:4: ")
    assert message in str(info.value)
    with pytest.raises(DatasetError, match=":4: "):
        build_task("jsonl", train_path=path)


def test_missing_and_empty_files(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(DatasetError, match=f"{missing}: no such file"):
        validate_jsonl(missing)
    with pytest.raises(DatasetError, match="no such file"):
        build_task("jsonl", train_path=tmp_path / "a.jsonl")
    empty = write(tmp_path / "empty.jsonl", [""])
    with pytest.raises(DatasetError, match="no records"):
        validate_jsonl(empty)
    good = write(tmp_path / "good.jsonl", [json.dumps({"prompt": "p", "answer": 1})] * 3)
    with pytest.raises(DatasetError, match=f"{tmp_path / 'nope.jsonl'}: no such file"):
        build_task("jsonl", train_path=good, eval_path=missing)


def test_duplicate_ids_and_too_large_holdout(tmp_path: Path) -> None:
    dup = write(tmp_path / "dup.jsonl", [json.dumps({"prompt": f"p{i}", "answer": 1, "id": "same"})
                                         for i in range(2)])
    with pytest.raises(DatasetError, match="duplicate id 'same'"):
        JsonlTask(train_path=dup, eval_path=None, eval_size=1, seed=0)
    small = write(tmp_path / "small.jsonl", [json.dumps({"prompt": f"p{i}", "answer": 1}) for i in range(5)])
    with pytest.raises(ValueError, match="eval_size=5 must be smaller than the 5 records"):
        JsonlTask(train_path=small, eval_path=None, eval_size=5, seed=0)


def test_is_correct_never_raises_on_garbage() -> None:
    task = build_task("jsonl", train_path=SAMPLE, eval_size=5)
    for junk in ["", "</think>", "\\boxed{", "#### ", "answer is", "\x00\x01", "</think>" * 1000, "9^{9^{9^9}}"]:
        assert task.is_correct(junk, "42") is False
