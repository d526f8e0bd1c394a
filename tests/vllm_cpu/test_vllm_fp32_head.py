"""The FP32 head inside vLLM (ScaleRL §2.3), on the tiny model in bfloat16 (vLLM environment).

`VLLMEngine(fp32_head=True)` sets vLLM's `head_dtype` to float32: the lm_head projection runs in fp32 on
the model-dtype hidden state and weight, as the learner's FP32 head computes it. Checked against an
independent computation of the projection, and end to end as the step-0 |log ρ| between the vLLM
generator and our learner (both bf16 bodies, FP32 heads) at T = 0.7. Measured on the real model (README):
the FP32 head brings vLLM's mean |log ρ| in bf16 close to the torch engine's; the rest is the bf16 body.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from scalerl.config import ModelConfig
from scalerl.generator.engine import LengthControl, SamplingParams
from scalerl.model.factory import completion_logprobs, load_model_and_tokenizer, save_model_and_tokenizer

pytestmark = pytest.mark.vllm
# nats: step-0 |log ρ| bound in bf16 on the tiny model. Two bf16 bodies with different kernels (vLLM's
# paged attention and GEMMs, torch's) round differently: measured max 3.5e-3 with the FP32 head, 3.6e-3
# with the bf16 head (AVX2): on a 102-symbol vocabulary the head's rounding is small beside the body's.
BF16_TOL = 2e-2


@pytest.fixture(scope="module")
def bf16_policy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Path]:
    cfg = ModelConfig(tiny={"hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "num_heads": 2,
                            "max_positions": 256}, dtype="bfloat16")
    model, tok = load_model_and_tokenizer(cfg, seed=3)
    folder = tmp_path_factory.mktemp("tiny-bf16-hf")
    save_model_and_tokenizer(model, tok, folder)
    return model.eval(), tok, folder


@pytest.fixture(scope="module", params=[True, False], ids=["fp32-head", "bf16-head"])
def bf16_engine(request: pytest.FixtureRequest, bf16_policy: tuple[Any, Any, Path]) -> Any:
    from scalerl.generator.vllm_engine import VLLMEngine

    _, tok, folder = bf16_policy
    return VLLMEngine(folder, tok, seed=0, dtype="bfloat16", kv_cache_memory_bytes=64 << 20,
                      enforce_eager=True, fp32_head=request.param)


def head_projection(engine: Any, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's logits for `hidden` [N, H] through its own compute_logits, and its lm_head weight [V, H]."""
    def run(worker: Any) -> tuple[torch.Tensor, torch.Tensor]:
        model = worker.model_runner.get_model()
        with torch.no_grad():
            return model.compute_logits(hidden).clone(), model.lm_head.weight.detach().clone()
    return engine.core.collective_rpc(run)[0]  # type: ignore[no-any-return]


def test_head_runs_in_the_dtype_asked(bf16_engine: Any) -> None:
    fp32 = bf16_engine.core.model_config.head_dtype == torch.float32
    hidden = torch.randn(5, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    logits, weight = head_projection(bf16_engine, hidden)
    assert weight.dtype == torch.bfloat16  # the weight stays in the model's dtype; only the product is fp32
    # what the learner's FP32 head computes (vLLM pads the head's rows; its logits drop the padding)
    reference = F.linear(hidden.float(), weight.float())[:, :logits.shape[-1]]
    if fp32:
        assert logits.dtype == torch.float32
        assert float((logits - reference).abs().max()) <= 1e-4
    else:
        assert logits.dtype == torch.bfloat16
        # rounded to bf16: off by up to half a unit in the last place (8 bits of mantissa)
        assert float((logits.float() - reference).abs().max()) <= float(reference.abs().max()) * 2 ** -8


def test_step0_logprobs_match_bf16_learner(bf16_engine: Any, bf16_policy: tuple[Any, Any, Path]) -> None:
    model, tok, _ = bf16_policy
    ps = [tok.encode(s) for s in ("12+34=", "7*8=", "99-5=", "3+3+3=")]
    never = len(tok) + 7
    rules = LengthControl(thinking_budget=40, answer_budget=8, think_close_ids=(never,), eos_id=never)
    comps = bf16_engine.generate(ps, SamplingParams(0.7), rules)
    worst = max(float((completion_logprobs(model, p, c.token_ids, temperature=0.7) - torch.tensor(c.logprobs))
                      .abs().max()) for p, c in zip(ps, comps, strict=True))
    assert worst <= BF16_TOL, f"bf16 step-0 max |log ρ| = {worst:.2e} nats"


@pytest.mark.parametrize("fp32_head", [True, False])
def test_factory_passes_model_fp32_lm_head(bf16_policy: tuple[Any, Any, Path], tmp_path: Path,
                                           fp32_head: bool) -> None:
    """`model.fp32_lm_head` reaches vLLM's head dtype through the one engine factory (not ignored)."""
    from scalerl.config import load_spec
    from scalerl.generator.factory import make_engine

    model, tok, folder = bf16_policy
    quickstart = Path(__file__).parents[2] / "examples" / "quickstart.yaml"
    spec = load_spec(quickstart, ["generation.engine=vllm", "model.dtype=bfloat16",
                                  f"model.fp32_lm_head={str(fp32_head).lower()}"])
    engine = make_engine(spec, model, tok, seed=0, workdir=tmp_path, model_folder=folder)
    assert engine.core.model_config.head_dtype == (torch.float32 if fp32_head else torch.bfloat16)
