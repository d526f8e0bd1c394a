"""GPU paths (run with `pytest -m gpu` on a CUDA machine; CI has none and deselects them).

bf16 model with the FP32 head on CUDA: generator log-probs match the learner's teacher-forced ones,
and a learner step runs on the device.
"""

from __future__ import annotations

import copy

import pytest
import torch

from scalerl.generator.engine import SamplingParams
from scalerl.generator.role import encode_prompt, length_control
from scalerl.generator.torch_engine import TorchEngine
from scalerl.learner.learner import Learner
from scalerl.messages import PromptTask, RolloutGroup, ScoredGroup
from scalerl.model.factory import build_tiny_model, keep_head_in_fp32, sequence_logprobs

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_bf16_with_fp32_head_logprobs_match(tiny_spec, tokenizer):
    model = build_tiny_model(tiny_spec.model, tokenizer, seed=0).to("cuda", torch.bfloat16).eval()
    keep_head_in_fp32(model)
    assert model.lm_head.weight.dtype == torch.float32
    eng = TorchEngine(model, tokenizer, fp32_head=True, seed=0)
    prompts = [encode_prompt(tokenizer, "12+34=")] * 8
    comps = eng.generate(prompts, SamplingParams(), length_control(tiny_spec, tokenizer))
    worst = 0.0
    for p, c in zip(prompts, comps, strict=True):
        full = torch.tensor([p + c.token_ids], device="cuda")
        inp, tgt = full[:, :-1], full[:, 1:]
        with torch.no_grad():
            logp, _ = sequence_logprobs(model, inp, torch.ones_like(inp), tgt, fp32_head=True)
        worst = max(worst, (logp[0, len(p) - 1:].cpu() - torch.tensor(c.logprobs)).abs().max().item())
    # bf16 trunk: the KV-cached and full forward differ by bf16 rounding, the head adds nothing.
    assert worst < 5e-2, worst


def test_learner_step_on_cuda(tiny_spec, tokenizer):
    model = build_tiny_model(tiny_spec.model, tokenizer, seed=0).to("cuda")
    eng = TorchEngine(copy.deepcopy(model).eval(), tokenizer, seed=1)
    task = PromptTask("p", 0, "1+2=", "3", 4, "addition")
    pids = encode_prompt(tokenizer, task.prompt)
    comps = eng.generate([pids] * 4, SamplingParams(), length_control(tiny_spec, tokenizer))
    group = ScoredGroup(RolloutGroup(task, pids, comps), [1.0, -1.0, -1.0, 1.0], [True, False, False, True])
    before = model.lm_head.weight.detach().clone()
    stats = Learner(tiny_spec, model, pad_id=tokenizer.pad_token_id).step([group])
    assert stats["batch/effective"] == 1.0
    assert not torch.equal(before, model.lm_head.weight.detach())


def test_fsdp_on_one_cuda_device_matches_plain(tmp_path):
    """FSDP2 over one GPU (nccl, world 1) takes the same step as the unsharded learner on that GPU."""
    import importlib.util
    from pathlib import Path

    src = Path(__file__).parents[1] / "distributed" / "test_fsdp_learner.py"
    mod_spec = importlib.util.spec_from_file_location("fsdp_helpers", src)
    assert mod_spec and mod_spec.loader
    helpers = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(helpers)
    run_worker, assert_same_step = helpers.run_worker, helpers.assert_same_step
    plain = run_worker(1, tmp_path / "plain.pt", device="cuda", mode="plain")
    fsdp = run_worker(1, tmp_path / "fsdp.pt", device="cuda", mode="fsdp")
    assert_same_step(plain, fsdp, world=1, rtol=1e-3, atol=1e-5)  # TF32 / kernel choice on the GPU
