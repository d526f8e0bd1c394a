"""JobSpec: defaults are the ScaleRL recipe; bad input names the field and what is allowed."""

from __future__ import annotations

import pytest

from scalerl.config import SCALERL_INTERRUPTION_PHRASE, JobSpec, SpecError, load_spec, spec_from_dict


def test_defaults_are_the_scalerl_recipe():
    s = JobSpec()
    assert (s.off_policy.mode, s.off_policy.k) == ("pipeline", 8)
    assert s.loss.type == "cispo" and s.loss.cispo_eps_max == 5.0
    assert s.loss.aggregation == "prompt" and s.loss.advantage_normalization == "batch"
    assert s.loss.zero_variance_filter is True
    assert s.model.fp32_lm_head is True
    assert s.curriculum.no_positive_resampling and s.curriculum.npr_threshold == 0.9
    assert s.generation.length_control == "interruption"
    assert s.generation.interruption.phrase == SCALERL_INTERRUPTION_PHRASE
    assert s.generation.interruption.phrase.endswith("</think>")
    assert (s.optim.adam_eps, s.optim.weight_decay, s.optim.lr, s.optim.warmup_steps) == (1e-15, 0.01, 5e-7, 100)
    assert s.generation.group_size == 16 and s.train.prompts_per_step == 48
    assert (s.generation.thinking_budget_tokens, s.generation.answer_budget_tokens) == (12288, 2048)
    assert s.eval.every_steps == 100 and s.eval.samples_per_prompt == 16


@pytest.mark.parametrize(("tree", "field", "allowed"), [
    ({"loss": {"type": "cispoo"}}, "loss.type", "'cispo', 'grpo', 'dapo' or 'gspo'"),
    ({"generation": {"group_size": 0}}, "generation.group_size", "greater than or equal to 1"),
    ({"off_policy": {"mode": "async"}}, "off_policy.mode", "'pipeline' or 'ppo'"),
    ({"loss": {"aggregation": "batch"}}, "loss.aggregation", "'prompt', 'sample' or 'token'"),
    ({"trian": {"steps": 3}}, "trian", "unknown field"),
    ({"train": {"steps": "many"}}, "train.steps", "valid integer"),
    ({"name": "Bad_Name"}, "name", "pattern"),
    ({"loss": {"type": "cispo", "ppo_clip_high": 0.28}}, "loss", "cispo_eps_max"),
    ({"task": {"kind": "jsonl"}}, "task", "train_path is required"),
    ({"off_policy": {"mode": "ppo", "embedded_generators": 2}}, "off_policy", "mode 'pipeline' only"),
    ({"off_policy": {"embedded_generators": 0}}, "off_policy.embedded_generators", "greater than or equal to 1"),
])
def test_bad_values_name_the_field(tree, field, allowed):
    with pytest.raises(SpecError) as err:
        spec_from_dict(tree)
    msg = str(err.value)
    assert msg.startswith(field + ":"), msg
    assert allowed in msg


def test_interruption_window_must_fit_the_budget():
    with pytest.raises(SpecError, match="window_tokens"):
        spec_from_dict({"generation": {"thinking_budget_tokens": 100, "interruption": {"window_tokens": [50, 200]}}})


def test_overrides_parse_yaml_scalars(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("name: t\nloss:\n  type: dapo\n")
    s = load_spec(p, ["train.steps=7", "loss.ppo_clip_high=0.26", "model.fp32_lm_head=false"])
    assert s.train.steps == 7 and s.loss.ppo_clip_high == 0.26 and s.model.fp32_lm_head is False
    with pytest.raises(SpecError, match=r"expected dotted\.key=value"):
        load_spec(p, ["train.steps"])


def test_unreadable_and_non_mapping_files(tmp_path):
    with pytest.raises(SpecError, match="cannot read job spec"):
        load_spec(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(SpecError, match="must be a mapping"):
        load_spec(bad)
    broken = tmp_path / "broken.yaml"
    broken.write_text("a: [1, 2\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(broken)


def test_extends_merges_sections(tmp_path):
    (tmp_path / "base.yaml").write_text("name: base\nloss:\n  type: dapo\n  aggregation: token\ntrain:\n  steps: 9\n")
    (tmp_path / "child.yaml").write_text("extends: base.yaml\nname: child\nloss:\n  aggregation: sample\n")
    s = load_spec(tmp_path / "child.yaml")
    assert (s.name, s.loss.type, s.loss.aggregation, s.train.steps) == ("child", "dapo", "sample", 9)
    (tmp_path / "loop.yaml").write_text("extends: loop.yaml\n")
    with pytest.raises(SpecError, match="extends itself"):
        load_spec(tmp_path / "loop.yaml")


def test_inflight_depth_scales_with_k():
    """The curriculum's default in-flight depth is k steps' worth of prompts (k = 1: synchronous)."""
    for k in (1, 4, 8):
        s = spec_from_dict({"off_policy": {"k": k}, "train": {"prompts_per_step": 6}})
        assert s.max_inflight_prompts == 6 * k
    assert spec_from_dict({"curriculum": {"max_inflight_prompts": 5}}).max_inflight_prompts == 5
    assert JobSpec().off_policy.embedded_generators is None  # 2 worker threads with the torch engine


def test_eval_batch_defaults_to_the_rollout_batch_and_can_be_set_apart():
    assert spec_from_dict({"generation": {"prompts_per_batch": 3}}).eval_prompts_per_batch == 3
    spec = spec_from_dict({"generation": {"prompts_per_batch": 3}, "eval": {"prompts_per_batch": 32}})
    assert (spec.eval_prompts_per_batch, spec.generation.prompts_per_batch) == (32, 3)
    with pytest.raises(SpecError, match=r"eval\.prompts_per_batch"):
        spec_from_dict({"eval": {"prompts_per_batch": 0}})
