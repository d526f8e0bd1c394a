"""Recipe presets in examples/recipes/: each one sets exactly the recipe axes it claims to.

Every preset is loaded with `load_spec` (so `extends: ../quickstart.yaml` is resolved the way users
see it) and compared field by field with the quickstart: the fields a preset sets must have the
values below, and every other field must equal the quickstart's. The set of fields in the file must
equal the expected set both ways, so a preset can neither lose one of its axes nor pick up an
unrelated change (a budget, a learning rate) without this test being updated (scalerl-spec.md §4.2,
§4.5–4.6).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from scalerl.config import load_spec

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
QUICKSTART = EXAMPLES / "quickstart.yaml"
RECIPES = EXAMPLES / "recipes"

# The quickstart budgets are 48 thinking + 8 answer tokens; the length-penalty presets scale the
# paper's L_max = 14k / L_cache = 2k (§2.9) to them.
_LP = {"generation.length_control": "length_penalty",
       "generation.length_penalty.max_tokens": 56,
       "generation.length_penalty.cache_tokens": 8}
_NO_FP32 = {"model.fp32_lm_head": False}
_PPO8 = {"off_policy.mode": "ppo", "off_policy.k": 8}
_UNIFORM = {"curriculum.no_positive_resampling": False}
_DAPO = {"loss.type": "dapo", "loss.ppo_clip_low": 0.2, "loss.ppo_clip_high": 0.26}

# preset stem -> {dotted field: value} for every field its file sets (besides name). Axes equal to
# the ScaleRL default are still pinned where the recipe is defined by them (e.g. ppo k = 8, CISPO
# for MiniMax-M1), so a preset still says what it is if the JobSpec defaults ever move.
EXPECTED: dict[str, dict[str, Any]] = {
    "scalerl": {},
    # §4.2 cross-recipe comparison (Fig. 2)
    "deepseek-grpo": {"loss.type": "grpo", "loss.ppo_clip_low": 0.2, "loss.ppo_clip_high": 0.2,
                      "loss.aggregation": "sample", "loss.advantage_normalization": "group",
                      "loss.zero_variance_filter": False, **_PPO8, **_NO_FP32, **_UNIFORM},
    "qwen25-dapo": {**_DAPO, "loss.aggregation": "prompt", "loss.advantage_normalization": "group",
                    "loss.zero_variance_filter": True, **_PPO8, **_NO_FP32, **_UNIFORM, **_LP},
    "magistral": {**_DAPO, "loss.aggregation": "prompt", "loss.advantage_normalization": "group",
                  "loss.zero_variance_filter": True, "off_policy.mode": "pipeline", "off_policy.k": 8,
                  **_NO_FP32, **_UNIFORM, **_LP},
    "minimax-m1": {"loss.type": "cispo", "loss.aggregation": "prompt", "loss.zero_variance_filter": True,
                   **_PPO8, "model.fp32_lm_head": True, **_UNIFORM},
    # §4.6 leave-one-out variants of ScaleRL
    "loo-dapo": _DAPO,
    "loo-fp32": _NO_FP32,
    "loo-8op": _PPO8,
    "loo-savg": {"loss.aggregation": "sample"},
    "loo-plan": {"loss.advantage_normalization": "group"},
    "loo-batch": {"loss.zero_variance_filter": False},
    "loo-lp": _LP,
    "loo-uniform": _UNIFORM,
}

# Fields that must actually differ from the quickstart (ScaleRL defaults) - the point of each preset.
MUST_DIFFER: dict[str, set[str]] = {
    "scalerl": set(),
    "deepseek-grpo": {"loss.type", "loss.aggregation", "loss.advantage_normalization", "loss.zero_variance_filter",
                      "off_policy.mode", "model.fp32_lm_head", "curriculum.no_positive_resampling"},
    "qwen25-dapo": {"loss.type", "loss.advantage_normalization", "off_policy.mode", "model.fp32_lm_head",
                    "curriculum.no_positive_resampling", "generation.length_control"},
    "magistral": {"loss.type", "loss.advantage_normalization", "model.fp32_lm_head",
                  "curriculum.no_positive_resampling", "generation.length_control"},
    "minimax-m1": {"off_policy.mode", "curriculum.no_positive_resampling"},
    "loo-dapo": {"loss.type"},
    "loo-fp32": {"model.fp32_lm_head"},
    "loo-8op": {"off_policy.mode"},
    "loo-savg": {"loss.aggregation"},
    "loo-plan": {"loss.advantage_normalization"},
    "loo-batch": {"loss.zero_variance_filter"},
    "loo-lp": {"generation.length_control"},
    "loo-uniform": {"curriculum.no_positive_resampling"},
}


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, path + "."))
        else:
            out[path] = value
    return out


def _fields(path: Path) -> dict[str, Any]:
    return _flatten(load_spec(path).model_dump(mode="json"))


def _diff(path: Path) -> dict[str, Any]:
    base, preset = _fields(QUICKSTART), _fields(path)
    assert base.keys() == preset.keys()
    return {k: v for k, v in preset.items() if v != base[k] and k != "name"}


def test_every_preset_file_is_covered():
    on_disk = {p.stem for p in RECIPES.glob("*.yaml")}
    assert on_disk == set(EXPECTED), f"untested or missing presets: {on_disk ^ set(EXPECTED)}"


@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_preset_has_its_recipe_values_and_changes_nothing_else(stem):
    path = RECIPES / f"{stem}.yaml"
    fields, base = _fields(path), _fields(QUICKSTART)
    for key, value in EXPECTED[stem].items():
        assert fields[key] == value, f"{stem}: {key} = {fields[key]!r}, expected {value!r}"
    changed = _diff(path)
    assert set(changed) <= set(EXPECTED[stem]), f"{stem}: unexpected changes {set(changed) - set(EXPECTED[stem])}"
    assert MUST_DIFFER[stem] <= set(changed), f"{stem}: no longer differs in {MUST_DIFFER[stem] - set(changed)}"
    assert all(fields[k] == base[k] for k in fields if k not in EXPECTED[stem] and k != "name")


@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_preset_extends_the_quickstart_and_is_named_after_its_file(stem):
    path = RECIPES / f"{stem}.yaml"
    raw = yaml.safe_load(path.read_text())
    assert raw["extends"] == "../quickstart.yaml"
    assert raw["name"] == stem
    assert load_spec(path).name == stem


@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_preset_sets_only_recipe_axes_and_cites_the_spec(stem):
    """Nothing but the name and recipe axes appears in the file, and each field line cites a § of the spec."""
    path = RECIPES / f"{stem}.yaml"
    raw = _flatten(yaml.safe_load(path.read_text()))
    raw.pop("extends"), raw.pop("name")
    assert raw == EXPECTED[stem]
    for line in path.read_text().splitlines():
        body = line.split("#", 1)[0].rstrip()
        is_leaf = body and not body.endswith(":") and not body.startswith(("extends:", "name:"))
        if is_leaf:
            assert "§" in line, f"{path.name}: field line without a spec reference: {line!r}"


def test_scalerl_preset_is_the_quickstart_apart_from_the_name():
    base = load_spec(QUICKSTART).model_dump(mode="json")
    preset = load_spec(RECIPES / "scalerl.yaml").model_dump(mode="json")
    assert preset.pop("name") == "scalerl"
    base.pop("name")
    assert preset == base


def test_presets_keep_the_quickstart_budgets_and_learning_rate():
    """The paper's per-recipe learning rates and batch sizes are not carried over (see the README)."""
    base = load_spec(QUICKSTART)
    for stem in EXPECTED:
        s = load_spec(RECIPES / f"{stem}.yaml")
        assert s.optim == base.optim and s.train == base.train and s.eval == base.eval and s.sft == base.sft
        assert s.generation.group_size == base.generation.group_size
        assert (s.generation.thinking_budget_tokens, s.generation.answer_budget_tokens) == (48, 8)


def test_length_penalty_is_scaled_to_the_quickstart_budget():
    s = load_spec(RECIPES / "loo-lp.yaml")
    lp = s.generation.length_penalty
    assert lp.max_tokens == s.generation.thinking_budget_tokens + s.generation.answer_budget_tokens
    assert 0 < lp.cache_tokens < lp.max_tokens


def test_presets_accept_the_comparison_overrides():
    """The README's comparison command line must keep validating for every preset."""
    for stem in EXPECTED:
        s = load_spec(RECIPES / f"{stem}.yaml", ["model.init_checkpoint=/tmp/cmp-sft/sft", "train.steps=150",
                                                  "eval.every_steps=15", "runtime.threads=1"])
        assert s.train.steps == 150 and s.eval.every_steps == 15 and s.runtime.threads == 1
