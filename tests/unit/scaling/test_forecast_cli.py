"""`scalerl fit --max-compute-fraction 0.5 --predict C`: a prediction interval and `identified`, and "not
identified yet" with only the range on a run that has not bent; the early-regime window is a fraction of the
run's total compute, the same whatever part of the run is fitted (issue #31)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scalerl.scaling import sigmoid
from scalerl.scaling.simulate import SimSettings, simulate_run


def _run(tmp_path: Path, name: str, records: list[dict[str, Any]]) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return d


def _unbent_records() -> list[dict[str, Any]]:
    """Evals every 2.5 up to 100 of a curve whose midpoint is at 400: it only rises, never bends."""
    rng = np.random.default_rng(0)
    c = np.linspace(0.0, 100.0, 41)
    y = sigmoid(c, A=0.9, B=1.5, C_mid=400.0, R0=0.2) + rng.normal(0, 0.01, c.size) * (c > 0)
    return [{"kind": "eval", "step": 10 * i, "compute": float(ci), "pass_rate": float(yi), "k": 8, "n_prompts": 128}
            for i, (ci, yi) in enumerate(zip(c, y, strict=True))]


def test_a_bent_run_gets_a_point_inside_its_prediction_interval(tmp_path, capsys, run_cli) -> None:
    sim = simulate_run("bent", 3, SimSettings(n_prompts=512, k=16, wobble_sd=0.02))  # precise evals
    run = _run(tmp_path, "bent", sim.records)
    rc, out, err = run_cli(["fit", str(run), "--max-compute-fraction", "0.5", "--predict", "100", "--json",
                            "--bootstrap", "20"], capsys)
    assert rc == 0, err
    d = json.loads(out)
    (p,) = d["predictions"]
    assert p["compute"] == 100.0 and p["identified"] is True
    assert p["lo"] < p["pass_rate"] < p["hi"] and p["curve_lo"] <= p["pass_rate"] <= p["curve_hi"]
    assert p["lo"] <= sim.records[-1]["pass_rate"] <= p["hi"]  # the measured final eval
    assert d["prediction"]["level"] == 0.95 and d["bootstrap"]["method"] == "prompts"  # A's interval: labelled
    a_lo, a_hi = d["prediction"]["A_interval"]
    assert a_lo < d["A"] < a_hi <= 1.0


def test_an_unbent_run_is_refused_with_its_range(tmp_path, capsys, run_cli) -> None:
    run = _run(tmp_path, "rising", _unbent_records())
    rc, out, err = run_cli(["fit", str(run), "--max-compute-fraction", "0.5", "--predict", "100", "--json",
                            "--bootstrap", "0"], capsys)
    assert rc == 0, err
    (p,) = json.loads(out)["predictions"]
    assert p["identified"] is False and p["pass_rate"] is None
    assert 0.0 <= p["lo"] < p["hi"] <= 1.0 and p["hi"] - p["lo"] > 0.2
    truth = float(sigmoid(100.0, A=0.9, B=1.5, C_mid=400.0, R0=0.2))
    assert p["lo"] <= truth <= p["hi"]
    png = tmp_path / "fit.png"  # the plot draws the range, not a point
    rc, out, err = run_cli(["fit", str(run), "--max-compute-fraction", "0.5", "--predict", "100",
                            "--bootstrap", "0", "--plot", str(png)], capsys)
    assert rc == 0, err
    row = next(line for line in out.splitlines() if "not identified yet" in line and "[" in line)
    assert f"[{p['lo']:.4f}, {p['hi']:.4f}]" in row
    assert png.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("fraction", ["0.5", "0.75"])
def test_the_early_regime_is_a_fraction_of_the_whole_run_whatever_is_fitted(tmp_path, capsys, run_cli,
                                                                              fraction) -> None:
    """The cutoff is 0.1 × the run's last compute (100 here), not × the largest fitted one, so fitting half
    of the run leaves out the same early evals as fitting all of it (compute < 10: 3 evals after step 0)."""
    run = _run(tmp_path, "w", _unbent_records())
    rc, out, err = run_cli(["fit", str(run), "--json", "--bootstrap", "0", "--min-compute-fraction", "0.1",
                            "--max-compute-fraction", fraction], capsys)
    assert rc == 0, err
    w = json.loads(out)["window"]
    assert w["min_compute"] == pytest.approx(10.0) and w["total_compute"] == 100.0
    fitted = json.loads(out)["n_points"]
    assert fitted == int(float(fraction) * 40) - 3
