"""The pure parts of bench/forecast_bench.py on synthetic records with known answers."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from scalerl.scaling import sigmoid

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import forecast_bench as fb


def _records(n: int = 11, *, flops: bool = False) -> list[dict[str, object]]:
    """Evals at steps 0, 10, ..., compute = step / 10 device-hours (and 1e12 × step FLOPs), with step records."""
    recs: list[dict[str, object]] = []
    for i in range(n):
        recs.append({"kind": "step", "step": 10 * i, "compute": i - 0.5})
        rec: dict[str, object] = {"kind": "eval", "step": 10 * i, "compute": float(i), "pass_rate": 0.3 + 0.05 * i}
        if flops:
            rec["compute_flops"] = 1e12 * i
        recs.append(rec)
    return recs


def test_truncate_keeps_evals_up_to_the_fraction_of_final_compute() -> None:
    recs = _records()  # final compute 10
    assert [r["step"] for r in fb.truncate(recs, "compute", 0.25)] == [0, 10, 20]
    assert [r["step"] for r in fb.truncate(recs, "compute", 0.5)] == [0, 10, 20, 30, 40, 50]
    assert len(fb.truncate(recs, "compute", 1.0)) == 11
    assert all(r["kind"] == "eval" for r in fb.truncate(recs, "compute", 1.0))
    flops = _records(flops=True)
    assert [r["step"] for r in fb.truncate(flops, "compute_flops", 0.25)] == [0, 10, 20]
    with pytest.raises(ValueError, match="fraction"):
        fb.truncate(recs, "compute", 0.0)


def test_axis_is_flops_only_when_every_eval_has_it() -> None:
    assert fb.choose_axis(_records(flops=True)) == "compute_flops"
    assert fb.choose_axis(_records()) == "compute"
    mixed = _records(flops=True)
    del mixed[-1]["compute_flops"]
    assert fb.choose_axis(mixed) == "compute"
    assert fb.choose_axis(_records(flops=True), "compute") == "compute"
    with pytest.raises(ValueError, match="axis"):
        fb.choose_axis(_records(), "gpu_hours")


def test_the_early_regime_is_a_fraction_of_the_runs_total_compute_whatever_is_fitted() -> None:
    """The bench leaves out what `scalerl fit --max-compute-fraction F` leaves out: the evals below
    EARLY_FRACTION × the run's final compute, the same points from 50% as from all of the run."""
    c = np.arange(0, 21) * 0.5  # final compute 10: the early regime is compute < 1.0
    y = sigmoid(c, A=0.8, B=2.0, C_mid=3.0, R0=0.3)
    recs = [{"kind": "eval", "step": 10 * i, "compute": float(ci), "pass_rate": float(yi)}
            for i, (ci, yi) in enumerate(zip(c, y, strict=True))]
    half = fb.forecast_row(recs, axis="compute", fraction=0.5, n_bootstrap=0)
    full = fb.forecast_row(recs, axis="compute", fraction=1.0, n_bootstrap=0)
    assert half["early_compute"] == full["early_compute"] == pytest.approx(fb.EARLY_FRACTION * 10.0)
    assert half["n_points_fitted"] == 9 and full["n_points_fitted"] == 19  # compute 1.0..5.0 and 1.0..10.0


def test_coverage_and_aggregate() -> None:
    assert fb.is_covered(0.5, 0.4, 0.6) is True
    assert fb.is_covered(0.4, 0.4, 0.6) is True  # closed interval
    assert fb.is_covered(0.61, 0.4, 0.6) is False
    assert fb.is_covered(0.5, None, None) is None
    rows = [
        {"predicted": 0.7, "error": 0.1, "lo": 0.5, "hi": 0.9, "covered": True, "A": 0.8, "measured": 0.6},
        {"predicted": 0.5, "error": -0.1, "lo": 0.55, "hi": 0.65, "covered": False, "A": 0.6, "measured": 0.6},
        {"predicted": 0.6, "error": 0.0, "lo": 0.5, "hi": 0.7, "covered": True, "A": 0.7, "measured": 0.6},
        {"predicted": None, "fit_error": "too few points", "measured": 0.6},
        {"predicted": None, "identified": False, "error": None, "lo": 0.3, "hi": 0.9, "covered": True, "A": 0.7,
         "measured": 0.6},
    ]
    agg = fb.summarise(rows)
    assert (agg["runs"], agg["fitted"], agg["identified"], agg["refused"]) == (5, 4, 3, 1)
    assert (agg["covered"], agg["with_interval"], agg["refused_range_covered"]) == (2, 3, 1)  # refused: apart
    assert agg["coverage"] == pytest.approx(2 / 3)
    assert agg["mean_error"] == pytest.approx(0.0)
    assert agg["mean_abs_error"] == pytest.approx(0.2 / 3)
    assert agg["mean_interval_width"] == pytest.approx((0.4 + 0.1 + 0.2) / 3)
    assert agg["mean_A"] == pytest.approx((0.8 + 0.6 + 0.7 + 0.7) / 4)


def test_final_measurement_standard_error_over_prompts() -> None:
    recs = _records()
    recs[-1]["prompt_pass_rates"] = [0.0, 1.0, 0.0, 1.0]
    recs[-1]["pass_rate"] = 0.5
    end, measured, se = fb.final_measurement(recs, "compute")
    assert (end, measured) == (10.0, 0.5)
    assert se == pytest.approx(math.sqrt((4 * 0.25 / 3) / 4))  # sample variance 1/3 over 4 prompts


def test_forecast_row_recovers_a_known_curve() -> None:
    """A noise-free sigmoid (A 0.8, B 2, C_mid 3): from its first half the forecast of the end is right."""
    c = np.arange(0, 21) * 0.5  # evals every 0.5 device-hours up to 10
    y = sigmoid(c, A=0.8, B=2.0, C_mid=3.0, R0=0.3)
    recs = [{"kind": "eval", "step": 10 * i, "compute": float(ci), "pass_rate": float(yi)}
            for i, (ci, yi) in enumerate(zip(c, y, strict=True))]
    row = fb.forecast_row(recs, axis="compute", fraction=0.5, n_bootstrap=20)
    assert row["n_evals_seen"] == 11 and row["n_points_fitted"] == 9  # steps 20..100 of 0..100 (compute 1..5)
    assert row["measured"] == pytest.approx(float(y[-1]))
    assert row["error"] == pytest.approx(row["predicted"] - float(y[-1]))
    assert abs(row["error"]) < 0.01 and abs(row["A"] - 0.8) < 0.02
    assert isinstance(row["covered"], bool) and row["identified"] is True  # noise-free: the curve is pinned
    short = fb.forecast_row(recs[:4], axis="compute", fraction=0.25, n_bootstrap=0)
    assert short["predicted"] is None and "point" in short["fit_error"]


def test_analyse_runs_and_table_over_seeds() -> None:
    c = np.arange(0, 21) * 0.5
    runs = {}
    for seed, a in ((0, 0.8), (1, 0.75)):
        y = sigmoid(c, A=a, B=2.0, C_mid=3.0, R0=0.3)
        runs[seed] = [{"kind": "eval", "step": 10 * i, "compute": float(ci), "pass_rate": float(yi)}
                      for i, (ci, yi) in enumerate(zip(c, y, strict=True))]
    res = fb.analyse_runs(runs, axis="compute", n_bootstrap=0)
    assert set(res["per_seed"]) == {"0", "1"} and set(res["aggregate"]) == {"0.25", "0.5"}
    half = res["aggregate"]["0.5"]
    assert half["runs"] == 2 and half["with_interval"] == 2  # prediction intervals need no bootstrap
    assert half["mean_measured_final"] == pytest.approx(np.mean([runs[s][-1]["pass_rate"] for s in (0, 1)]))
    assert abs(res["per_seed"]["1"]["full_fit_A"] - 0.75) < 0.01
    table = fb.format_table({**res, "axis": "compute"})
    assert "compute axis: compute (device-hours)" in table
    assert table.count("| 0 | first") == 2 and table.count("| all | first") == 2
    assert res["per_seed"]["0"]["evals"][3] == [30, 1.5, pytest.approx(runs[0][3]["pass_rate"])]


def test_forecast_plot_draws_every_seed(tmp_path: Path) -> None:
    """The PNG is written from the result alone (evals kept in it), with and without bootstrap intervals."""
    c = np.arange(0, 21) * 0.5
    y = sigmoid(c, A=0.8, B=2.0, C_mid=3.0, R0=0.3)
    recs = [{"kind": "eval", "step": 10 * i, "compute": float(ci), "pass_rate": float(yi),
             "prompt_pass_rates": [float(yi)] * 3 + [float(yi) - 0.1, float(yi) + 0.1]}
            for i, (ci, yi) in enumerate(zip(c, y, strict=True))]
    for n_bootstrap in (0, 20):
        res = fb.analyse_runs({0: recs, 1: recs[:15], 2: recs}, axis="compute", n_bootstrap=n_bootstrap)
        png = fb.forecast_png({**res, "axis": "compute"})
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_seed_list_fractions_and_output_paths_are_checked_before_any_training(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Seeds: distinct non-negative integers (one is a spot check); fractions in (0, 1); --forecast-work: a
    folder; each refusal is one line naming the flag, exit 2, before a model is built."""
    import argparse

    assert fb._seeds("0") == [0] and fb._seeds("3,1,2") == [3, 1, 2]
    for bad in ("", "0,0", "-1", "a,b"):
        with pytest.raises(argparse.ArgumentTypeError, match="--seeds"):
            fb._seeds(bad)
    assert fb._fractions("0.75,0.25,0.5") == [0.25, 0.5, 0.75]
    for bad in ("", "0", "1", "0.5,x"):
        with pytest.raises(argparse.ArgumentTypeError, match="--fractions"):
            fb._fractions(bad)

    spec = tmp_path / "spec.yaml"
    spec.write_text("name: x\n")
    (tmp_path / "file").write_text("")
    for work, plot in ((tmp_path / "file", None), (tmp_path / "no" / "w", None), (None, tmp_path / "plot.svg")):
        args = argparse.Namespace(forecast_spec=str(spec), forecast_seeds=[0], forecast_axis="auto",
                                  forecast_bootstrap=0, forecast_init=None, forecast_fractions=[0.5],
                                  forecast_work=str(work) if work else None,
                                  forecast_plot=str(plot) if plot else None)
        with pytest.raises(SystemExit) as e:
            fb.run_section(args, [])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("--forecast-work" if work else "--forecast-plot"), err


def test_finished_runs_in_the_work_folder_are_read_not_trained(tmp_path: Path) -> None:
    """A kept run (summary.json + the spec.yaml this run would write) and a kept SFT start are reused: nothing
    trains (a training run here would take minutes and write more files); a run of another spec or an
    unfinished one stops the bench with a line naming --forecast-work."""
    import json

    from scalerl.config import dump_spec, load_spec

    spec_path = str(Path(__file__).resolve().parents[3] / "examples" / "quickstart.yaml")
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "config.json").write_text("{}")
    (tmp_path / "sft.spec.yaml").write_text(dump_spec(load_spec(spec_path, [])))  # the spec that made it
    start = f"model.init_checkpoint={tmp_path / 'sft'}"
    recs = _records(5, flops=True)
    for seed in (3, 4):
        run = tmp_path / f"seed{seed}"
        run.mkdir()
        (run / "spec.yaml").write_text(dump_spec(load_spec(spec_path, [f"seed={seed}", start])))
        (run / "summary.json").write_text("{}")
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    seen: list[int] = []
    runs, timing = fb.train_runs(spec_path, [], [3, 4], tmp_path, on_run=lambda r, _t: seen.append(len(r)))
    assert sorted(runs) == [3, 4] and timing["reused_seeds"] == [3, 4] and seen == [1, 2]
    assert [r["pass_rate"] for r in fb.eval_records(runs[3])] == [r["pass_rate"] for r in fb.eval_records(recs)]
    assert timing["init_checkpoint"] == str(tmp_path / "sft") and timing["run_wall_s"] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seed3", "seed4", "sft", "sft.spec.yaml"]

    with pytest.raises(SystemExit, match=r"--forecast-work: .*another spec"):
        fb.train_runs(spec_path, ["optim.lr=0.001"], [3], tmp_path)
    (tmp_path / "seed5").mkdir()
    with pytest.raises(SystemExit, match=r"--forecast-work: .*unfinished"):
        fb.train_runs(spec_path, [], [5], tmp_path)
    with pytest.raises(SystemExit, match=r"--forecast-work: .*SFT start of another spec"):
        fb.train_runs(spec_path, ["sft.steps=10"], [3], tmp_path)  # another SFT: its start is not reused
