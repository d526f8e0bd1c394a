"""`scalerl fit` / `scalerl compare` through `commands.register` on our own parser (no console script)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cpu_budget import cpu_budget
from scalerl.report import handlers  # handlers: imported here, so the budget below is the fit's

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"



def test_fit_json_has_the_documented_keys(make_run, capsys, run_cli) -> None:
    run = make_run("a")
    rc, out, err = run_cli(["fit", str(run / "metrics.jsonl"), "--json", "--bootstrap", "50"], capsys)
    assert rc == 0, err
    d = json.loads(out)  # exactly one JSON object
    assert {"A", "B", "C_mid", "R0", "n_points", "sse", "r2", "ci", "predictions", "power_law"} <= set(d)
    assert set(d["ci"]) == {"A", "B", "C_mid"} and all(len(v) == 2 for v in d["ci"].values())
    assert abs(d["A"] - 0.61) <= 0.02
    last = 4 * 2542.0
    assert [p["compute"] for p in d["predictions"]] == pytest.approx([last, 2 * last, 4 * last])
    assert all(p["lo"] <= p["pass_rate"] <= p["hi"] for p in d["predictions"])
    assert set(d["power_law"]) >= {"A", "B", "D"}


def test_fit_human_output_and_plot(make_run, tmp_path, capsys, run_cli) -> None:
    run = make_run("b")
    png = tmp_path / "fit.png"
    argv = [
        "fit",
        str(run),
        "--max-compute",
        "5084",
        "--predict",
        "10168,20000",
        "--plot",
        str(png),
        "--points",
    ]
    rc, out, _ = run_cli(argv, capsys)
    assert rc == 0
    for text in ("device-hours", "A ", "R²", "paper margin ±0.02", "Forecast", "Power law", "Held-out check"):
        assert text in out, text
    assert "20000" in out or "2e+04" in out
    assert png.read_bytes().startswith(PNG_MAGIC)


def test_fit_reads_csv_with_other_columns(tmp_path, synth_curve, capsys, run_cli) -> None:
    c, y, _ = synth_curve(0.645, 1.70, 10909.0, seed=1)
    lines = ["step,gpu_hours,eval/acc,loss"]
    for i, (ci, yi) in enumerate(zip(c, y, strict=True)):
        lines.append(f"{i},{ci},{yi},0.1")
        lines.append(f"{i}.5,{ci + 1},,0.1")  # a training row without an eval value
    path = tmp_path / "export.csv"
    path.write_text("\n".join(lines) + "\n")
    rc, out, err = run_cli(["fit", str(path), "--x", "gpu_hours", "--y", "eval/acc", "--json"], capsys)
    assert rc == 0, err
    d = json.loads(out)
    # the paper's window by default: points below 0.1 × the largest compute are the early regime
    early = int(((c > 0) & (c < 0.1 * c.max())).sum())
    assert early >= 1 and d["window"]["min_compute"] == pytest.approx(0.1 * c.max())
    assert abs(d["A"] - 0.645) <= 0.02 and d["n_points"] == c.size - 1 - early
    rc, out, err = run_cli(["fit", str(path), "--x", "gpu_hours", "--y", "eval/acc", "--json",
                            "--min-compute-fraction", "0"], capsys)
    assert rc == 0, err
    assert json.loads(out)["n_points"] == c.size - 1  # every point after step 0


def _bad_input(tmp_path: Path, kind: str) -> Path:
    p = tmp_path / "m.jsonl"
    recs = [{"kind": "eval", "step": i, "compute": float(i), "pass_rate": 0.3 + 0.02 * i} for i in range(8)]
    if kind == "few":
        recs = recs[:3]
    elif kind == "nan":
        recs[3]["pass_rate"] = float("nan")
    elif kind == "range":
        recs[3]["pass_rate"] = 42.0
    elif kind == "column":
        del recs[3]["pass_rate"]
    elif kind == "json":
        p.write_text('{"kind": "eval", "compute": 0, "pass_rate": 0.3}\n{oops\n{"kind": "eval"}\n')
        return p
    elif kind == "missing":
        return tmp_path / "nope.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return p


@pytest.mark.parametrize(
    ("kind", "needle"),
    [
        ("few", "at least 4 points"),
        ("nan", "NaN"),
        ("range", "outside [0, 1]"),
        ("column", "without 'pass_rate'"),
        ("json", "not valid JSON"),
        ("missing", "does not exist"),
    ],
)
def test_fit_bad_input_exits_2_with_a_message(tmp_path, capsys, kind, needle, run_cli) -> None:
    rc, out, err = run_cli(["fit", str(_bad_input(tmp_path, kind))], capsys)
    assert rc == 2
    assert needle in err
    assert "Traceback" not in err and out == ""
    assert err.count("\n") == 1  # one paragraph


def test_fit_bad_predict_is_an_argparse_error(make_run, capsys, run_cli) -> None:
    with pytest.raises(SystemExit) as e:
        run_cli(["fit", str(make_run("c")), "--predict", "soon"], capsys)
    assert e.value.code == 2


def test_max_compute_fraction_is_max_compute_at_that_share_of_the_largest(make_run, capsys, run_cli) -> None:
    """--max-compute-fraction F gives the same fit and held-out check as --max-compute F × the run's largest
    compute (read here from the file, not from the code under test); with --max-compute too it is an error."""
    run = make_run("f")
    largest = max(json.loads(line)["compute"] for line in (run / "metrics.jsonl").read_text().splitlines())
    rc, by_fraction, err = run_cli(["fit", str(run), "--json", "--bootstrap", "20", "--max-compute-fraction", "0.5"],
                                   capsys)
    assert rc == 0, err
    rc, by_value, err = run_cli(["fit", str(run), "--json", "--bootstrap", "20", "--max-compute",
                                 repr(0.5 * largest)], capsys)
    assert rc == 0, err
    a, b = json.loads(by_fraction), json.loads(by_value)
    assert a["window"]["max_compute"] == pytest.approx(0.5 * largest) and a["holdout"]["n_points"] > 0
    assert (a["A"], a["B"], a["C_mid"], a["holdout"]) == (b["A"], b["B"], b["C_mid"], b["holdout"])

    rc, out, err = run_cli(["fit", str(run), "--max-compute-fraction", "0.5", "--max-compute", "10"], capsys)
    assert rc == 2 and out == "" and err.count("\n") == 1 and "--max-compute-fraction" in err
    for bad in ("1", "0", "half"):
        with pytest.raises(SystemExit) as e:
            run_cli(["fit", str(run), "--max-compute-fraction", bad], capsys)
        assert e.value.code == 2


def test_compare_json_and_plot(make_run, tmp_path, capsys, run_cli) -> None:
    a = make_run("loo-dapo", A=0.605, B=1.6, seed=1)
    b = make_run("scalerl", A=0.610, B=2.4, seed=2)
    png = tmp_path / "cmp.png"
    rc, out, err = run_cli(["compare", str(a), str(b), "--json", "--plot", str(png), "--bootstrap", "30"], capsys)
    assert rc == 0, err
    d = json.loads(out)
    assert d["rule"] == "shared_A"
    assert [r["name"] for r in d["runs"]] == ["scalerl", "loo-dapo"]
    assert png.read_bytes().startswith(PNG_MAGIC)
    rc, out, _ = run_cli(["compare", str(a), str(b), "--bootstrap", "0"], capsys)
    assert rc == 0 and "ranked by B" in out and "loo-dapo" in out


def test_compare_bad_run_exits_2(make_run, tmp_path, capsys, run_cli) -> None:
    rc, _, err = run_cli(["compare", str(make_run("ok")), str(tmp_path / "ghost")], capsys)
    assert rc == 2 and "does not exist" in err


def test_fit_of_a_few_hundred_points_is_quick(tmp_path, synth_curve, capsys, run_cli) -> None:
    c, y, _ = synth_curve(0.61, 1.92, 2542.0, seed=0, n=300)
    p = tmp_path / "big.jsonl"
    p.write_text(
        "".join(
            json.dumps({"kind": "eval", "compute": float(a), "pass_rate": float(b)}) + "\n"
            for a, b in zip(c, y, strict=True)
        )
    )
    assert handlers.fit_command  # the handler's imports are loaded: the budget below is the fit's
    with cpu_budget(5.0, "scalerl fit"):
        rc, _, _ = run_cli(["fit", str(p), "--json"], capsys)
    assert rc == 0


def test_module_entry_point_runs_in_a_subprocess(make_run) -> None:
    run = make_run("sub")
    res = subprocess.run(
        [sys.executable, "-m", "scalerl.report.commands", "fit", str(run), "--bootstrap", "0", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert np.isfinite(json.loads(res.stdout)["A"])
    bad = subprocess.run(
        [sys.executable, "-m", "scalerl.report.commands", "fit", str(run / "missing.jsonl")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
