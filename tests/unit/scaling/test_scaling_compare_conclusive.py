"""`scalerl compare` names a winner only when the data separate the runs, and refuses a run given twice."""

from __future__ import annotations

import json

import pytest

from scalerl.scaling import compare_curves, curve_from_arrays


def test_overlapping_intervals_name_no_winner(make_run, capsys, run_cli) -> None:
    # two seeds of one curve: the same A and B, so their intervals overlap whatever the noise
    a, b = make_run("seed-1", seed=1), make_run("seed-2", seed=2)
    rc, out, err = run_cli(["compare", str(a), str(b), "--bootstrap", "30"], capsys)
    assert rc == 0, err
    assert "Ranking not conclusive" in out and "intervals of" in out and "overlap" in out
    assert "no winner is named" in out
    rc, out, _ = run_cli(["compare", str(a), str(b), "--bootstrap", "30", "--json"], capsys)
    d = json.loads(out)
    assert d["conclusive"] is False and "overlap" in d["caveat"]
    assert "not conclusive" in d["runs"][0]["reason"]


def test_separated_intervals_are_conclusive(synth_curve) -> None:
    runs = []
    for name, A, seed in (("low", 0.50, 1), ("high", 0.70, 2)):
        c, y, _ = synth_curve(A, 1.92, 2542.0, seed=seed, n=61)
        runs.append((name, curve_from_arrays(c, y)))
    cmp = compare_curves(runs, n_bootstrap=30)
    assert cmp.rule == "A" and [r.name for r in cmp.rows] == ["high", "low"]
    assert cmp.caveat is None and cmp.conclusive is True
    assert compare_curves(runs, n_bootstrap=0).conclusive is None  # no intervals: not checked, not claimed


@pytest.mark.parametrize("second", ["{run}", "{run}/metrics.jsonl"])
def test_the_same_run_twice_is_refused(make_run, capsys, second, run_cli) -> None:
    run = make_run("only")
    rc, out, err = run_cli(["compare", str(run), second.format(run=run)], capsys)
    assert rc == 2 and out == ""
    assert err.startswith("scalerl compare: error: ") and "same metrics file" in err and err.count("\n") == 1
