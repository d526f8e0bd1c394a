"""`make bench`: speed ratios measured side by side in one run, written to bench/results.json.

1. generator: our torch engine vs plain `model.generate` — same model, same prompts, same batch,
   same number of new tokens (no early stop on either side), sampling at temperature 1.
   Reported: tokens/s of each (generated tokens / wall seconds, median of repeats) and the ratio.
2. learner: training tokens/s of `Learner.step` (completion tokens in the batch / step seconds).
3. PipelineRL-k for k = 1, 2, 4, 8 and PPO-off-policy-8 (bench/k_sweep.py): the same quickstart spec
   and SFT start, trained for the same number of steps. Reported: the per-token age distribution, RL
   steps per hour of training wall time, and pass-rate gain per device-hour ((final − initial mean@k) /
   training device-hours); PipelineRL-8 vs PPO-off-policy-8 side by side.
4. step probe (`step_probe.py`): from the SFT start, the pass rate after one update along the objective's
   gradient, along a random direction of the same length, and after AdamW's first update at several
   learning rates: how large one update may be before the pass rate falls.
5. forecast (`forecast_bench.py`): ≥ 3 seeds of `examples/forecast.yaml`; the saturating curve fitted on
   the first 25% / 50% of each run's compute predicts its final pass rate. Reported: prediction error,
   interval, coverage, fitted A vs the final measurement.

Every number is measured on this machine in this run; nothing is copied from elsewhere.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import forecast_bench
import k_sweep as ks
import step_probe
from scalerl.config import load_spec
from scalerl.console import quiet_third_party_bars
from scalerl.generator.engine import LengthControl, SamplingParams
from scalerl.generator.role import encode_prompt
from scalerl.generator.torch_engine import TorchEngine
from scalerl.learner.learner import Learner
from scalerl.messages import ScoredGroup
from scalerl.parts import make_task, make_verifier, seed_everything
from scalerl.runtime.setup import initial_model


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        _sync()
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_generator(model, tok, prompts: list[list[int]], new_tokens: int, repeats: int) -> dict:
    model.eval()
    engine = TorchEngine(model, tok, fp32_head=True, seed=0)
    never = 10**9  # no token id stops either side early
    length = LengthControl(thinking_budget=new_tokens, answer_budget=1, think_close_ids=(never,), eos_id=never)
    ours_s = _median_time(lambda: engine.generate(prompts, SamplingParams(), length), repeats)

    pad = tok.pad_token_id
    P = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (P - len(p)) + p for p in prompts])
    mask = (torch.arange(P)[None, :] >= torch.tensor([P - len(p) for p in prompts])[:, None]).long()
    ids, mask = ids.to(model.device), mask.to(model.device)

    def hf() -> None:
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0,
                           top_k=0, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=pad,
                           eos_token_id=None)

    hf_s = _median_time(hf, repeats)
    tokens = len(prompts) * new_tokens
    return {"batch_rows": len(prompts), "new_tokens": new_tokens, "ours_tokens_per_s": tokens / ours_s,
            "hf_generate_tokens_per_s": tokens / hf_s, "ratio_ours_over_hf": hf_s / ours_s}


def scored_groups(spec, task, model, tok, problems) -> list[ScoredGroup]:
    """One group per problem, sampled by the torch engine with the spec's length rules and scored."""
    from scalerl.generator.role import length_control
    from scalerl.messages import PromptTask, RolloutGroup

    G = spec.generation.group_size
    prompts = [encode_prompt(tok, p.prompt) for p in problems for _ in range(G)]
    comps = TorchEngine(model, tok, seed=1).generate(prompts, SamplingParams(), length_control(spec, tok))
    verifier = make_verifier(spec, task)
    return [verifier.score(RolloutGroup(PromptTask(p.id, 0, p.prompt, p.answer, G, spec.task.kind),
                                        prompts[i * G], comps[i * G:(i + 1) * G]))
            for i, p in enumerate(problems)]


def bench_learner(spec, model, tok, groups: list[ScoredGroup], repeats: int) -> dict:
    """Training tokens/s of one `Learner.step` over `groups` (median of `repeats` after a warm-up; the
    zero-variance filter off, so the whole batch is timed)."""
    import copy

    spec = spec.model_copy(deep=True)
    spec.loss.zero_variance_filter = False
    times, tokens = [], 0.0
    for _ in range(repeats + 1):
        learner = Learner(spec, copy.deepcopy(model), pad_id=tok.pad_token_id)
        _sync()
        t0 = time.perf_counter()
        stats = learner.step(groups)
        _sync()
        times.append(time.perf_counter() - t0)
        tokens = stats.get("tokens/train", 0.0)
    step_s = statistics.median(times[1:])
    return {"groups": len(groups), "train_tokens_per_step": tokens, "step_s": step_s,
            "train_tokens_per_s": tokens / step_s}


SKIPPABLE = ("k_sweep", "step_probe", "forecast")
"""The sections `--skip` may leave out: each trains for several minutes or more."""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench/results.json")
    ap.add_argument("--spec", default="examples/quickstart.yaml")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mode-steps", type=int, default=100, help="RL steps per run in the k sweep and the PPO run")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="spec override, as for `scalerl run` (e.g. model.dtype=bfloat16)")
    ap.add_argument("--dist-steps", type=int, default=30, help="RL steps in the distributed vs embedded run")
    ap.add_argument("--new-tokens", type=int, default=40, help="tokens generated per row in the generator bench")
    ap.add_argument("--prompts", type=int, default=0, help="prompts in the generator bench (0: prompts_per_step)")
    ap.add_argument("--skip", action="append", default=[], choices=SKIPPABLE, metavar="SECTION",
                    help=f"leave out a long section (repeatable; one of {', '.join(SKIPPABLE)}): k_sweep "
                         "includes the PPO-off-policy run; its result is null in the file")
    forecast_bench.add_arguments(ap)
    args = ap.parse_args()
    quiet_third_party_bars()  # transformers' deprecation notices and load bars, as the CLI does

    spec = load_spec(args.spec, args.overrides)
    seed_everything(spec.seed)
    torch.set_num_threads(spec.runtime.threads or torch.get_num_threads())
    work = Path(tempfile.mkdtemp(prefix="scalerl-bench-"))
    try:
        task = make_task(spec)
        print("bench: SFT warm start (shared by every measurement)...", file=sys.stderr)
        model, tok, _ = initial_model(spec, task, work)
        problems = task.problems("train")[: args.prompts or spec.train.prompts_per_step]
        G = spec.generation.group_size
        prompts = [encode_prompt(tok, p.prompt) for p in problems for _ in range(G)]
        new_tokens = args.new_tokens
        print(f"bench: generator vs model.generate ({len(prompts)} rows x {new_tokens} tokens)...", file=sys.stderr)
        gen = bench_generator(model, tok, prompts, new_tokens, args.repeats)

        groups = scored_groups(spec, task, model, tok, problems)
        print("bench: learner step...", file=sys.stderr)
        learn = bench_learner(spec, model, tok, groups, args.repeats)
        probe = sweep = modes = forecast = None
        if "step_probe" not in args.skip:
            print("bench: step probe (one update along the gradient, a random direction, AdamW's first step)...",
                  file=sys.stderr)
            probe = step_probe.probe(spec, model, tok, task, prompts=64, samples=32, seed=spec.seed)
        if "k_sweep" not in args.skip:
            sweep = ks.bench_k_sweep(args.spec, args.overrides, work / "sft", args.mode_steps, work)
            print(f"bench: PPO-off-policy-8, {args.mode_steps} steps...", file=sys.stderr)
            ppo = ks.run_one(args.spec, args.overrides, work / "sft", args.mode_steps, work / "ppo-k8",
                             mode="ppo", k=8)
            modes = ks.pipeline_vs_ppo(sweep["runs"]["k8"], ppo)
        dist = run_distributed_benches(args, spec, model, tok, [g.rollout for g in groups], work)
        if "forecast" not in args.skip:
            forecast = forecast_bench.run_section(args, args.overrides)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    results = {
        "machine": {"platform": platform.platform(), "cpu_threads": torch.get_num_threads(),
                    "torch": torch.__version__, "cuda": torch.cuda.is_available(),
                    "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                    "overrides": args.overrides},
        "units": {"tokens_per_s": "generated or trained tokens per wall second",
                  "steps_per_hour": "RL optimizer steps per hour of training wall time (eval excluded)",
                  "pass_rate_gain_per_device_hour": "(final - initial held-out mean@k) / device-hours",
                  "token_age": "learner version at train time - version that sampled the token (versions)"},
        "generator": gen, "learner": learn, "k_sweep": sweep, "pipeline_vs_sync": modes, "distributed": dist,
        "step_probe": probe, "forecast": forecast, "skipped": sorted(set(args.skip)),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"generator: ours {gen['ours_tokens_per_s']:.0f} tok/s vs model.generate "
          f"{gen['hf_generate_tokens_per_s']:.0f} tok/s -> ratio {gen['ratio_ours_over_hf']:.2f}x")
    print(f"learner:   {learn['train_tokens_per_s']:.0f} train tok/s ({learn['step_s']:.2f} s/step)")
    if sweep is not None and modes is not None:  # both, or neither (--skip k_sweep)
        p, q = modes["pipeline"], modes["ppo"]
        print(f"modes:     PipelineRL {p['steps_per_hour']:.0f} steps/h vs PPO-off-policy {q['steps_per_hour']:.0f} "
              f"steps/h -> ratio {modes['steps_per_hour_ratio_pipeline_over_ppo']:.2f}x; gain/device-hour "
              f"{p['pass_rate_gain_per_device_hour']:.2f} vs {q['pass_rate_gain_per_device_hour']:.2f}")
        print("\n".join(f"k sweep:   {line}" for line in ks.summary_lines(sweep)))
    if probe is not None:
        print(f"step probe: largest AdamW first-update lr that does not lower the pass rate "
              f"{probe['largest_safe_adam_lr']} (of {', '.join(format(x, 'g') for x in step_probe.ADAM_LRS)}); "
              f"table in {args.out}['step_probe']")
    if args.skip:
        print(f"skipped:   {', '.join(sorted(set(args.skip)))} (null in {args.out})")
    if dist:
        b, w, d = dist["bus"], dist["weight_swap"], dist["distributed_vs_embedded"]
        print(f"kafka:     {b['produce_msgs_per_s']:.0f} groups/s ({b['produce_mb_per_s']:.1f} MB/s) produced, "
              f"{b['consume_msgs_per_s']:.0f} groups/s ({b['consume_mb_per_s']:.1f} MB/s) consumed; "
              f"{b['group_kb']:.0f} kB per rollout group")
        print(f"weights:   publish -> generator swap through MinIO {w['publish_to_swap_s_median'] * 1000:.0f} ms "
              f"median ({w['weights_mb']:.1f} MB)")
        print(f"modes:     distributed {d['distributed']['steps_per_hour']:.0f} steps/h vs embedded "
              f"{d['embedded']['steps_per_hour']:.0f} steps/h -> ratio "
              f"{d['steps_per_hour_ratio_distributed_over_embedded']:.2f}x")
    else:
        print("distributed: skipped (no KAFKA_BOOTSTRAP / S3_* in the environment; `make bench` starts them)")
    print(f"wrote {args.out}")
    return 0


def run_distributed_benches(args, spec, model, tok, rollouts, work: Path) -> dict | None:
    """Kafka throughput, weight swap latency and distributed vs embedded steps/hour (real servers)."""
    import distributed_bench as db

    if not db.available():
        return None
    print("bench: rollout groups through Kafka...", file=sys.stderr)
    many = [r for _ in range(12) for r in rollouts]  # ~200 groups
    bus = db.bench_bus(many, args.repeats)
    print("bench: weight publish -> generator swap through MinIO...", file=sys.stderr)
    swap = db.bench_weight_swap(spec, model, tok, repeats=5)
    print(f"bench: distributed vs embedded, {args.dist_steps} steps each...", file=sys.stderr)
    modes = db.bench_distributed_vs_embedded(args.spec, args.overrides, work / "sft", args.dist_steps, work)
    return {"bus": bus, "weight_swap": swap, "distributed_vs_embedded": modes}


if __name__ == "__main__":
    sys.exit(main())
