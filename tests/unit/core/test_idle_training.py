"""A run that trains on nothing (every group dropped as zero-variance) says so: the terminal warning
fires once a streak reaches IDLE_STEPS_WARNING, summary.json and report.html carry it; and a spec that
could never train (group_size 1 with the zero-variance filter) is rejected with one line naming both."""

from __future__ import annotations

import json

import pytest

from scalerl.config import SpecError, spec_from_dict
from scalerl.report import write_report
from scalerl.runtime.trainer import IDLE_STEPS_WARNING, IdleSteps


def test_warns_once_when_a_streak_reaches_the_limit():
    idle = IdleSteps(warn_after=3)
    # (kept groups, dropped zero-variance) per step: 2 idle, 1 training, then 4 idle.
    steps = [(0, 4), (0, 4), (2, 2), (0, 4), (0, 4), (0, 4), (0, 4)]
    fired = [idle.observe(kept, zv) for kept, zv in steps]
    assert fired == [False, False, False, False, False, True, False]
    assert (idle.total, idle.longest, idle.zero_variance, idle.warned) == (6, 4, 24, True)
    text = idle.warning()
    assert text.startswith("4 consecutive RL steps trained on nothing (6 steps in all; 24 groups dropped")
    assert "loss.zero_variance_filter" in text and "generation.group_size" in text


def test_the_warning_tells_solved_prompts_from_a_policy_that_learns_nothing():
    solved, failing = IdleSteps(warn_after=2), IdleSteps(warn_after=2)
    for rate in (1.0, 0.9375):  # every group all right but one of 16
        solved.observe(0, 16, rate)
        failing.observe(0, 16, 1.0 - rate)
    assert "already gets these prompts right (pass rate 0.97 on those steps)" in solved.warning()
    assert "not learning" not in solved.warning() and "harder task" in solved.warning()
    assert "the policy is not learning" in failing.warning() and "already" not in failing.warning()


def test_no_warning_while_training():
    idle = IdleSteps()
    assert not any(idle.observe(1, 3) for _ in range(3 * IDLE_STEPS_WARNING))
    assert not idle.warned and idle.total == 0


def test_report_shows_the_summary_warning(tmp_path):
    run = tmp_path / "idle"
    run.mkdir()
    text = IdleSteps(warn_after=1)
    text.observe(0, 4)
    summary = {"name": "idle", "steps": 1, "steps_without_training": 1, "warnings": [text.warning()]}
    (run / "summary.json").write_text(json.dumps(summary))
    page = write_report(run).read_text(encoding="utf-8")
    assert '<p class="warn">1 consecutive RL steps trained on nothing' in page


def test_group_of_one_with_zero_variance_filter_is_rejected():
    with pytest.raises(SpecError) as err:
        spec_from_dict({"generation": {"group_size": 1}})
    msg = str(err.value)
    assert msg.startswith("generation.group_size: 1 with loss.zero_variance_filter: true never trains")
    assert "\n" not in msg and "allowed:" in msg
    assert spec_from_dict({"generation": {"group_size": 1}, "loss": {"zero_variance_filter": False}})
    assert spec_from_dict({"generation": {"group_size": 2}})


def test_bar_shows_a_dash_where_the_step_has_no_loss():
    from scalerl.runtime.trainer import step_postfix

    idle = {"loss": None, "train_pass_rate": 0.0, "staleness_mean": None}
    assert step_postfix(idle) == {"loss": "—", "train_pass": "0.00", "stale": "—"}
    assert step_postfix({"loss": 0.0, "train_pass_rate": 0.5, "staleness_mean": 1.25})["loss"] == "0.000"


def test_final_summary_states_the_idle_warning(tmp_path, capsys):
    from scalerl.cli import _print_summary

    idle = IdleSteps(warn_after=2)
    for _ in range(3):
        idle.observe(0, 4)
    summary = {"name": "idle", "steps": 3, "initial_pass_rate": 0.1, "final_pass_rate": 0.1, "gain": 0.0,
               "warnings": [idle.warning()]}
    _print_summary(tmp_path, summary)
    out = capsys.readouterr().out
    assert "gain +0.000" in out
    assert "  warning: 3 consecutive RL steps trained on nothing" in out and "the policy is not learning" in out
    _print_summary(tmp_path, {**summary, "warnings": None})
    assert "warning" not in capsys.readouterr().out
