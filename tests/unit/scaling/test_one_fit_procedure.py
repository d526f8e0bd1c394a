"""One fit procedure: for one metrics file, the fit the training loop logs (summary.json), the report's
numbers and `scalerl fit --json` agree exactly, all with the run's own `fit` settings (spec.yaml)."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scalerl.config import FitConfig, JobSpec, dump_spec
from scalerl.report import commands, write_report
from scalerl.report.online import analyse_run, fit_record
from scalerl.report.runfiles import read_records
from scalerl.report.tables import num

SETTINGS = FitConfig(min_compute_fraction=0.25, bootstrap=40, seed=7, level=0.9)  # not the defaults


def _report_fit(run: Path) -> dict[str, Any]:
    page = (run / "report.html").read_text(encoding="utf-8")
    m = re.search(r"Fit: (\{.*\})", html.unescape(page))
    assert m is not None
    return dict(json.loads(m.group(1)))


def _cli_fit(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert commands.main(["fit", *args, "--json"]) == 0
    return dict(json.loads(capsys.readouterr().out))


@pytest.fixture
def run(make_run) -> Path:
    d: Path = make_run("procedure")
    spec = JobSpec(name="procedure", fit=SETTINGS)
    (d / "spec.yaml").write_text(dump_spec(spec))
    return d


KEYS = ("A", "B", "C_mid", "R0", "r2", "n_points", "ci", "predictions", "window")


def test_summary_report_and_cli_agree_exactly(run: Path, capsys) -> None:
    records = read_records(run / "metrics.jsonl")
    analysis = analyse_run(records, SETTINGS)  # what the training loop does after each eval
    assert analysis is not None
    summary_fit = fit_record(analysis)  # what summary.json / train.jsonl / the metrics topic carry
    (run / "summary.json").write_text(json.dumps({"name": "procedure", "fit": summary_fit}))
    # the window left out the early regime: points below 0.25 × the largest compute
    c = np.array([r["compute"] for r in records])
    cutoff = 0.25 * c.max()
    assert summary_fit["window"]["min_compute"] == pytest.approx(cutoff)
    assert summary_fit["n_points"] == int((c >= cutoff).sum()) < int((c > 0).sum())
    assert summary_fit["A_low"] == summary_fit["ci"]["A"][0] and summary_fit["A_high"] == summary_fit["ci"]["A"][1]

    write_report(run, analysis=analysis)  # end of training: the analysis is passed along
    passed = _report_fit(run)
    write_report(run)  # `scalerl`-side regeneration: recomputed with the run's settings
    recomputed = _report_fit(run)
    cli_folder = _cli_fit([str(run)], capsys)
    cli_file = _cli_fit([str(run / "metrics.jsonl")], capsys)
    for key in KEYS:
        assert passed[key] == summary_fit[key], key
        assert recomputed[key] == summary_fit[key], key
        assert cli_folder[key] == summary_fit[key], key
        assert cli_file[key] == summary_fit[key], key
    page = (run / "report.html").read_text(encoding="utf-8")
    lo, hi = summary_fit["ci"]["A"]
    assert f"interval of A [{num(lo)}, {num(hi)}]" in html.unescape(page)  # the summary line shows it too


def test_flags_override_one_setting_and_other_settings_change_the_numbers(run: Path, capsys) -> None:
    base = _cli_fit([str(run)], capsys)
    every = _cli_fit([str(run), "--min-compute-fraction", "0"], capsys)
    assert every["n_points"] > base["n_points"]
    assert every["window"]["min_compute_fraction"] == 0 and base["window"]["min_compute_fraction"] == 0.25
    other_seed = _cli_fit([str(run), "--seed", "8"], capsys)
    assert other_seed["A"] == base["A"] and other_seed["bootstrap"]["seed"] == 8


def test_a_bad_fit_section_is_one_line_exit_2(run: Path, capsys) -> None:
    (run / "spec.yaml").write_text("fit:\n  min_compute_fraction: 2\n")
    assert commands.main(["fit", str(run)]) == 2
    err = capsys.readouterr().err
    assert "spec.yaml" in err and "fit settings" in err and len(err.strip().splitlines()) == 1
