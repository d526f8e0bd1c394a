"""The vLLM engine against our learner and the torch engine, on the tiny model saved as a Hugging Face
folder (run in the vLLM environment: `make install-vllm`; the main suite ignores this folder).

- step 0: the log-probs vLLM records equal the learner's teacher-forced ones (|log ρ| <= 1e-4, fp32),
  at T = 0.7 with top_p = 1 and with top_p < 1;
- after `load_weights`, samples (greedy) and log-probs equal a transformers forward of the new weights;
- length rules (thinking budget, interruption + answer budget, budget forcing, forced-token records, a
  `</think>` of one token and of two) equal the torch engine's, greedy (deterministic) on the same weights;
- weights swapped between decode steps: tokens' versions change at the swap.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from vllm_helpers import TOL, perturbed

from scalerl.config import ModelConfig
from scalerl.generator.engine import LengthControl, SamplingParams, budget_forcing
from scalerl.generator.torch_engine import TorchEngine
from scalerl.messages import Completion
from scalerl.model.factory import completion_logprobs, load_model_and_tokenizer, save_model_and_tokenizer

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Path]:
    cfg = ModelConfig(tiny={"hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "num_heads": 2,
                            "max_positions": 256})
    model, tok = load_model_and_tokenizer(cfg, seed=3)
    folder = tmp_path_factory.mktemp("tiny-hf")
    save_model_and_tokenizer(model, tok, folder)
    return model.eval(), tok, folder


@pytest.fixture(scope="module")
def engine(policy: tuple[Any, Any, Path]) -> Any:
    from scalerl.generator.vllm_engine import VLLMEngine

    _, tok, folder = policy
    return VLLMEngine(folder, tok, seed=0, kv_cache_memory_bytes=64 << 20, enforce_eager=True)


def prompts(tok: Any) -> list[list[int]]:
    return [tok.encode(s) for s in ("12+34=", "7*8=", "99-5=", "3+3+3=")]


def max_gap(model: Any, prompt: list[int], comp: Completion, temperature: float) -> float:
    """max |log ρ| of a completion: the learner's log-probs against the recorded ones (nats)."""
    learner = completion_logprobs(model, prompt, comp.token_ids, temperature=temperature)
    return float((learner - torch.tensor(comp.logprobs)).abs().max())


def free_run(tok: Any, thinking: int = 40, answer: int = 8) -> LengthControl:
    """Length rules whose special ids are outside the vocabulary: pure sampling to the thinking budget."""
    never = len(tok) + 7
    return LengthControl(thinking_budget=thinking, answer_budget=answer, think_close_ids=(never,), eos_id=never)


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_step0_logprobs_match_learner(engine: Any, policy: tuple[Any, Any, Path], top_p: float) -> None:
    model, tok, _ = policy
    ps = prompts(tok)
    comps = engine.generate(ps, SamplingParams(0.7, top_p), free_run(tok))
    assert all(len(c.token_ids) == 40 and c.finish_reason == "length" for c in comps)
    worst = max(max_gap(model, p, c, 0.7) for p, c in zip(ps, comps, strict=True))
    assert worst <= TOL, f"step-0 max |log ρ| = {worst:.2e} nats"
    # Sampling differs from greedy: the temperature is applied (not the argmax path every row).
    assert len({tuple(c.token_ids) for c in comps}) == len(comps)


def test_weight_update_matches_hf_forward_of_new_weights(engine: Any, policy: tuple[Any, Any, Path]) -> None:
    model, tok, _ = policy
    new = perturbed(model, 7)
    ps = prompts(tok)
    try:
        engine.load_weights(new.state_dict(), engine.version + 1)
        comps = engine.generate(ps, SamplingParams(0.7), free_run(tok, 24))
        assert {v for c in comps for v in c.versions} == {engine.version}
        for p, c in zip(ps, comps, strict=True):
            assert max_gap(new, p, c, 0.7) <= TOL
        greedy = engine.generate(ps, SamplingParams(0.0), free_run(tok, 24))
        ref = TorchEngine(new, tok, seed=0).generate(ps, SamplingParams(0.0), free_run(tok, 24))
        assert [c.token_ids for c in greedy] == [c.token_ids for c in ref]
        old_greedy = TorchEngine(model, tok, seed=0).generate(ps, SamplingParams(0.0), free_run(tok, 24))
        assert [c.token_ids for c in greedy] != [c.token_ids for c in old_greedy]  # the update took effect
    finally:
        engine.load_weights(model.state_dict(), engine.version + 1)


def greedy_paths(model: Any, tok: Any, ps: list[list[int]], n: int) -> list[list[int]]:
    return [c.token_ids for c in TorchEngine(model, tok).generate(ps, SamplingParams(0.0), free_run(tok, n))]


def scenarios(model: Any, tok: Any, ps: list[list[int]]) -> dict[str, LengthControl]:
    """Length rules whose `</think>` / EOS ids are tokens the greedy paths emit, so each rule is hit:
    row 0 closes its thinking early, row 1 ends on EOS, row 3 emits neither in its first 16 tokens
    (it reaches the cut or the budget)."""
    paths = greedy_paths(model, tok, ps, 30)
    keep_going = set(paths[3][:16])
    close = next(t for t in paths[0][2:8] if t not in paths[0][:2] and t not in keep_going)
    eos = next(t for t in paths[1][2:12] if t not in paths[0][:20] and t not in keep_going and t != close)
    phrase = tuple(tok.encode("</think>!"))
    base = LengthControl(thinking_budget=16, answer_budget=5, think_close_ids=(close,), eos_id=eos)
    wait = tuple(tok.encode("Wait"))
    # a </think> spelled as two tokens (SmolLM2's BPE spells it as several): row 0's greedy tokens 3-4,
    # with the one-token spelling above as an alternative
    multi = replace(base, think_close_ids=(paths[0][3], paths[0][4]), think_close_alts=((close,),))
    return {
        "budget_truncates": base,
        "interruption": replace(base, interruption_ids=phrase, window=(6, 12)),
        "stop_ids": replace(base, stop_ids=(paths[2][4],)),
        # a tool call's closing tag: one token, and two (matched as tokens stream in, as `</think>` is)
        "stop_sequence_one": replace(base, stop_sequences=((paths[2][4],),)),
        "stop_sequence_two": replace(base, stop_sequences=((paths[2][3], paths[2][4]),)),
        "forcing_max": budget_forcing(base, max_thinking=8, answer_prefix_ids=tuple(tok.encode("A:"))),
        "forcing_min": budget_forcing(base, min_thinking=10, wait_ids=wait, max_waits=2),
        "forcing_both": budget_forcing(base, max_thinking=12, min_thinking=6, wait_ids=wait, max_waits=1),
        "multi_close": multi,
        "multi_close_interruption": replace(multi, interruption_ids=phrase, window=(6, 12)),
        "multi_close_forcing_min": budget_forcing(multi, min_thinking=10, wait_ids=wait, max_waits=2),
    }


def test_length_rules_equal_torch_engine(engine: Any, policy: tuple[Any, Any, Path]) -> None:
    model, tok, _ = policy
    ps = prompts(tok)
    reasons: set[str] = set()
    for name, length in scenarios(model, tok, ps).items():
        torch_rng, vllm_rng = TorchEngine(model, tok, seed=5), engine
        vllm_rng.set_rng_state(torch_rng.rng_state())  # the same cut points
        ref = torch_rng.generate(ps, SamplingParams(0.0), length)
        got = engine.generate(ps, SamplingParams(0.0), length)
        for r, g in zip(ref, got, strict=True):
            assert g.token_ids == r.token_ids, name
            assert g.loss_mask == r.loss_mask, name
            assert (g.finish_reason, g.thinking_tokens) == (r.finish_reason, r.thinking_tokens), name
            assert max(abs(a - b) for a, b in zip(g.logprobs, r.logprobs, strict=True)) <= TOL, name
            assert g.versions == [engine.version] * len(g.token_ids), name
            reasons.add(g.finish_reason)
        if name == "multi_close":  # row 0's thinking ended at its two-token </think> (position 4 at latest)
            assert got[0].thinking_tokens <= 5, got[0]
        forced = [not m for c in got for m in c.loss_mask]
        if name.startswith(("interruption", "forcing")):
            assert any(forced), f"{name}: no forced token recorded"
    assert {"stop", "length"} <= reasons  # interrupted rows are checked by their forced tokens above


def test_resumed_turns_and_episodes_equal_torch_engine(engine: Any, policy: tuple[Any, Any, Path]) -> None:
    """`resume` (the thinking count and cut carried into a later turn) and whole multi-turn episodes
    (`EpisodeRunner`: stop on the call's closing tokens, an observation, the next turn) give the torch
    engine's tokens, masks, finish reasons and thinking counts, greedy on the same weights."""
    from scalerl.environment.tools import Toolbox
    from scalerl.generator.engine import Resume
    from scalerl.generator.episode import EpisodeRunner

    model, tok, _ = policy
    ps = prompts(tok)
    paths = greedy_paths(model, tok, ps, 30)
    base = replace(scenarios(model, tok, ps)["interruption"], thinking_budget=20)
    resume = [Resume(thinking_used=u, cut=c) for u, c in ((0, 9), (4, 10), (7, 20), (2, 8))]
    ref = TorchEngine(model, tok, seed=5).generate(ps, SamplingParams(0.0), base, resume=resume)
    got = engine.generate(ps, SamplingParams(0.0), base, resume=resume)
    for r, g in zip(ref, got, strict=True):
        assert (g.token_ids, g.loss_mask, g.finish_reason, g.thinking_tokens) == \
            (r.token_ids, r.loss_mask, r.finish_reason, r.thinking_tokens)
    # row 3 (neither </think> nor EOS in its first 16 tokens) resumes at 2 thinking tokens and is cut at 8
    assert got[3].thinking_tokens == 8 and not all(got[3].loss_mask)
    runs = []
    for eng in (TorchEngine(model, tok, seed=5), engine):
        runner = EpisodeRunner(eng, tok, Toolbox(("calculator",)), max_turns=2, max_observation_tokens=40,
                               straggler_s=60)  # every turn waits for all its calls: the same batches
        runner.stop_sequences = ((paths[0][2], paths[0][3]),)  # row 0 "calls" where its greedy path has these
        no_close = replace(base, interruption_ids=None, think_close_ids=(len(tok) + 7,))  # every turn thinks
        runs.append(runner.generate(ps, SamplingParams(0.0), no_close))
        assert runner.calls >= 1
    for r, g in zip(*runs, strict=True):
        assert (g.token_ids, g.loss_mask, g.finish_reason, g.thinking_tokens) == \
            (r.token_ids, r.loss_mask, r.finish_reason, r.thinking_tokens)
        assert max(abs(a - b) for a, b, m in zip(g.logprobs, r.logprobs, g.loss_mask, strict=True) if m) <= TOL


def kept_cache_logprobs(old: Any, new: Any, prompt: list[int], toks: list[int], k: int, T: float) -> torch.Tensor:
    """Reference for a swap after the k-th token: tokens 1..k under the old weights; tokens k+1.. under
    the new weights reading the KV cache the old weights wrote for the prompt and tokens 1..k-1 (the
    k-th token is fed through the new weights at the first step after the swap). [len(toks)]"""
    with torch.no_grad():
        first = old(torch.tensor([prompt + toks[:k - 1]]), use_cache=True)
        rest = new(torch.tensor([toks[k - 1:-1]]), past_key_values=first.past_key_values, use_cache=True)
    logits = torch.cat([first.logits[0, len(prompt) - 1:], rest.logits[0]]).float() / T
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(toks).unsqueeze(-1)).squeeze(-1)


def test_weights_swap_between_decode_steps(engine: Any, policy: tuple[Any, Any, Path]) -> None:
    """PipelineRL in flight: new weights arrive while the rows are decoding; each token carries the
    version that sampled it and its log-prob matches a reference that keeps the old KV cache."""
    model, tok, _ = policy
    new = perturbed(model, 11)
    ps = prompts(tok)
    v0, swaps0, polls = engine.version, engine.swaps_in_flight, [0]

    def source() -> tuple[int, dict[str, torch.Tensor]] | None:
        polls[0] += 1
        return (v0 + 1, new.state_dict()) if polls[0] >= 6 else None

    try:
        comps = engine.generate(ps, SamplingParams(0.7), free_run(tok, 24), policy_source=source)
        assert engine.swaps_in_flight == swaps0 + 1 and engine.version == v0 + 1
        for p, c in zip(ps, comps, strict=True):
            k = c.versions.count(v0)
            assert 0 < k < len(c.token_ids), c.versions
            assert c.versions == [v0] * k + [v0 + 1] * (len(c.token_ids) - k)
            ref = kept_cache_logprobs(model, new, p, c.token_ids, k, 0.7)
            assert float((ref - torch.tensor(c.logprobs)).abs().max()) <= TOL
    finally:
        engine.load_weights(model.state_dict(), engine.version + 1)


@pytest.mark.parametrize(("temperature", "top_p"), [(0.7, 1.0), (0.7, 0.8), (0.0, 1.0)])
def test_next_token_probs_equal_torch_engine(engine: Any, policy: tuple[Any, Any, Path], temperature: float,
                                             top_p: float) -> None:
    """The distribution the evaluation's unique search reads (temperature, then the top-p nucleus)."""
    model, tok, _ = policy
    prefixes = [p + p[:3] for p in prompts(tok)]
    sampling = SamplingParams(temperature, top_p)
    got = engine.next_token_probs(prefixes, sampling)
    ref = TorchEngine(model, tok).next_token_probs(prefixes, sampling)
    assert got.shape == ref.shape and float((got - ref).abs().max()) <= 1e-5


def test_building_the_engine_prints_nothing(policy: tuple[Any, Any, Path]) -> None:
    """vLLM's INFO/WARNING lines stay off the user's terminal, those logged while vllm is imported too."""
    import os
    import subprocess
    import sys

    _, _, folder = policy
    code = ("from scalerl.config import ModelConfig\n"
            "from scalerl.model.factory import load_model_and_tokenizer\n"
            "from scalerl.generator.vllm_engine import VLLMEngine\n"
            f"_, tok = load_model_and_tokenizer(ModelConfig(path={str(folder)!r}), seed=0)\n"
            f"VLLMEngine({str(folder)!r}, tok, kv_cache_memory_bytes=64 << 20, enforce_eager=True)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_LOGGING")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    noise = [line for line in (out.stdout + out.stderr).splitlines() if "vllm" in line.lower() or "Triton" in line]
    assert not noise, noise
