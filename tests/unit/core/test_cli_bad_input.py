"""`scalerl run` rejects bad input with exit 2, one message naming the field, and writes nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from scalerl.cli import main

GOOD = "name: t\ntask:\n  kind: addition\n  digits: 2\n"


def _run(tmp_path: Path, spec_text: str | None, *extra: str, capsys=None) -> subprocess.CompletedProcess[str]:
    """In-process `main()` (fast); the real process exit status is checked once below."""
    spec = tmp_path / "spec.yaml"
    if spec_text is not None:
        spec.write_text(spec_text)
    argv = ["run", str(spec), "--out", str(tmp_path / "out"), *extra]
    code = main(argv)
    err = capsys.readouterr().err if capsys is not None else ""
    return subprocess.CompletedProcess(argv, code, "", err)


@pytest.mark.parametrize(("spec_text", "extra", "expect"), [
    (None, (), "cannot read job spec"),
    ("loss:\n  type: cispoo\n", (), "loss.type: Input should be 'cispo', 'grpo', 'dapo' or 'gspo'"),
    ("generation:\n  group_size: 0\n", (), "generation.group_size: Input should be greater than or equal to 1"),
    ("model:\n  tiny:\n    hidden_sise: 64\n", (), "model.tiny.hidden_sise: unknown field"),
    (GOOD, ("--set", "off_policy.k=0"), "off_policy.k: Input should be greater than or equal to 1"),
    (GOOD, ("--set", "train.steps"), "--set 'train.steps': expected dotted.key=value"),
    ("task:\n  kind: jsonl\n  train_path: /nonexistent/data.jsonl\n", (), "task.train_path:"),
])
def test_bad_spec_exits_2_and_writes_nothing(tmp_path, capsys, spec_text, extra, expect):
    res = _run(tmp_path, spec_text, *extra, capsys=capsys)
    assert res.returncode == 2, res.stderr
    assert expect in res.stderr
    assert res.stderr.count("\n") == 1, "one message"
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "out").exists()


def test_malformed_dataset_line_is_named(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": 4\n')
    res = _run(tmp_path, f"task:\n  kind: jsonl\n  train_path: {data}\n  eval_size: 1\n", capsys=capsys)
    assert res.returncode == 2
    assert "task.train_path:" in res.stderr and "d.jsonl:2: not JSON" in res.stderr
    assert not (tmp_path / "out").exists()


def test_existing_run_is_not_overwritten_silently(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "metrics.jsonl").write_text("{}\n")
    res = _run(tmp_path, GOOD, capsys=capsys)
    assert res.returncode == 2 and "--resume" in res.stderr
    assert (tmp_path / "out" / "metrics.jsonl").read_text() == "{}\n"


def test_real_process_exit_status(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("loss:\n  type: cispoo\n")
    res = subprocess.run([sys.executable, "-m", "scalerl.cli", "run", str(spec), "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and res.stderr.startswith("scalerl: error: loss.type:")
    assert not (tmp_path / "out").exists()
