"""The pure parts of bench/step_probe.py, and the fact its `adam` rows rest on: AdamW's first update is
lr · sign(gradient)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import step_probe as sp


def test_adamw_first_update_is_lr_times_sign_of_the_gradient() -> None:
    torch.manual_seed(0)
    layer = torch.nn.Linear(5, 3)
    before = [p.detach().clone() for p in layer.parameters()]
    loss = layer(torch.randn(7, 5)).pow(2).mean()
    loss.backward()
    grads = [p.grad.detach().clone() for p in layer.parameters() if p.grad is not None]
    torch.optim.AdamW(layer.parameters(), lr=3e-3, betas=(0.9, 0.999), eps=1e-15, weight_decay=0.0).step()
    for p, p0, g in zip(layer.parameters(), before, grads, strict=True):
        torch.testing.assert_close(p.detach(), p0 - 3e-3 * g.sign(), rtol=0, atol=1e-7)


def test_moved_adds_the_scaled_direction_to_a_copy() -> None:
    layer = torch.nn.Linear(2, 2)
    theta = [p.detach().clone() for p in layer.parameters()]
    direction = [torch.ones_like(p) for p in layer.parameters()]
    out = sp.moved(layer, direction, 0.25)
    for p, q, t in zip(out.parameters(), layer.parameters(), theta, strict=True):
        torch.testing.assert_close(p.detach(), t + 0.25)
        torch.testing.assert_close(q.detach(), t)  # the original is untouched
    assert sp.l2([torch.full((4,), 2.0), torch.full((5,), 2.0)]) == pytest.approx(6.0)


def _rows() -> list[dict[str, object]]:
    return [{"direction": "start", "step_l2": 0.0, "lr": None, "batch_prompts": 0.40, "heldout": 0.38},
            {"direction": "gradient", "step_l2": 0.01, "lr": None, "batch_prompts": 0.45, "heldout": 0.40},
            {"direction": "gradient", "step_l2": 0.05, "lr": None, "batch_prompts": 0.20, "heldout": 0.15},
            {"direction": "adam", "step_l2": 0.02, "lr": 2e-5, "batch_prompts": 0.44, "heldout": 0.39},
            {"direction": "adam", "step_l2": 0.2, "lr": 2e-4, "batch_prompts": 0.30, "heldout": 0.2}]


def test_largest_safe_step_is_the_largest_not_below_the_start() -> None:
    rows = _rows()
    assert sp._largest_safe(rows, "gradient", 0.40) == 0.01
    assert sp._largest_safe(rows, "adam", 0.40, key="lr") == 2e-5
    assert sp._largest_safe(rows, "adam", 0.50, key="lr") is None


def test_table_shows_every_row_with_its_change_from_the_start() -> None:
    result = {"prompts": 64, "samples_per_prompt": 32, "batch_pass_rate": 0.41, "gradient_l2": 0.8,
              "rows": _rows(), "largest_safe_adam_lr": 2e-5}
    table = sp.format_table(result)
    assert "| gradient step | 0.05 | 0.200 (-0.200) | 0.150 (-0.230) |" in table
    assert "| AdamW first update, lr 0.0002 | 0.2 | 0.300 (-0.100) | 0.200 (-0.180) |" in table
    assert table.rstrip().endswith("does not lower the batch's pass rate: 2e-05")
