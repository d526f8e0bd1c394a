"""`scalerl compare` warns when the runs were evaluated on different held-out sets (`heldout_set`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalerl.scaling.compare import heldout_set_warning


def _tag(run: Path, fingerprint: str | None) -> Path:
    """Rewrite the run's eval records with `heldout_set` = fingerprint (None: drop the field)."""
    path = run / "metrics.jsonl"
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for r in recs:
        r.pop("heldout_set", None)
        if fingerprint is not None:
            r["heldout_set"] = fingerprint
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return run


def test_no_warning_when_every_run_names_one_set() -> None:
    assert heldout_set_warning([("a", ["f0"]), ("b", ["f0"]), ("c", ["f0"])]) is None
    assert heldout_set_warning([("a", []), ("b", [])]) is None  # nothing recorded anywhere: nothing to check


@pytest.mark.parametrize(("runs", "needle"), [
    ([("a", ["f0"]), ("b", ["f1"])], "different held-out sets (a f0, b f1)"),
    ([("a", ["f0", "f1"]), ("b", ["f0"])], "a changed held-out set"),
    ([("a", ["f0"]), ("b", [])], "b do not record their held-out set"),
])
def test_warning_names_the_runs(runs: list[tuple[str, list[str]]], needle: str) -> None:
    warning = heldout_set_warning(runs)
    assert warning is not None and needle in warning


def test_compare_warns_on_the_terminal_and_in_json(make_run, capsys, run_cli) -> None:
    a = _tag(make_run("seed0", A=0.605, seed=1), "aaaa000011112222")
    b = _tag(make_run("seed1", A=0.610, seed=2), "bbbb000011112222")
    rc, out, err = run_cli(["compare", str(a), str(b), "--bootstrap", "0"], capsys)
    assert rc == 0, err
    assert "warning: the runs were evaluated on different held-out sets" in out
    assert "seed0 aaaa000011112222" in out and "seed1 bbbb000011112222" in out
    rc, out, err = run_cli(["compare", str(a), str(b), "--bootstrap", "0", "--json"], capsys)
    d = json.loads(out)
    assert d["heldout_sets"] == {"seed0": ["aaaa000011112222"], "seed1": ["bbbb000011112222"]}
    assert len(d["warnings"]) == 1 and "different held-out sets" in d["warnings"][0]


def test_compare_is_quiet_on_one_set(make_run, capsys, run_cli) -> None:
    a = _tag(make_run("seed0", A=0.605, seed=1), "aaaa000011112222")
    b = _tag(make_run("seed1", A=0.610, seed=2), "aaaa000011112222")
    rc, out, _ = run_cli(["compare", str(a), str(b), "--bootstrap", "0", "--json"], capsys)
    assert rc == 0 and json.loads(out)["warnings"] == []
    rc, out, _ = run_cli(["compare", str(a), str(b), "--bootstrap", "0"], capsys)
    assert rc == 0 and "held-out set" not in out
