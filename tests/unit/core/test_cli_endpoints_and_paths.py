"""Malformed addresses (--bus, --store, --target, runtime.bus) and unusable output paths (--json, --plot,
--out) exit 2 with one line naming the option and what is allowed, before any work."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scalerl.cli import main
from scalerl.endpoints import bus_problem, output_dir_problem, output_file_problem, store_problem, target_problem
from scalerl.evaluation.commands import frontier_plot_path

GOOD = ("name: t\ntask:\n  kind: addition\n  digits: 2\noff_policy:\n  mode: pipeline\ngeneration:\n"
        "  thinking_budget_tokens: 48\n  answer_budget_tokens: 8\n  interruption:\n    window_tokens: [40, 48]\n")
STORE = "--store=file:///tmp/x"


@pytest.fixture
def spec(tmp_path: Path) -> str:
    path = tmp_path / "spec.yaml"
    path.write_text(GOOD)
    return str(path)


def _one_error_line(capsys: pytest.CaptureFixture[str], code: int, *expect: str, lines: int = 1) -> None:
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == lines and "Traceback" not in err, err
    assert all(line.startswith("scalerl ") and ": error: " in line for line in err.splitlines()), err
    for text in expect:
        assert text in err, err


@pytest.mark.parametrize(("argv", "expect"), [
    (["serve", "generator", "--bus", "kafka://localhost:notaport", STORE], ("--bus", "'notaport'", "kafka://HOST:PORT")),
    (["serve", "generator", "--bus", "kafka://127.0.0.1:70000", STORE], ("--bus", "'70000'", "1-65535")),
    (["serve", "generator", "--bus", "kafka://", STORE], ("--bus", "HOST:PORT")),
    (["serve", "generator", "--bus", "kafka://a:1,:2", STORE], ("--bus", "HOST:PORT")),
    (["serve", "generator", "--bus", "redis://h:1", STORE], ("--bus", "unknown scheme", "kafka://")),
    (["serve", "generator", "--bus", "memory://", STORE], ("--bus", "memory:// lives in one process")),
    (["serve", "learner", "--bus", "kafka://h:1", "--store", "s3://"], ("--store", "no bucket", "s3://BUCKET")),
    (["serve", "learner", "--bus", "kafka://h:1", "--store", "s3:///prefix"], ("--store", "no bucket")),
    (["serve", "learner", "--bus", "kafka://h:1", "--store", "s3://Bad_Bucket/p"], ("--store", "bucket 'Bad_Bucket'")),
    (["serve", "learner", "--bus", "kafka://h:1", "--store", "gs://b/p"], ("--store", "file:///")),
    (["serve", "learner", "--bus", "kafka://h:1", "--store", "relative/dir"], ("--store", "absolute path")),
    (["serve", "generator", STORE], ("runtime.bus", "'memory://'")),  # the spec's default bus, named as its field
    (["run", "{spec}", "--distributed", "--bus", "kafka://h:x"], ("--bus", "'x'", "(run --distributed)")),
    (["run", "{spec}", "--distributed"], ("--bus: missing", "--bus kafka://HOST:PORT", "(run --distributed)")),
    (["eval", "/nonexistent/run", "--engine", "grpc", "--target", "localhost"], ("--target", "HOST:PORT")),
    (["eval", "/nonexistent/run", "--engine", "grpc"], ("--target", "missing")),
    (["eval", "/nonexistent/run", "--engine", "grpc", "--target", "h:0"], ("--target", "1-65535")),
])
def test_malformed_endpoint_exits_2_naming_the_option(spec, tmp_path, capsys, argv, expect):
    argv = [a.replace("{spec}", spec) for a in argv]
    if argv[0] == "serve":
        argv += ["--job", spec, "--out", str(tmp_path / "out")]
    elif argv[0] == "run":
        argv += ["--out", str(tmp_path / "out")]
    # eval lists the missing run folder too
    _one_error_line(capsys, main(argv), *expect, lines=2 if argv[0] == "eval" else 1)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("argv", "expect"), [
    (["eval", "{tmp}/ghost-run", "--json", "/nonexistent/x.json"], ("--json", "'/nonexistent'", "does not exist")),
    (["eval", "{tmp}/ghost-run", "--plot", "/nonexistent/x.png"], ("--plot", "does not exist")),
    (["eval", "{tmp}/ghost-run", "--plot", "{tmp}"], ("--plot", "is a folder")),
    # every problem is listed: the missing inputs as well as the plot's folder
    (["fit", "{tmp}/ghost.jsonl", "--plot", "/nonexistent/fit.png"], ("--plot", "ghost.jsonl does not exist")),
    (["compare", "{tmp}/a", "{tmp}/b", "--plot", "/nonexistent/c.png"], ("--plot", "/a does not exist", "/b does")),
    (["run", "{spec}", "--out", "{tmp}/spec.yaml/out"], ("--out", "cannot be created")),
    (["run", "{spec}", "--out", "{tmp}/spec.yaml"], ("--out", "is a file")),
    (["sft", "{spec}", "--out", "{tmp}/spec.yaml"], ("--out", "is a file")),
])
def test_unusable_output_path_exits_2_before_any_work(spec, tmp_path, capsys, argv, expect):
    argv = [a.replace("{spec}", spec).replace("{tmp}", str(tmp_path)) for a in argv]
    _one_error_line(capsys, main(argv), *expect, lines={"fit": 2, "compare": 3, "eval": 2}.get(argv[0], 1))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"], "nothing written"


def test_an_unreadable_scrape_token_file_exits_2_before_any_work(spec, tmp_path, capsys, monkeypatch):
    # `scalerl run --distributed` reads SCALERL_METRICS_TOKEN_FILE for the side ports' /metrics: checked first
    monkeypatch.setenv("SCALERL_METRICS_TOKEN_FILE", str(tmp_path / "no-token"))
    argv = ["run", spec, "--distributed", "--bus", "kafka://127.0.0.1:9092", "--out", str(tmp_path / "out")]
    _one_error_line(capsys, main(argv), "SCALERL_METRICS_TOKEN_FILE", "no-token", "cannot read")
    assert not (tmp_path / "out").exists()


def test_read_only_folder_is_refused(tmp_path):
    # root may write into a chmod 0500 folder, but not into procfs's /proc/self: the check runs either way
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    if os.access(ro, os.W_OK):
        ro = Path("/proc/self")
    try:
        assert "not writable" in str(output_file_problem("--json", ro / "x.json"))
        assert "cannot be created" in str(output_dir_problem("--out", ro / "run" / "deeper"))
    finally:
        (tmp_path / "ro").chmod(0o700)


def test_good_values_pass(tmp_path):
    assert bus_problem("--bus", "kafka://127.0.0.1:9092,broker-1.kafka:19092") is None
    assert bus_problem("--bus", "kafka://[::1]:9092") is None
    assert bus_problem("--bus", "memory://") is None
    assert store_problem("--store", "s3://scalerl-ckpt/jobs/a") is None
    assert store_problem("--store", "s3://my.bucket") is None
    assert store_problem("--store", "file:///tmp/x") is None and store_problem("--store", "/tmp/x") is None
    assert target_problem("--target", "localhost:50051") is None
    assert output_file_problem("--json", tmp_path / "x.json") is None
    assert output_file_problem("--json", "x.json") is None  # the current folder
    assert output_dir_problem("--out", tmp_path / "a" / "b" / "c") is None


def test_eval_json_to_nonexistent_folder_in_a_real_process(tmp_path):
    res = subprocess.run([sys.executable, "-m", "scalerl.cli", "eval", str(tmp_path / "ghost"), "--json",
                          "/nonexistent/x.json"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 2
    assert res.stderr.startswith("scalerl eval: error: --json '/nonexistent/x.json'") and res.stderr.count("\n") == 2
    assert "ghost does not exist" in res.stderr.splitlines()[1]


@pytest.mark.parametrize(("plot", "served", "expect"), [
    ("tts.png", 100, "tts-frontier-100.png"),
    ("frontier.png", 100, "frontier-100.png"),
    ("out/my-frontier.png", 1000000, "out/my-frontier-1000000.png"),
])
def test_frontier_plot_names(plot, served, expect):
    assert frontier_plot_path(Path(plot), served) == Path(expect)
