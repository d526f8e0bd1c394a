"""A finished run's files in the store (scalerl.store.run_files) and `scalerl fetch-run` (issue #26): the
learner's upload and the user's download round-trip; bad input is one line naming it, exit 2; nothing
there yet is exit 1. Also the learner's one log line per step (scalerl.runtime.outputs.step_line)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalerl.cli import main
from scalerl.runtime.outputs import step_line
from scalerl.store import open_store
from scalerl.store.run_files import RUN_FILES, download_run_files, job_store_url, upload_run_files


def _run_folder(root: Path, *, report: bool = True) -> Path:
    root.mkdir(parents=True)
    for name in RUN_FILES:
        if name != "report.html" or report:
            (root / name).write_text(f"<{name}>\n")
    (root / "spec.yaml").write_text("name: t\n")  # not a run file: stays behind
    return root


def test_upload_then_download_round_trips_the_run_files(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path / 'store'}")
    names = upload_run_files(store, _run_folder(tmp_path / "run", report=False))
    assert names[-1] == "summary.json" and sorted(names) == ["metrics.jsonl", "summary.json", "train.jsonl"]
    assert store.list("run/") == ["run/metrics.jsonl", "run/summary.json", "run/train.jsonl"]
    got = download_run_files(store, tmp_path / "got")
    assert [p.name for p in got] == ["metrics.jsonl", "summary.json", "train.jsonl"]
    assert (tmp_path / "got" / "summary.json").read_text() == "<summary.json>\n"


def test_job_store_url_accepts_the_report_uri_or_the_store() -> None:
    assert job_store_url("s3://bkt/jobs/j1/run") == "s3://bkt/jobs/j1"
    assert job_store_url("s3://bkt/jobs/j1/run/") == "s3://bkt/jobs/j1"
    assert job_store_url("s3://bkt/jobs/j1") == "s3://bkt/jobs/j1"


def test_fetch_run_copies_the_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store_url = f"file://{tmp_path / 'store'}"
    upload_run_files(open_store(store_url), _run_folder(tmp_path / "run"))
    assert main(["fetch-run", f"{store_url}/run", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 4 and all(line.endswith(" bytes)") for line in out)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(RUN_FILES)


@pytest.mark.parametrize(("uri", "out_is_file", "expect"), [
    ("http://x/run", False, "scalerl fetch-run: error: URI 'http://x/run': not an absolute path or a known scheme"),
    ("s3://B/run", False, "scalerl fetch-run: error: URI 's3://B/run': bucket 'B' is not an S3 bucket name"),
    ("GOOD", True, "scalerl fetch-run: error: --out"),
])
def test_fetch_run_bad_input_exits_2_one_line_each(tmp_path: Path, capsys: pytest.CaptureFixture[str], uri: str,
                                                   out_is_file: bool, expect: str) -> None:
    out = tmp_path / "out"
    if out_is_file:
        out.write_text("x")
    code = main(["fetch-run", f"file://{tmp_path}" if uri == "GOOD" else uri, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(expect) and err.count("\n") == 1, err


def test_fetch_run_before_the_run_finished_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["fetch-run", f"file://{tmp_path / 'store'}", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 1 and "no run files under" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_step_line_has_every_number_with_its_unit() -> None:
    rec = {"step": 3, "loss": 0.01234, "train_pass_rate": 0.42, "staleness_mean": 0.5, "staleness_max": 1.0,
           "step_time_s": 1.6, "batch_wait_s": 0.4, "effective_batch": 2.0}
    assert step_line(rec, total_steps=10, bound_k=4, rollouts_per_s=12.5) == (
        "step 3/10: loss 0.0123, train pass rate 0.42, staleness mean 0.5 max 1 (bound k=4) policy versions, "
        "12.5 rollouts/s, step 1.60 s, wait 0.40 s, 2 groups trained")
    # every group dropped: no loss, shown as a dash (a 0.000 would read as converged)
    assert "loss —," in step_line({"step": 4, "loss": None}, total_steps=10, bound_k=4, rollouts_per_s=0.0)


def test_the_charts_notes_name_what_exists() -> None:
    from scalerl.cli import build_parser

    notes = (Path(__file__).resolve().parents[3] / "helm" / "scalerl" / "templates" / "NOTES.txt").read_text()
    assert "scalerl fetch-run <that uri> --out" in notes and "{.status.report.uri}" in notes
    assert "one line per step (step, loss, train pass rate, staleness" in notes
    assert "fetch-run" in build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
