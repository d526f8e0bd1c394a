"""`scalerl run` rejects bad input with exit 2, one line per problem naming the field, and writes nothing;
before torch, transformers, vLLM or gRPC load, so a refusal costs well under a second of CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scalerl.cli import main

# budgets that fit the tiny model's 512 positions (examples/quickstart.yaml's)
BUDGETS = ("generation:\n  thinking_budget_tokens: 48\n  answer_budget_tokens: 8\n  interruption:\n"
           "    window_tokens: [40, 48]\n")
GOOD = "name: t\ntask:\n  kind: addition\n  digits: 2\n" + BUDGETS
JSONL = "sft:\n  steps: 0\n" + BUDGETS + "task:\n  kind: jsonl\n"


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
    (JSONL + "  train_path: /nonexistent/data.jsonl\n", (), "task.train_path:"),
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
    res = _run(tmp_path, f"{JSONL}  train_path: {data}\n  eval_size: 1\n", capsys=capsys)
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
    assert res.returncode == 2 and res.stderr.startswith("scalerl run: error: loss.type:")
    assert not (tmp_path / "out").exists()


THREE_PROBLEMS = "name: t\ntrian:\n  steps: 3\ntrain:\n  prompts_per_step: many\noptim:\n  lr: -1\n"


# Runs the command as its only child and prints that child's rusage. It starts fresh from a small interpreter:
# a child forked straight from this pytest process (torch loaded) would inherit its resident size in ru_maxrss.
_MEASURE = """
import json, resource, subprocess, sys
res = subprocess.run(sys.argv[1:], capture_output=True, text=True)
use = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"code": res.returncode, "err": res.stderr, "cpu_s": use.ru_utime + use.ru_stime,
                  "peak_mb": use.ru_maxrss / 1024}))
"""


def test_three_problems_refused_at_once_within_a_few_seconds_of_cpu_and_150_mb(tmp_path):
    """The real process: an unknown key, a wrong type and a negative value are three lines naming the three
    fields, exit 2, in < 3 s of CPU and < 150 MB peak RSS (before the fix: the first problem only, after
    25 s of CPU and 964 MB, as runtime/setup imported torch before the spec was checked; `import torch`
    alone is 3-6 s of CPU and 650 MB here). CPU time (getrusage of the children: user + system), not wall
    time, so a loaded machine does not fail it; 3 s, not 1: the cold run of 2026-12-07 used 1.03 s, its
    modules compiled to bytecode on first import beside a full machine. Which modules load is
    `test_refusals_import_no_heavy_module`'s to check."""
    spec = tmp_path / "bad.yaml"
    spec.write_text(THREE_PROBLEMS)
    cli = [sys.executable, "-m", "scalerl.cli", "run", str(spec), "--out", str(tmp_path / "out")]
    res = subprocess.run([sys.executable, "-c", _MEASURE, *cli], capture_output=True, text=True, timeout=120,
                         check=True)
    got = json.loads(res.stdout)
    lines = got["err"].splitlines()
    assert got["code"] == 2, lines
    assert len(lines) == 3 and all(line.startswith("scalerl run: error: ") for line in lines), lines
    by_field = {line.removeprefix("scalerl run: error: ").split(":")[0]: line for line in lines}
    assert set(by_field) == {"trian", "train.prompts_per_step", "optim.lr"}, lines
    assert "unknown field (did you mean 'train'?); allowed: name, seed, model, task" in by_field["trian"]
    assert "valid integer" in by_field["train.prompts_per_step"]
    assert "(got 'many')" in by_field["train.prompts_per_step"]
    assert "greater than 0 (got -1)" in by_field["optim.lr"]
    assert not (tmp_path / "out").exists()
    assert got["cpu_s"] < 3.0, f"the refusal used {got['cpu_s']:.2f} s of CPU (budget 3 s)"
    assert got["peak_mb"] < 150, f"the refusal peaked at {got['peak_mb']:.0f} MB (budget 150 MB)"


HEAVY = ("torch", "transformers", "vllm", "grpc", "kafka", "numpy", "scipy", "matplotlib")
_PROBE = """
import contextlib, io, json, sys
from scalerl.cli import main
err = io.StringIO()
with contextlib.redirect_stderr(err):
    code = main(sys.argv[1:])
loaded = sorted({m.split(".")[0] for m in sys.modules} & set(HEAVY))
print(json.dumps({"code": code, "err": err.getvalue(), "loaded": loaded}))
""".replace("HEAVY", repr(HEAVY))


@pytest.mark.parametrize("argv", [
    ("run", "{bad}"), ("sft", "{bad}"), ("serve", "generator", "--job", "{bad}"), ("eval", "{tmp}/ghost-run"),
    ("eval", "{tmp}/ghost-run", "--strategy", "bogus"), ("fit", "{tmp}/ghost.jsonl"),
    ("compare", "{tmp}/a", "{tmp}/a"), ("run", "{good}", "--distributed"),
])
def test_refusals_import_no_heavy_module(tmp_path, argv):
    """Each command checks its spec, paths and endpoints before torch, transformers, vLLM, gRPC, Kafka,
    numpy or scipy load: what a bad-input refusal costs is the spec check alone."""
    (tmp_path / "bad.yaml").write_text(THREE_PROBLEMS)
    (tmp_path / "good.yaml").write_text(GOOD)
    args = [a.format(bad=tmp_path / "bad.yaml", good=tmp_path / "good.yaml", tmp=tmp_path) for a in argv]
    res = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    got = json.loads(res.stdout.splitlines()[-1])
    assert got["code"] == 2, got
    assert got["err"].startswith(f"scalerl {argv[0]}: error: "), got
    assert got["loaded"] == [], f"scalerl {' '.join(argv)} imported {got['loaded']} before refusing"


def test_eval_lists_every_bad_argument(tmp_path, capsys):
    """`scalerl eval` lists every bad argument and every problem of the run's spec, one line each, exit 2,
    before any model or torch (before: it stopped at the first, --strategy)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "spec.yaml").write_text(THREE_PROBLEMS)
    (run / "checkpoints" / "step_000001").mkdir(parents=True)
    (run / "checkpoints" / "step_000001" / "config.json").write_text("{}")
    code = main(["eval", str(run), "--strategy", "sample,bogus", "--n", "0", "--seed", "-1", "--engine", "warp",
                 "--tree-method", "deep", "--min-thinking", "4"])
    lines = capsys.readouterr().err.splitlines()
    assert code == 2, lines
    assert all(line.startswith("scalerl eval: error: ") for line in lines), lines
    named = {line.removeprefix("scalerl eval: error: ").split(":")[0] for line in lines}
    assert named == {"--strategy", "--n", "--seed", "--engine", "--tree-method", "--min-thinking/--max-waits",
                     "trian", "train.prompts_per_step", "optim.lr"}, lines
    assert len(lines) == len(named), lines
