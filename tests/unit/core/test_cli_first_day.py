"""What a new user meets on the first day (#32): a small dataset, an empty spec, budgets larger than the
model, SFT a task cannot do, a tab in the YAML: each is one line per problem and exit 2, before any work;
and `sft --out`, `-v` and a run folder holding only an SFT start behave like `run`."""

from __future__ import annotations

import json
import logging
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from scalerl.cli import main
from scalerl.config import SpecError, load_spec
from scalerl.runtime.preflight import spec_problems

BUDGETS = ("generation:\n  thinking_budget_tokens: 48\n  answer_budget_tokens: 8\n  interruption:\n"
           "    window_tokens: [40, 48]\n")
GOOD = "name: t\ntask:\n  kind: addition\n  digits: 2\n" + BUDGETS


def _errors(capsys: pytest.CaptureFixture[str], code: int, command: str = "run") -> list[str]:
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.splitlines()
    assert lines and all(line.startswith(f"scalerl {command}: error: ") for line in lines), err
    assert "Traceback" not in err
    return [line.removeprefix(f"scalerl {command}: error: ") for line in lines]


def _dataset(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": i + 1}) + "\n" for i in range(n)))
    return path


def test_small_dataset_with_the_quickstart_eval_size(tmp_path, capsys):
    data = _dataset(tmp_path / "ten.jsonl", 10)
    spec = tmp_path / "s.yaml"
    spec.write_text(f"{GOOD}sft:\n  steps: 0\ntask:\n  kind: jsonl\n  train_path: {data}\n  eval_size: 100\n")
    lines = _errors(capsys, main(["run", str(spec), "--out", str(tmp_path / "out")]))
    assert len(lines) == 1, lines
    assert lines[0].startswith("task.eval_size: 100 held-out prompts cannot come out of the 10 records of")
    assert "allowed: 1 to 9" in lines[0] and "task.eval_path" in lines[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text", ["", "# nothing yet\n", "{}\n"])
def test_empty_spec_is_refused(tmp_path, capsys, text):
    spec = tmp_path / "empty.yaml"
    spec.write_text(text)
    lines = _errors(capsys, main(["run", str(spec), "--out", str(tmp_path / "out")]))
    assert len(lines) == 1 and "the job spec is empty" in lines[0], lines
    assert "name: my-run" in lines[0] and "task:" in lines[0] and "examples/quickstart.yaml" in lines[0]
    assert not (tmp_path / "out").exists()


def test_an_empty_base_of_extends_is_not_an_empty_spec(tmp_path):
    (tmp_path / "base.yaml").write_text("# shared settings to come\n")
    (tmp_path / "child.yaml").write_text("extends: base.yaml\n" + GOOD)
    assert load_spec(tmp_path / "child.yaml").name == "t"


def test_default_budgets_do_not_fit_the_tiny_model(tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: t\ntask:\n  kind: addition\n")
    lines = _errors(capsys, main(["run", str(spec), "--out", str(tmp_path / "out")]))
    assert len(lines) == 1, lines
    assert lines[0].startswith("generation.thinking_budget_tokens + generation.answer_budget_tokens + "
                               "generation.interruption.phrase: 12288 + 2048 + 81 (the phrase's UTF-8 bytes, the most "
                               "tokens it can take) = 14417 tokens do not fit the model's 512 positions "
                               "(model.tiny.max_positions)"), lines
    assert "allowed: a sum less than 512" in lines[0]


def test_budgets_are_checked_against_a_model_folders_positions(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 64}))
    tree = {"name": "t", "model": {"path": str(model)},
            "generation": {"thinking_budget_tokens": 60, "answer_budget_tokens": 8,
                           "interruption": {"window_tokens": [50, 60]}}}
    spec = load_spec(_yaml(tmp_path, tree))
    (problem,) = spec_problems(spec)
    assert "60 + 8 + 81 (the phrase's UTF-8 bytes, the most tokens it can take) = 149 tokens do not fit the model's " \
           "64 positions (max_position_embeddings of" in problem
    tree["generation"] = {"thinking_budget_tokens": 32, "answer_budget_tokens": 8,
                          "interruption": {"window_tokens": [24, 32], "phrase": "Time is up.</think>"}}
    assert spec_problems(load_spec(_yaml(tmp_path, tree))) == []  # 32 + 8 + 19 bytes < 64


def test_budgets_count_the_interruption_phrase(tmp_path):
    """The phrase forced at a cut takes positions too: bounded by its UTF-8 bytes (no tokenizer makes more
    tokens than bytes), counted only when length_control is interruption (before: left out)."""
    tree = {"name": "t", "model": {"tiny": {"max_positions": 128}},
            "generation": {"thinking_budget_tokens": 40, "answer_budget_tokens": 8,
                           "interruption": {"window_tokens": [30, 40]}}}
    (problem,) = spec_problems(load_spec(_yaml(tmp_path, tree)))  # 40 + 8 + 81 = 129
    assert problem.startswith("generation.thinking_budget_tokens + generation.answer_budget_tokens + "
                              "generation.interruption.phrase: 40 + 8 + 81 (the phrase's UTF-8 bytes"), problem
    assert "= 129 tokens do not fit the model's 128 positions (model.tiny.max_positions)" in problem
    tree["generation"]["interruption"]["phrase"] = "Zeit ist um. Ä → </think>"  # 25 characters, 28 bytes: 76
    assert spec_problems(load_spec(_yaml(tmp_path, tree))) == []
    tree["generation"]["interruption"]["phrase"] = "é" * 40 + "</think>"  # 48 characters, 88 bytes: 136
    (problem,) = spec_problems(load_spec(_yaml(tmp_path, tree)))
    assert "40 + 8 + 88 (the phrase's UTF-8 bytes" in problem
    tree["generation"] = {"thinking_budget_tokens": 40, "answer_budget_tokens": 8, "length_control": "length_penalty",
                          "interruption": {"window_tokens": [30, 40]}}
    assert spec_problems(load_spec(_yaml(tmp_path, tree))) == []  # no phrase is forced


def _yaml(tmp_path: Path, tree: dict[str, Any]) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps(tree))  # JSON is YAML
    return path


def test_sft_on_a_task_without_gold_solutions_is_an_error(tmp_path, capsys):
    data = _dataset(tmp_path / "d.jsonl", 20)
    spec = tmp_path / "s.yaml"
    spec.write_text(f"{GOOD}sft:\n  steps: 5\ntask:\n  kind: jsonl\n  train_path: {data}\n  eval_size: 4\n")
    lines = _errors(capsys, main(["run", str(spec), "--out", str(tmp_path / "out")]))
    assert len(lines) == 1 and lines[0].startswith("sft.steps: 5 SFT steps asked for, but task kind 'jsonl' has "
                                                   "no gold solutions"), lines
    assert "allowed: sft.steps: 0" in lines[0]
    lines = _errors(capsys, main(["sft", str(spec), "--out", str(tmp_path / "out")]), "sft")
    assert lines[0].startswith("sft.steps: 5 SFT steps")
    assert spec_problems(load_spec(spec, ["sft.steps=0"])) == []
    # a built-in task in chat phrasing has no gold solutions either (Task.has_solutions)
    (problem,) = spec_problems(load_spec(spec, ["task.kind=addition", "task.phrasing=chat", "task.train_path=null"]))
    assert problem.startswith("sft.steps: 5 SFT steps asked for, but task kind 'addition' has no gold solutions to "
                              "imitate (in task.phrasing 'chat'"), problem
    assert spec_problems(load_spec(spec, ["task.kind=addition", "task.train_path=null"])) == []


def test_a_tab_in_the_yaml_is_one_line_with_file_line_and_column(tmp_path, capsys):
    spec = tmp_path / "tab.yaml"
    spec.write_text("name: t\ntask:\n\tkind: addition\n")
    lines = _errors(capsys, main(["run", str(spec), "--out", str(tmp_path / "out")]))
    assert lines == [f"{spec}:3:1: not valid YAML: found character '\\t' that cannot start any token "
                     "(YAML indents with spaces, not tabs)"]
    with pytest.raises(SpecError, match=r"broken\.yaml:2:1: not valid YAML: expected ',' or ']'"):
        (tmp_path / "broken.yaml").write_text("a: [1, 2\n")
        load_spec(tmp_path / "broken.yaml")


def test_sft_out_defaults_to_runs_name_like_run(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(GOOD)
    (tmp_path / "runs" / "t" / "sft").mkdir(parents=True)
    (tmp_path / "runs" / "t" / "sft" / "config.json").write_text("{}")
    lines = _errors(capsys, main(["sft", "s.yaml"]), "sft")
    assert lines == [f"{Path('runs/t/sft')} exists; pass --overwrite to retrain"]


class _FakeRun:
    """Stands in for EmbeddedRun (no training): records what `scalerl run` built it with."""

    made: list[tuple[Any, Path]] = []  # noqa: RUF012

    def __init__(self, spec: Any, out: Path, **_: Any) -> None:
        self.made.append((spec, out))

    def run(self) -> dict[str, Any]:
        return {"name": "t", "steps": 0, "initial_pass_rate": 0.1, "final_pass_rate": 0.1}


@pytest.fixture
def fake_run(monkeypatch):
    module = types.ModuleType("scalerl.runtime.embedded")
    module.EmbeddedRun = _FakeRun  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "scalerl.runtime.embedded", module)
    monkeypatch.setattr("scalerl.console.quiet_third_party_bars", lambda: None)
    _FakeRun.made.clear()
    level = logging.getLogger("scalerl").level
    yield _FakeRun.made
    logging.getLogger("scalerl").setLevel(level)


def test_a_folder_holding_only_an_sft_start_is_not_a_run(tmp_path, capsys, fake_run):
    """`scalerl sft SPEC` then `scalerl run SPEC` (the same default folder): the run starts from that SFT."""
    (tmp_path / "s.yaml").write_text(GOOD)
    (tmp_path / "out" / "sft").mkdir(parents=True)
    assert main(["run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "out")]) == 0
    assert [out for _, out in fake_run] == [tmp_path / "out"]
    (tmp_path / "out" / "metrics.jsonl").write_text("{}\n")
    assert "already holds a run" in _errors(capsys, main(["run", str(tmp_path / "s.yaml"), "--out",
                                                          str(tmp_path / "out")]))[0]


@pytest.mark.parametrize("argv", [["-v", "run", "{spec}"], ["run", "{spec}", "-v"]])
def test_verbose_logs_info_lines(tmp_path, caplog, fake_run, argv):
    (tmp_path / "s.yaml").write_text(GOOD)
    args = [a.format(spec=tmp_path / "s.yaml") for a in argv] + ["--out", str(tmp_path / "out")]
    with caplog.at_level(logging.NOTSET):
        assert main(args) == 0
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and r.name.startswith("scalerl")]
    assert any("s.yaml checked: task addition" in m and "run folder" in m for m in info), info


def test_without_verbose_no_info_lines(tmp_path, caplog, fake_run):
    (tmp_path / "s.yaml").write_text(GOOD)
    logging.getLogger("scalerl").setLevel(logging.NOTSET)
    with caplog.at_level(logging.WARNING):
        assert main(["run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "out")]) == 0
    assert not [r for r in caplog.records if r.levelno == logging.INFO]
