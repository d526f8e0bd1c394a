"""write_report and the online refit on synthetic run folders."""

from __future__ import annotations

import base64
import json
import re

import numpy as np

from cpu_budget import cpu_budget
from scalerl.report import fit_run_metrics, write_report
from scalerl.report.runfiles import read_records

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _images(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)]


def test_report_is_self_contained_with_fit_and_diagnostics(make_run) -> None:
    run = make_run("scalerl-8b")
    path = write_report(run)
    assert path == run / "report.html"
    page = path.read_text(encoding="utf-8")
    images = _images(page)
    assert len(images) >= 3  # curve, online fits, diagnostics
    assert all(img.startswith(PNG_MAGIC) for img in images)
    assert (run / "curve.png").read_bytes().startswith(PNG_MAGIC)
    # no external assets: every src/href is a data URI
    assert not re.search(r'(src|href)="(?!data:)', page)
    # the fitted numbers are on the page, as in the fit itself
    fit = fit_run_metrics(read_records(run / "metrics.jsonl"))
    assert fit is not None
    assert f"{fit['A']:.4f}" in page and f"{fit['B']:.3f}" in page
    for text in ("Forecast", "Power-law", "paper margin ±0.02", "initial pass rate", "123.4"):
        assert text in page, text


def test_report_of_a_young_run_says_the_fit_needs_four_points(make_run) -> None:
    run = make_run("young", n=3, train=False)
    page = write_report(run).read_text(encoding="utf-8")
    assert "needs ≥ 4 eval points" in page
    assert len(_images(page)) == 1  # the points are still plotted


def test_report_without_metrics_still_renders(tmp_path) -> None:
    (tmp_path / "empty").mkdir()
    page = write_report(tmp_path / "empty").read_text(encoding="utf-8")
    assert "No usable eval records" in page and "No summary.json" in page


def test_report_renders_compute_in_device_hours_of_a_cpu_run(make_run) -> None:
    run = make_run("quick", C_mid=2542.0, scale=0.2 / 10168)  # ~0.001–0.2 device-hours
    page = write_report(run).read_text(encoding="utf-8")
    assert "device-hours" in page and "A sits at its bound" not in page


def test_fit_run_metrics_returns_json_or_none(make_run) -> None:
    recs = read_records(make_run("online", n=41) / "metrics.jsonl")
    assert fit_run_metrics(recs[:4]) is None  # three points after step 0
    with cpu_budget(2.0, "fit_run_metrics"):
        d = fit_run_metrics(recs)
    assert d is not None
    assert json.loads(json.dumps(d)) == d
    assert {"A", "B", "C_mid", "R0", "r2", "n_points", "ci", "forecast"} <= set(d)
    assert abs(d["A"] - 0.61) <= 0.02
    assert set(d["ci"]) == {"A", "B", "C_mid"}
    f = d["forecast"]
    assert len(f) == 3 and all(x["lo"] <= x["pass_rate"] <= x["hi"] for x in f)
    assert np.isclose(f[0]["compute"], recs[-1]["compute"])
    bad = [*recs, {"kind": "eval", "step": 999, "compute": 1.0, "pass_rate": float("nan")}]
    assert fit_run_metrics(bad) is None  # never stops training


def test_numbers_are_printed_without_needless_exponents() -> None:
    from scalerl.report.tables import num

    assert [num(v) for v in (11097.26, 0.05819, 0.2, 2542.0, 1.5e9, None)] == [
        "11097",
        "0.05819",
        "0.2",
        "2542",
        "1.5e+09",
        "—",
    ]


def test_report_shows_the_token_age_distribution(tmp_path) -> None:
    from scalerl.report import plots

    run = tmp_path / "ages"
    run.mkdir()
    ages = {"hist": {"0": 1, "2": 3}, "tokens": 4, "mean": 1.5, "max": 2, "share_age_ge_1": 0.75}
    (run / "summary.json").write_text(json.dumps({"name": "ages", "token_age": ages}), encoding="utf-8")
    steps = [{"kind": "step", "step": 1, "token_age": {"hist": {"0": 1}, "mean": 0.0, "max": 0}},
             {"kind": "step", "step": 2, "token_age": {"hist": {"2": 3}, "mean": 2.0, "max": 2}}]
    (run / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps), encoding="utf-8")
    page = write_report(run).read_text(encoding="utf-8")
    assert "max 2 versions over 4 tokens; share by age: 0: 25%, 2: 75%" in page  # 1/4 and 3/4 of the tokens
    s, v = plots._series(steps, "token_age.mean")
    assert s.tolist() == [1.0, 2.0] and v.tolist() == [0.0, 2.0]
