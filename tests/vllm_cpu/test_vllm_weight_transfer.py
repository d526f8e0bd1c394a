"""vLLM's weight-transfer seam on CPU: the learner broadcasts, vLLM receives through its own calls.

The learner runs as its own process in the project's environment (torch 2.15, no vLLM:
SCALERL_LEARNER_PYTHON, set by scripts/vllm_python.sh) and sends over gloo with
`scalerl.model.weight_broadcast.WeightBroadcaster`; the vLLM engine (torch 2.13) was built with
`weight_transfer_config={"backend": "scalerl_broadcast"}` and takes each update through vLLM's
`init_weight_transfer_engine`, `start_weight_update`, `update_weights` and `finish_weight_update`.
After each update, greedy samples equal the torch engine's on the sent weights and the recorded
log-probs equal a transformers forward of them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from vllm_helpers import TOL, perturbed

from scalerl.config import ModelConfig
from scalerl.generator.engine import LengthControl, SamplingParams
from scalerl.generator.torch_engine import TorchEngine
from scalerl.model.factory import completion_logprobs, load_model_and_tokenizer, save_model_and_tokenizer
from scalerl.model.weight_broadcast import start_learner_process, update_info

pytestmark = pytest.mark.vllm


def free_run(tok: Any, n: int = 24) -> LengthControl:
    never = len(tok) + 7
    return LengthControl(thinking_budget=n, answer_budget=4, think_close_ids=(never,), eos_id=never)


def greedy(model: Any, tok: Any, ps: list[list[int]]) -> list[list[int]]:
    return [c.token_ids for c in TorchEngine(model, tok, seed=0).generate(ps, SamplingParams(0.0), free_run(tok))]


def test_learner_broadcasts_through_vllms_weight_transfer_calls(tmp_path: Path) -> None:
    from scalerl.generator.vllm_engine import BROADCAST_BACKEND, VLLMEngine

    cfg = ModelConfig(tiny={"hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "num_heads": 2,
                            "max_positions": 256})
    model, tok = load_model_and_tokenizer(cfg, seed=3)
    model.eval()
    save_model_and_tokenizer(model, tok, tmp_path / "hf")
    rounds = [perturbed(model, 7), perturbed(model, 8)]
    for i, m in enumerate(rounds):
        torch.save(m.state_dict(), tmp_path / f"round{i}.pt")
    ps = [tok.encode(s) for s in ("12+34=", "7*8=", "99-5=")]
    engine = VLLMEngine(tmp_path / "hf", tok, seed=0, kv_cache_memory_bytes=64 << 20, enforce_eager=True,
                        weight_transfer=BROADCAST_BACKEND)
    assert [c.token_ids for c in engine.generate(ps, SamplingParams(0.0), free_run(tok))] == greedy(model, tok, ps)

    learner, port, learner_torch = start_learner_process(os.environ.get("SCALERL_LEARNER_PYTHON", sys.executable),
                                                         [tmp_path / f"round{i}.pt" for i in range(2)])
    try:
        engine.connect_weight_transfer({"address": "127.0.0.1", "port": port, "world_size": 2, "rank": 1})
        for version, new in enumerate(rounds, start=1):
            engine.receive_weights(update_info(new.state_dict()), version)
            assert engine.version == version
            got = engine.generate(ps, SamplingParams(0.7), free_run(tok))
            assert {v for c in got for v in c.versions} == {version}
            for p, c in zip(ps, got, strict=True):
                gap = (completion_logprobs(new, p, c.token_ids, temperature=0.7) - torch.tensor(c.logprobs)).abs()
                assert float(gap.max()) <= TOL, f"round {version}: max |log ρ| {float(gap.max()):.2e} nats"
            got = engine.generate(ps, SamplingParams(0.0), free_run(tok))
            assert [c.token_ids for c in got] == greedy(new, tok, ps)
        out, err = learner.communicate(timeout=60)
    finally:
        learner.kill()
    assert learner.returncode == 0, err
    assert out.split() == ["sent", "2"]
    # the two rounds differ from each other and from the start: each update took effect
    assert len({tuple(map(tuple, greedy(m, tok, ps))) for m in (model, *rounds)}) == 3
    print(f"learner torch {learner_torch} -> vLLM's torch {torch.__version__}")
