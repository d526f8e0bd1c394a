"""bench/tool_gain.py's pairing of the two arms (pure logic, synthetic eval records): the gain is the mean
over prompts of (with tools − without), its interval brackets it, the arms' folders are distinct for each
`--plain-set`, and arms evaluated on different held-out prompts are refused."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import tool_gain as tg


def _arm(first: list[float], last: list[float], heldout: str = "abc", compute: float = 0.1) -> dict[str, Any]:
    def rec(step: int, rates: list[float]) -> dict[str, Any]:
        return {"step": step, "pass_rate": sum(rates) / len(rates), "prompt_pass_rates": rates, "heldout_set": heldout}

    return {"summary": {"compute": compute, "train_wall_s": 60.0, "sft_steps": 360, "sft_wall_s": None,
                        "gain": 0.1, "gain_interval": [0.0, 0.2]},
            "first": rec(0, first), "last": rec(100, last)}


def test_the_gain_is_the_mean_paired_difference_over_prompts() -> None:
    tools = _arm([0.5, 1.0, 0.75, 0.25], [0.75, 1.0, 1.0, 0.5])
    plain = _arm([0.0, 0.25, 0.5, 0.0], [0.25, 0.25, 0.5, 0.0], compute=0.02)
    out = tg.compare({"tools": tools, "plain": plain})
    assert out["last"]["gain"] == pytest.approx((0.5 + 0.75 + 0.5 + 0.5) / 4)
    assert out["first"]["gain"] == pytest.approx((0.5 + 0.75 + 0.25 + 0.25) / 4)
    lo, hi = out["last"]["interval"]
    assert lo <= out["last"]["gain"] <= hi and out["last"]["prompts"] == 4
    assert out["plain"]["rl_compute_device_hours"] == 0.02 and out["tools"]["sft_steps"] == 360
    assert "+0.562" in tg.format_table({"k": 4, "prompts": 4, "level": 0.95, "seeds": {"0": out}})


def test_arms_on_different_heldout_prompts_are_not_paired() -> None:
    with pytest.raises(SystemExit, match="different held-out prompts"):
        tg.compare({"tools": _arm([1.0], [1.0], heldout="a"), "plain": _arm([0.0], [0.0], heldout="b")})


def test_each_plain_override_gets_its_own_folder() -> None:
    assert tg.arm_folder("tools", 0, ["sft.steps=1460"]) == "tools-seed0"
    assert tg.arm_folder("plain", 0, []) == "plain-seed0"
    assert tg.arm_folder("plain", 1, ["sft.steps=1460"]) == "plain-sft.steps=1460-seed1"
    assert tg.arm_overrides(["sft.steps=1460"])["plain"] == ["environment.tools=[]", "sft.steps=1460"]
