"""`scalerl run --smoke`'s preset (runtime/smoke.py): caps what multiplies the work, keeps the set-up."""

from __future__ import annotations

from pathlib import Path

from scalerl.config import load_spec
from scalerl.runtime.smoke import SMOKE_CAPS, smoke_banner, smoke_overrides, smoke_spec

REPO = Path(__file__).resolve().parents[3]
QUICKSTART = str(REPO / "examples" / "quickstart.yaml")


def test_quickstart_caps_and_what_stays() -> None:
    spec = load_spec(QUICKSTART)
    smoke, overrides = smoke_spec(QUICKSTART, [], spec)
    assert {o.field: (o.old, o.new) for o in overrides} == {
        "train.steps": (600, 3), "train.prompts_per_step": (16, 4), "generation.group_size": (8, 4),
        "generation.prompts_per_batch": (16, 4), "curriculum.max_inflight_prompts": (None, 12),
        "sft.steps": (360, 5), "sft.batch_size": (64, 8), "eval.limit_prompts": (None, 8),
        "eval.samples_per_prompt": (8, 2), "eval.prompts_per_batch": (None, 8),
        "loss.zero_variance_filter": (True, False)}
    assert smoke.train.steps == 3 and smoke.eval.limit_prompts == 8 and not smoke.loss.zero_variance_filter
    # the set-up is the real run's: model, task and its held-out split, budgets, loss, off-policy bound
    for section in ("model", "task", "off_policy", "optim", "fit", "runtime"):
        assert getattr(smoke, section) == getattr(spec, section), section
    assert smoke.generation.thinking_budget_tokens == spec.generation.thinking_budget_tokens
    assert smoke.generation.interruption == spec.generation.interruption and smoke.loss.type == spec.loss.type
    banner = smoke_banner(overrides).splitlines()
    assert banner[0].startswith("smoke run: a few steps and a tiny evaluation to check the set-up")
    assert "  train.steps: 600 -> 3 steps" in banner and "  eval.limit_prompts: null -> 8 prompts" in banner


def test_caps_never_raise_a_value_and_user_sets_come_first() -> None:
    sets = ["train.steps=1", "eval.limit_prompts=2", "generation.group_size=2"]
    spec = load_spec(QUICKSTART, sets)
    smoke, overrides = smoke_spec(QUICKSTART, sets, spec)
    assert smoke.train.steps == 1 and smoke.eval.limit_prompts == 2 and smoke.generation.group_size == 2
    assert not {"train.steps", "eval.limit_prompts", "generation.group_size"} & {o.field for o in overrides}
    for cap in SMOKE_CAPS:
        assert all(o.new <= cap.most for o in overrides if o.field == cap.field)


def test_no_sft_caps_when_the_spec_runs_no_sft() -> None:
    spec = load_spec(QUICKSTART, ["sft.steps=0"])
    assert not any(o.field.startswith("sft.") for o in smoke_overrides(spec))
    already = load_spec(QUICKSTART, [f"{c.field}={c.most}" for c in SMOKE_CAPS] + ["loss.zero_variance_filter=false"])
    assert smoke_overrides(already) == []
    assert smoke_banner([]).endswith("(none: every setting was already within the caps)")
