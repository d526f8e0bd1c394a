"""`scalerl run --smoke` on the examples, as a user runs them (the real CLI in a subprocess):

- examples/quickstart.yaml checks its set-up within a bound on the process's CPU time (not wall time,
  which the machine's other load decides);
- examples/own-dataset.yaml (a JSONL dataset) with the tiny model in place of SmolLM2 (the same spec as
  it is, on SmolLM2, took 390 s of the suite's CI budget; the real model's path is what
  tests/e2e/test_real_model.py runs);
- examples/plugin/reverse.yaml: the task of another distribution, found through its entry point
  (installed in the test's own folder, tests/plugin_dist.py; the environment is left as it was).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from plugin_dist import REPO, install_example_plugin
from scalerl.tasks import build_task, problem_set_fingerprint

SCALERL = [sys.executable, "-m", "scalerl.cli"]
# CPU seconds (all threads) of a whole smoke run of the quickstart, imports included: measured 32 s with one
# torch thread on a loaded 2-core machine (14 s of it compiling bytecode: PYTHONDONTWRITEBYTECODE); the
# run it stands for, 360 SFT steps and 100 prompts x 8 samples evaluated, takes many minutes.
QUICKSTART_SMOKE_CPU_S = 90.0


def _run(args: list[str], out: Path, env: dict[str, str] | None = None
         ) -> tuple[subprocess.CompletedProcess[str], float]:
    """(the finished `scalerl run ... --smoke --out OUT`, its CPU seconds: user + system, all threads)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([*SCALERL, "run", *args, "--smoke", "--quiet", "--set", "runtime.threads=1", "--out",
                           str(out)], cwd=REPO, capture_output=True, text=True, timeout=900, check=False,
                          env={**os.environ, **(env or {})})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return proc, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _evals(out: Path) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in records if r.get("kind") == "eval"]


def _check_smoke_run(proc: subprocess.CompletedProcess[str], out: Path, name: str) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("smoke run: a few steps and a tiny evaluation to check the set-up"), proc.stdout
    assert "  train.steps: " in proc.stdout and " -> 3 steps" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["name"] == name and summary["steps"] == 3
    assert summary["train_tokens"] > 0  # the learner trained on every step (zero-variance filter off)
    assert (out / "checkpoints" / "step_000003").is_dir()
    evals = _evals(out)
    assert [(e["step"], e["n_prompts"], e["k"]) for e in evals] == [(0, 8, 2), (3, 8, 2)]
    assert all(sum(e["verdicts"].values()) == 8 * 2 and e["task_metrics"] == {} for e in evals)  # no task numbers
    return summary


@pytest.mark.slow  # (a set-up check, kernel-independent: once, not again on the other kernels)
@pytest.mark.timeout(900)
def test_quickstart_smoke_within_a_cpu_budget(tmp_path: Path) -> None:
    out = tmp_path / "smoke"
    proc, cpu_s = _run(["examples/quickstart.yaml"], out)
    _check_smoke_run(proc, out, "quickstart")
    assert "  sft.steps: 360 -> 5 steps" in proc.stdout and (out / "sft" / "config.json").is_file()
    assert cpu_s < QUICKSTART_SMOKE_CPU_S, f"smoke run: {cpu_s:.1f} s of CPU (budget {QUICKSTART_SMOKE_CPU_S} s)"


@pytest.mark.slow  # (a set-up check, kernel-independent: once, not again on the other kernels)
@pytest.mark.timeout(900)
def test_own_dataset_example_with_the_tiny_model(tmp_path: Path) -> None:
    out = tmp_path / "smoke"
    proc, _ = _run(["examples/own-dataset.yaml", "--set", "model.path=null"], out)
    _check_smoke_run(proc, out, "own-dataset")
    spec = (out / "spec.yaml").read_text()
    assert "kind: jsonl" in spec and "train_path: examples/datasets/arith_sample.jsonl" in spec
    # the 8 evaluated prompts are the first 8 of the 10 records the spec holds out of the file
    task = build_task("jsonl", train_path=REPO / "examples/datasets/arith_sample.jsonl", eval_size=10,
                      phrasing="chat")
    held = task.problems("eval")
    assert len(held) == 10 and len(task.problems("train")) == 40
    assert {e["heldout_set"] for e in _evals(out)} == {problem_set_fingerprint(held[:8])}


@pytest.mark.slow  # (a set-up check, kernel-independent: once, not again on the other kernels)
@pytest.mark.timeout(900)
def test_plugin_task_example(tmp_path: Path) -> None:
    site = install_example_plugin(tmp_path / "site")
    out = tmp_path / "smoke"
    proc, _ = _run(["examples/plugin/reverse.yaml"], out,
                   env={"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])})
    _check_smoke_run(proc, out, "reverse")
    assert (out / "sft" / "config.json").is_file()  # SFT on the plugin's gold solutions
    assert "kind: reverse" in (out / "spec.yaml").read_text()
    # without the plugin installed the same spec is refused in one line naming the field
    bare = subprocess.run([*SCALERL, "run", "examples/plugin/reverse.yaml", "--out", str(tmp_path / "bare")],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert bare.returncode == 2 and "task.kind: unknown task kind" in bare.stderr and len(bare.stderr.splitlines()) == 1
