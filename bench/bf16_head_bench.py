"""`make bench` section "bf16_head": the generator/learner mismatch in bfloat16, with and without the FP32
head inside vLLM (ScaleRL §2.3), beside our torch engine's, on the tiny model and the real model. Run in
the vLLM environment (`make install-vllm`).

Per model, loaded in bfloat16 with our FP32 head as the learner holds it: the same prompts are sampled at
T = 0.7 for --new-tokens tokens (no row stops early) by the torch engine (FP32 head), by vLLM with
`head_dtype` float32 and by vLLM with the head in bf16; each sampled token's recorded log-prob is compared
with the learner's teacher-forced one (`sequence_logprobs`, FP32 head, same temperature). Reported:
mean, 99th percentile and max of |log ρ| = |log π_learner − log π_generator| in nats over the tokens.
Each configuration samples its own tokens (from nearly the same distribution), so compare means and
percentiles, not single tokens. The section is merged into --out.

    PY=.venv/bin/python scripts/vllm_python.sh bench/bf16_head_bench.py --out bench/results.json \\
        [--real-folder FOLDER]   # default: $SCALERL_REAL_MODEL_FOLDER, which the script sets
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from results_file import merge_sections
from scalerl.config import ModelConfig
from scalerl.console import quiet_third_party_bars
from scalerl.generator.engine import GenerationEngine, LengthControl, SamplingParams
from scalerl.generator.role import encode_prompt
from scalerl.generator.torch_engine import TorchEngine
from scalerl.generator.vllm_engine import VLLMEngine
from scalerl.model.factory import completion_logprobs, load_model_and_tokenizer, save_model_and_tokenizer

TEMPERATURE = 0.7
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "num_heads": 2, "max_positions": 256}


def mismatch(model: Any, engine: GenerationEngine, prompts: list[list[int]], new_tokens: int) -> dict[str, float]:
    """|log ρ| statistics (nats) of `engine`'s samples against the learner's log-probs of the same tokens."""
    never = 10**9  # outside every vocabulary: every row samples new_tokens tokens
    rules = LengthControl(thinking_budget=new_tokens, answer_budget=1, think_close_ids=(never,), eos_id=never)
    gaps = []
    for prompt, comp in zip(prompts, engine.generate(prompts, SamplingParams(TEMPERATURE), rules), strict=True):
        learner = completion_logprobs(model, prompt, comp.token_ids, temperature=TEMPERATURE)
        gaps.append((learner - torch.tensor(comp.logprobs)).abs())
    gap = torch.cat(gaps).double()
    return {"mean": float(gap.mean()), "p99": float(gap.quantile(0.99)), "max": float(gap.max()),
            "tokens": int(gap.numel())}


def bench_model(cfg: ModelConfig, folder: Path | None, work: Path, texts: list[str],
                new_tokens: int) -> dict[str, Any]:
    model, tok = load_model_and_tokenizer(cfg, seed=3)
    model.eval()
    if folder is None:
        folder = work
        save_model_and_tokenizer(model, tok, folder)
    prompts = [encode_prompt(tok, t) for t in texts]
    row: dict[str, Any] = {"torch_engine_fp32_head": mismatch(model, TorchEngine(model, tok, seed=0), prompts,
                                                                new_tokens)}
    for fp32_head, key in ((True, "vllm_fp32_head"), (False, "vllm_bf16_head")):
        engine = VLLMEngine(folder, tok, seed=0, dtype="bfloat16", kv_cache_memory_bytes=256 << 20,
                            enforce_eager=not torch.cuda.is_available(), fp32_head=fp32_head)
        row[key] = mismatch(model, engine, prompts, new_tokens)
        del engine
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/results.json")
    ap.add_argument("--real-folder", default=os.environ.get("SCALERL_REAL_MODEL_FOLDER"),
                    help="the real model's converted HF folder")
    ap.add_argument("--new-tokens", type=int, default=64)
    args = ap.parse_args()

    quiet_third_party_bars()
    torch.set_num_threads(1)  # vLLM in-process pins torch's threads
    sums = [f"What is {a} + {b}?" for a, b in ((3, 4), (8, 9), (5, 5), (2, 7), (6, 1), (9, 9), (0, 4), (7, 3))]
    jobs: list[tuple[str, ModelConfig, Path | None, list[str]]] = [
        ("tiny", ModelConfig(tiny=TINY, dtype="bfloat16"), None, ["12+34=", "7*8=", "99-5=", "3+3+3="])]
    if args.real_folder:
        jobs.append(("real", ModelConfig(path=args.real_folder, dtype="bfloat16"), Path(args.real_folder), sums))
    section: dict[str, Any] = {"units": {"mean/p99/max": "|log ρ| in nats over the sampled tokens, T = 0.7, "
                                                          "bf16 body, learner with the FP32 head"}}
    with tempfile.TemporaryDirectory(prefix="scalerl-bf16-head-") as work:
        for key, cfg, folder, texts in jobs:
            print(f"bench: {key} model in bf16: torch engine, vLLM FP32 head, vLLM bf16 head...", file=sys.stderr)
            row = bench_model(cfg, folder, Path(work) / key, texts, args.new_tokens)
            section[key] = row
            print(f"{key} model, bf16, step-0 |log ρ| mean/p99/max (nats): " + "; ".join(
                f"{name} {r['mean']:.4f}/{r['p99']:.4f}/{r['max']:.4f}" for name, r in row.items()))
    print(f"wrote the bf16_head section of {merge_sections(args.out, {'bf16_head': section})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
