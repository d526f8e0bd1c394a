"""PipelineRL-k in embedded mode: the in-flight bound, per-token ages, k = 1 is synchronous, and a
larger k gives older tokens.

Structural, not timing-dependent: the run starts with k × B prompts issued before the generator
threads start, and one generator takes them all (`prompts_per_batch` = k × B), so the first k steps
train groups sampled entirely by version 0, at versions 0, 1, ..., k − 1. Whatever the threads do
afterwards, the learner waits rather than trains a token more than k versions old. Zero-variance
filtering is off so that every consumed group is trained (its tokens counted) whatever the rewards.
"""

from __future__ import annotations

import json

import pytest

from scalerl.config import spec_from_dict
from scalerl.runtime.embedded import EmbeddedRun

B = 2


def _run(tmp_path, k: int, steps: int):
    spec = spec_from_dict({
        "name": f"pipeline-k{k}", "seed": 0,
        "model": {"tiny": {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2, "num_heads": 2,
                           "max_positions": 128}},
        "task": {"kind": "addition", "digits": 2, "train_size": 200, "eval_size": 2},
        "sft": {"steps": 0},
        "generation": {"group_size": 2, "thinking_budget_tokens": 16, "answer_budget_tokens": 4,
                       "interruption": {"window_tokens": [12, 16]}, "prompts_per_batch": k * B},
        "loss": {"zero_variance_filter": False},
        "off_policy": {"mode": "pipeline", "k": k, "embedded_generators": 2},
        "optim": {"lr": 1e-3, "warmup_steps": 0},
        "train": {"prompts_per_step": B, "steps": steps, "checkpoint_every": 100},
        "eval": {"every_steps": 100, "samples_per_prompt": 1},
        "runtime": {"threads": 1},
    })
    summary = EmbeddedRun(spec, tmp_path / f"k{k}", show_progress=False).run()
    lines = (tmp_path / f"k{k}" / "train.jsonl").read_text().splitlines()
    steps_recs = [r for r in map(json.loads, lines) if r["kind"] == "step"]
    return summary, steps_recs


def _hist(rec) -> dict[int, int]:
    return {int(a): n for a, n in rec["token_age"]["hist"].items()}


@pytest.mark.timeout(300)
def test_k1_is_synchronous(tmp_path):
    summary, steps = _run(tmp_path, k=1, steps=4)
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    for r in steps:  # every trained token was sampled by the very weights being trained
        assert set(_hist(r)) == {0} and r["token_age"]["max"] == 0 and r["staleness_max"] == 0
        assert r["effective_batch"] == B
    assert summary["dropped_stale"] == 0
    assert summary["token_age"]["max"] == 0 and summary["token_age"]["share_age_ge_1"] == 0


@pytest.mark.timeout(300)
def test_larger_k_gives_older_tokens_within_the_bound(tmp_path):
    k = 4
    summary, steps = _run(tmp_path, k=k, steps=2 * k)
    assert [r["step"] for r in steps] == list(range(1, 2 * k + 1))
    for r in steps:  # the bound: no trained token is older than k versions
        assert max(_hist(r)) <= k and r["token_age"]["max"] <= k
    # The first k steps train the first generator batch (all sampled by version 0): ages 0, 1, ..., k-1.
    for i, r in enumerate(steps[:k]):
        assert set(_hist(r)) == {i}, (r["step"], r["token_age"])
    # The summary is the sum of the step histograms.
    total: dict[int, int] = {}
    for r in steps:
        for a, n in _hist(r).items():
            total[a] = total.get(a, 0) + n
    assert {int(a): n for a, n in summary["token_age"]["hist"].items()} == total
    assert summary["token_age"]["tokens"] == sum(total.values())
    assert k - 1 <= summary["token_age"]["max"] <= k
    assert summary["generator_workers"] == 2
