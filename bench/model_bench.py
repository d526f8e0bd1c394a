"""`make bench` section "models": the tiny quickstart model and the real model (SmolLM2-135M-Instruct of
examples/smollm2-addition.yaml) side by side, run in the vLLM environment (`make install-vllm`) because
vLLM is one of the engines compared.

Per model, on the same prompts (the model's own example job: its task, phrasing and group size):
- generation tokens/s of the vLLM engine, our torch engine and transformers' `model.generate`: generated
  tokens / wall seconds, median of --repeats after a warm-up; all three sample at temperature 1 from the
  same rows for the same number of new tokens, none stops early (no stop token inside the vocabulary);
- learner training tokens/s: one `Learner.step` (CISPO, the example's recipe) over one group per prompt
  sampled by the torch engine with the job's length rules and scored (bench/run_bench.py's measurement);
- publish → swap (with KAFKA_BOOTSTRAP and S3_* set, as `make bench` does): the learner's upload of the
  weights to MinIO and announcement on Kafka until a generator role's vLLM engine has reloaded them
  (bench/distributed_bench.py's measurement, the vLLM engine in the role);
- weight transfer: seconds per update for the vLLM engine's `load_weights` from a state dict in host
  memory (the store path's last step, after the download) and for a broadcast from a learner process in
  the project's environment through vLLM's weight-transfer calls (`scalerl_broadcast` over gloo: the
  learner's send, the transfer and vLLM's layerwise reload), median of --repeats after a warm-up.
The section is merged into --out (what bench/run_bench.py wrote there is kept).

    PY=.venv/bin/python scripts/vllm_python.sh bench/model_bench.py --out bench/results.json \\
        [--real-folder FOLDER]   # default: $SCALERL_REAL_MODEL_FOLDER, which the script sets
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import distributed_bench as db
from results_file import merge_sections
from run_bench import _median_time, bench_learner, scored_groups
from scalerl.config import load_spec
from scalerl.console import quiet_third_party_bars
from scalerl.generator.engine import LengthControl, SamplingParams
from scalerl.generator.role import encode_prompt
from scalerl.generator.torch_engine import TorchEngine
from scalerl.generator.vllm_engine import BROADCAST_BACKEND, VLLMEngine
from scalerl.model.factory import load_model_and_tokenizer, save_model_and_tokenizer
from scalerl.model.weight_broadcast import start_learner_process, update_info
from scalerl.parts import make_task

KV_CACHE_BYTES = 1 << 30  # vLLM's KV cache on CPU (enough for every row of the bench at once)


def _hf_generate(model: Any, tok: Any, prompts: list[list[int]], new_tokens: int) -> None:
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                       max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=pad, eos_token_id=None)


def bench_engines(model: Any, tok: Any, folder: Path, prompts: list[list[int]], new_tokens: int,
                  repeats: int) -> tuple[dict[str, Any], VLLMEngine]:
    """tokens/s of vLLM, the torch engine and model.generate on the same rows; the vLLM engine is returned
    for the swap measurement."""
    never = 10**9  # outside every vocabulary: no row stops early
    length = LengthControl(thinking_budget=new_tokens - 1, answer_budget=1, think_close_ids=(never,), eos_id=never)
    vllm = VLLMEngine(folder, tok, seed=0, dtype="float32", kv_cache_memory_bytes=KV_CACHE_BYTES, enforce_eager=True,
                      weight_transfer=BROADCAST_BACKEND)
    torch_engine = TorchEngine(model, tok, fp32_head=True, seed=0)
    out: dict[str, Any] = {"rows": len(prompts), "new_tokens": new_tokens,
                           "parameters": sum(p.numel() for p in model.parameters())}
    for name, engine in (("vllm", vllm), ("torch_engine", torch_engine)):
        counts: list[int] = []

        def run(engine: Any = engine, counts: list[int] = counts) -> None:
            counts.append(sum(len(c.token_ids) for c in engine.generate(prompts, SamplingParams(), length)))

        seconds = _median_time(run, repeats)
        out[f"{name}_tokens_per_s"] = counts[-1] / seconds
    seconds = _median_time(lambda: _hf_generate(model, tok, prompts, new_tokens), repeats)
    out["hf_generate_tokens_per_s"] = len(prompts) * new_tokens / seconds
    out["ratio_vllm_over_torch_engine"] = out["vllm_tokens_per_s"] / out["torch_engine_tokens_per_s"]
    out["ratio_vllm_over_hf_generate"] = out["vllm_tokens_per_s"] / out["hf_generate_tokens_per_s"]
    return out, vllm


def bench_weight_transfer(engine: VLLMEngine, model: Any, repeats: int, work: Path) -> dict[str, Any]:
    """Seconds per weight update into `engine`: `load_weights` from host memory vs a broadcast from a
    learner process (`python -m scalerl.model.weight_broadcast` in the project's environment)."""
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    load_s = _median_time(lambda: engine.load_weights(state, engine.version + 1), repeats)
    path = work / "state.pt"
    torch.save(state, path)
    learner, port, _ = start_learner_process(os.environ.get("SCALERL_LEARNER_PYTHON", sys.executable), [path],
                                             rounds=repeats + 1)
    try:
        engine.connect_weight_transfer({"address": "127.0.0.1", "port": port, "world_size": 2, "rank": 1})
        info, times = update_info(state), []
        for _ in range(repeats + 1):  # the first is the warm-up
            t0 = time.perf_counter()
            engine.receive_weights(info, engine.version + 1)
            times.append(time.perf_counter() - t0)
        learner.wait(timeout=120)
    finally:
        learner.kill()
    broadcast_s = statistics.median(times[1:])
    return {"weights_mb": sum(t.numel() * t.element_size() for t in state.values()) / 1e6,
            "load_weights_s_median": load_s, "broadcast_s_median": broadcast_s,
            "ratio_broadcast_over_load_weights": broadcast_s / load_s}


def summary_line(key: str, row: dict[str, Any]) -> str:
    line = (f"{key} model ({row['parameters'] / 1e6:.1f}M params): vLLM {row['vllm_tokens_per_s']:.0f} tok/s, "
            f"torch engine {row['torch_engine_tokens_per_s']:.0f} tok/s, model.generate "
            f"{row['hf_generate_tokens_per_s']:.0f} tok/s -> vLLM/torch {row['ratio_vllm_over_torch_engine']:.2f}x, "
            f"vLLM/generate {row['ratio_vllm_over_hf_generate']:.2f}x; learner "
            f"{row['learner']['train_tokens_per_s']:.0f} train tok/s ({row['learner']['step_s']:.2f} s/step)")
    wt = row["weight_transfer"]
    line += (f"; weights ({wt['weights_mb']:.1f} MB) load_weights {wt['load_weights_s_median'] * 1000:.0f} ms, "
             f"broadcast {wt['broadcast_s_median'] * 1000:.0f} ms")
    if (swap := row.get("publish_to_swap")) is not None:
        line += (f"; publish -> vLLM swap {swap['publish_to_swap_s_median'] * 1000:.0f} ms median "
                 f"({swap['weights_mb']:.1f} MB)")
    return line


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench/results.json")
    ap.add_argument("--spec", default="examples/quickstart.yaml", help="the tiny model's job")
    ap.add_argument("--real-spec", default="examples/smollm2-addition.yaml", help="the real model's job")
    ap.add_argument("--real-folder", default=os.environ.get("SCALERL_REAL_MODEL_FOLDER"),
                    help="the real model's saved folder (its model.path resolved by the project's environment)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    quiet_third_party_bars()
    jobs = [("tiny", load_spec(args.spec, []), None)]
    if args.real_folder:
        jobs.append(("real", load_spec(args.real_spec, [f"model.path={args.real_folder}"]), Path(args.real_folder)))
    section: dict[str, Any] = {"units": {
        "tokens_per_s": "generated (or, for the learner, trained) tokens per wall second",
        "publish_to_swap_s": "seconds from the upload's start until the generator's engine holds the weights",
        "load_weights_s / broadcast_s": "seconds per weight update into the vLLM engine (see the docstring)"}}
    with tempfile.TemporaryDirectory(prefix="scalerl-model-bench-") as work:
        for key, spec, folder in jobs:
            torch.set_num_threads(spec.runtime.threads or torch.get_num_threads())
            model, tok = load_model_and_tokenizer(spec.model, spec.seed)
            model.eval()
            if folder is None:
                folder = Path(work) / key
                save_model_and_tokenizer(model, tok, folder)
            task = make_task(spec)
            problems = task.problems("train")[: args.prompts]
            G = spec.generation.group_size
            prompts = [encode_prompt(tok, p.prompt) for p in problems for _ in range(G)]
            print(f"bench: {key} model: vLLM vs torch engine vs model.generate ({len(prompts)} rows x "
                  f"{args.new_tokens} tokens)...", file=sys.stderr)
            row, engine = bench_engines(model, tok, folder, prompts, args.new_tokens, args.repeats)
            print(f"bench: {key} model: weight transfer, load_weights vs broadcast...", file=sys.stderr)
            row["weight_transfer"] = bench_weight_transfer(engine, model, args.repeats, Path(work))
            print(f"bench: {key} model: learner step over {len(problems)} groups of {G}...", file=sys.stderr)
            row["learner"] = bench_learner(spec, model, tok, scored_groups(spec, task, model, tok, problems),
                                           args.repeats)
            if db.available():
                print(f"bench: {key} model: publish -> vLLM swap through MinIO and Kafka...", file=sys.stderr)
                row["publish_to_swap"] = db.bench_weight_swap(spec, model, tok, args.repeats, engine=engine)
            section[key] = row
            print(summary_line(key, row))
            del engine
    print(f"wrote the models section of {merge_sections(args.out, {'models': section})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
