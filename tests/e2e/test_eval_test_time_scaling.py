"""`scalerl eval` end to end on a real trained policy: a small run (SFT warm start + a few RL steps,
checkpoints and metrics.jsonl written by the embedded runtime), evaluated through the CLI.

- maj@16 >= mean@1 and oracle best-of-16 >= maj@16; the learned outcome scorer's best-of-16 beats
  random selection; the scorer is saved next to the checkpoint and reused.
- Budget forcing caps thinking at each budget (measured thinking tokens <= the budget) and the
  tightest budget costs accuracy.
- `--checkpoints all` evaluates the SFT start and every checkpoint and answers train-or-sample.
- Bad input exits 2 with one line naming the argument, before any work (one case in a real subprocess).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from scalerl.cli import main
from scalerl.config import spec_from_dict
from scalerl.runtime.embedded import EmbeddedRun

SPEC = {
    "name": "evalrun", "seed": 1,
    "model": {"tiny": {"hidden_size": 64, "intermediate_size": 192, "num_layers": 2, "num_heads": 2,
                       "max_positions": 96}},
    "task": {"kind": "addition", "digits": 2, "train_size": 2000, "eval_size": 48},
    "sft": {"steps": 400, "batch_size": 32, "lr": 0.003},
    "generation": {"group_size": 4, "thinking_budget_tokens": 32, "answer_budget_tokens": 6,
                   "interruption": {"window_tokens": [28, 32]}, "prompts_per_batch": 16},
    "off_policy": {"mode": "ppo", "k": 1},
    "optim": {"lr": 1e-4, "warmup_steps": 1},
    "train": {"prompts_per_step": 4, "steps": 4, "checkpoint_every": 2, "keep_checkpoints": 5},
    "eval": {"every_steps": 2, "samples_per_prompt": 2},
    "runtime": {"threads": 1},
}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("eval") / "run"
    EmbeddedRun(spec_from_dict(SPEC), out, show_progress=False).run()
    return out


def _eval(capsys, *argv):
    code = main(["eval", *map(str, argv), "--quiet"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _points(record, strategy):
    return {p["k"]: p for p in record["points"] if p["strategy"] == strategy}


@pytest.mark.timeout(600)
def test_selection_strategies_and_learned_scorer(run_dir, tmp_path, capsys):
    ckpt = run_dir / "checkpoints" / "step_000004"
    out_json, plot = tmp_path / "tts.json", tmp_path / "tts.png"
    code, out, _ = _eval(capsys, run_dir, "--strategy", "greedy,sample,majority,best-of-n", "--n", "1,2,4,8,16",
                         "--scorer-steps", "150", "--scorer-prompts", "256", "--json", out_json, "--plot", plot)
    assert code == 0, out
    result = json.loads(out_json.read_text())
    (rec,) = result["checkpoints"]
    assert rec["checkpoint"] == str(ckpt) and rec["problems"] == 48
    sample, maj = _points(rec, "sample"), _points(rec, "majority")
    bon, rnd = _points(rec, "best-of-n"), _points(rec, "random")
    mean1 = sample[1]["accuracy"]
    assert 0.1 < mean1 < 0.95, "the policy must be neither hopeless nor perfect for the comparison to mean anything"
    assert maj[16]["accuracy"] >= mean1
    assert sample[16]["accuracy"] >= maj[16]["accuracy"]  # oracle best-of-16 = pass@16
    assert bon[16]["accuracy"] > rnd[16]["accuracy"], (bon[16], rnd[16])
    assert rnd[16]["accuracy"] == pytest.approx(mean1)  # random selection = mean@n
    # costs: k samples cost k times the mean completion; the scorer reads prompt + completion per candidate
    for k in (2, 4, 8, 16):
        assert sample[k]["gen_tokens_per_problem"] == pytest.approx(k * sample[1]["gen_tokens_per_problem"])
        assert bon[k]["scorer_tokens_per_problem"] == pytest.approx(k * bon[1]["scorer_tokens_per_problem"])
    assert bon[1]["scorer_tokens_per_problem"] > bon[1]["gen_tokens_per_problem"]  # the prompt is read too
    greedy = _points(rec, "greedy")[1]["accuracy"]  # one argmax completion per problem: a count of 48
    assert greedy * 48 == pytest.approx(round(greedy * 48))
    assert rec["scorer"]["heldout_auc"] > 0.6
    assert (ckpt / "scorer" / "scorer.json").is_file()
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "majority" in out and "generated tokens/problem" in out
    # a second run reuses the saved scorer (no training) and gets the same best-of-n numbers (same seed):
    # each phase draws from its own stream, so it samples what the first run did although no greedy pass
    # ran before (same process, same kernels: the same completions, so equal accuracies)
    code, out2, _ = _eval(capsys, ckpt, "--strategy", "best-of-n", "--n", "1,2,4,8,16", "--json")
    again = json.loads(out2)["checkpoints"][0]
    assert again["scorer"]["source"] == str(ckpt / "scorer")
    oracle = _points(again, "oracle")
    assert {k: p["accuracy"] for k, p in oracle.items()} == {k: p["accuracy"] for k, p in sample.items()}
    for k in (1, 2, 4, 8, 16):
        assert _points(again, "best-of-n")[k]["accuracy"] == pytest.approx(bon[k]["accuracy"]), k


@pytest.mark.timeout(300)
def test_budget_forcing_caps_thinking(run_dir, capsys):
    code, out, _ = _eval(capsys, run_dir, "--strategy", "budget-forcing", "--max-thinking", "2,8,32", "--n", "4",
                         "--json")
    assert code == 0
    rows = {r["max_thinking"]: r for r in json.loads(out)["checkpoints"][0]["budget_forcing"]}
    for budget in (2, 8, 32):
        assert rows[budget]["thinking_tokens_per_sample"] <= budget
    # 2-digit addition thinks ~17 tokens ("3+4+0=7,1+2+0=3" ...): a 2-token budget leaves no room to compute
    assert rows[2]["accuracy"] < rows[None]["accuracy"]
    assert rows[32]["accuracy"] == pytest.approx(rows[None]["accuracy"], abs=0.15)
    # the minimum: the model closes thinking after ~17 tokens, below 30, so its first </think> becomes "Wait"
    code, out, _ = _eval(capsys, run_dir, "--strategy", "budget-forcing", "--max-thinking", "32", "--min-thinking",
                         "30", "--max-waits", "1", "--n", "4", "--json")
    (row,) = [r for r in json.loads(out)["checkpoints"][0]["budget_forcing"] if r["max_thinking"] == 32]
    assert 0.9 <= row["waits_per_sample"] <= 1.0
    assert row["thinking_tokens_per_sample"] > rows[32]["thinking_tokens_per_sample"] + 3  # "Wait" is 4 tokens


@pytest.mark.timeout(300)
def test_checkpoints_all_gives_the_frontier(run_dir, capsys):
    code, out, _ = _eval(capsys, run_dir, "--checkpoints", "all", "--strategy", "majority", "--n", "1,4",
                         "--problems-served", "48,100000000", "--json")
    assert code == 0
    result = json.loads(out)
    steps = [r["step"] for r in result["checkpoints"]]
    assert steps == [0, 2, 4]  # the SFT start, then every checkpoint
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    compute = {m["step"]: m["compute"] for m in metrics}
    assert [r["rl_compute_device_hours"] for r in result["checkpoints"]] == [0.0, compute[2], compute[4]]
    front, huge = result["frontiers"]
    assert front["problems_served"] == 48 and front["strategy"] == "majority"
    per_token = sorted(r["inference"]["device_hours_per_token"] for r in result["checkpoints"])[1]  # the median
    for p in front["points"]:
        rec = next(r for r in result["checkpoints"] if r["step"] == p["step"])
        maj = _points(rec, "majority")[p["k"]]
        assert p["total_device_hours"] == pytest.approx(
            rec["rl_compute_device_hours"] + maj["gen_tokens_per_problem"] * per_token * 48)
    assert {a["answer"] for a in front["answers"]} <= {"train more", "sample more"}
    assert len(front["answers"]) == 3
    # serving 10^8 problems, inference dwarfs RL compute: 4 samples cost 4x, so sampling once wins at every
    # budget of a single-sample configuration
    assert huge["problems_served"] == 100_000_000
    assert [a["answer"] for a in huge["answers"]] == ["train more"] * 3


def test_bad_input_exits_2_before_any_work(run_dir, tmp_path, capsys):
    proc = subprocess.run([sys.executable, "-m", "scalerl.cli", "eval", str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "CHECKPOINT_OR_RUN" in proc.stderr and "does not exist" in proc.stderr
    cases = [
        (["--n", "1,4,32", "--samples", "16"], "--n: k = 32 is larger than --samples 16"),
        (["--strategy", "majority,beam"], "--strategy: unknown ['beam']; allowed: greedy, sample"),
        (["--n", "1,two"], "--n: expected a comma-separated list of integers >= 1"),
        (["--n", "0,4"], "--n: expected a comma-separated list of integers >= 1"),
        (["--strategy", "tree"], "--strategy: tree needs a task with step structure (countdown)"),
        (["--engine", "grpc"], "--target: missing; allowed: HOST:PORT (port 1-65535); --engine grpc needs the "
                                "generator service as HOST:PORT"),
        (["--checkpoints", "some"], "--checkpoints: 'some'; allowed: latest, all"),
        (["--scorer", str(tmp_path)], "--scorer:"),
    ]
    for extra, message in cases:
        code, _, err = _eval(capsys, run_dir, *extra)
        assert code == 2, extra
        assert message in err and err.count("\n") == 1, err
