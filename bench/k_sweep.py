"""PipelineRL-k sweep (part of `make bench`): the same spec and SFT start trained for the same number of
steps with k = 1, 2, 4, 8, and PPO-off-policy-8 beside PipelineRL-8.

Reported per run: the per-token age distribution (age = learner version at train time − the policy
version that sampled the token, in versions; summed over the run's trained tokens), groups dropped as
older than k, RL steps per hour of training wall time, and the pass-rate gain per device-hour
((final − initial held-out mean@k) / training device-hours). Device-hours are wall-clock on this
machine (shared with other work), so they vary with its load; when the evaluation records carry a
machine-independent `compute_flops`, the gain per 1e15 FLOPs is reported beside it.

Standalone: `python bench/k_sweep.py [--spec examples/quickstart.yaml] [--steps 100]` runs the SFT warm
start, the sweep and PPO-off-policy-8, and writes the keys `k_sweep` and `pipeline_vs_sync` into
bench/results.json, keeping its other keys.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from results_file import merge_sections
from scalerl.config import load_spec
from scalerl.console import quiet_third_party_bars
from scalerl.parts import make_task, seed_everything
from scalerl.runtime.embedded import EmbeddedRun
from scalerl.runtime.setup import initial_model

KS = (1, 2, 4, 8)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_one(spec_path: str, overrides: list[str], sft_dir: Path, steps: int, out: Path, *, mode: str,
            k: int) -> dict[str, Any]:
    """One embedded run from the SFT start; its speed, gain and token-age numbers."""
    spec = load_spec(spec_path, [*overrides, f"off_policy.mode={mode}", f"off_policy.k={k}", f"train.steps={steps}",
                                 f"eval.every_steps={steps}", f"model.init_checkpoint={sft_dir}"])
    s = EmbeddedRun(spec, out, show_progress=False).run()
    evals = _read_jsonl(out / "metrics.jsonl")
    gain = s["final_pass_rate"] - s["initial_pass_rate"]
    row = {"mode": mode, "k": k, "steps": s["steps"], "train_wall_s": s["train_wall_s"],
           "steps_per_hour": s["steps"] / (s["train_wall_s"] / 3600), "initial_pass_rate": s["initial_pass_rate"],
           "final_pass_rate": s["final_pass_rate"], "gain": gain, "gain_interval": s.get("gain_interval"),
           "gain_level": s.get("gain_level"), "compute_device_hours": s["compute"],
           "pass_rate_gain_per_device_hour": gain / s["compute"], "dropped_stale": s["dropped_stale"],
           "in_flight_swaps": s["in_flight_swaps"], "generator_workers": s.get("generator_workers", 1),
           "token_age": s["token_age"]}
    flops = evals[-1].get("compute_flops") if evals else None
    if flops:
        row["compute_flops"] = flops
        row["pass_rate_gain_per_pflop"] = gain / (flops / 1e15)
    return row


def _progress(row: dict[str, Any]) -> None:
    age = row["token_age"]
    print(f"bench:   {row['mode']}-{row['k']}: token age mean {age['mean'] or 0:.2f} max {age['max']} versions, "
          f"hist {age['hist']}; dropped {row['dropped_stale']} groups; {row['steps_per_hour']:.0f} steps/h; "
          f"gain {row['pass_rate_gain_per_device_hour']:.2f} pass-rate/device-hour "
          f"({row['initial_pass_rate']:.3f} -> {row['final_pass_rate']:.3f}{_interval(row)})",
          file=sys.stderr, flush=True)


def _interval(row: dict[str, Any]) -> str:
    """", gain +0.027 [-0.010, +0.061]": the gain and its paired-bootstrap interval over held-out prompts."""
    lo_hi = row.get("gain_interval")
    return f", gain {row['gain']:+.3f} [{lo_hi[0]:+.3f}, {lo_hi[1]:+.3f}]" if lo_hi else ""


def bench_k_sweep(spec_path: str, overrides: list[str], sft_dir: Path, steps: int, work: Path,
                  ks: tuple[int, ...] = KS) -> dict[str, Any]:
    """{"steps", "runs": {"k1": row, ...}} for PipelineRL-k at each k."""
    runs = {}
    for k in ks:
        print(f"bench: PipelineRL-{k}, {steps} steps...", file=sys.stderr, flush=True)
        runs[f"k{k}"] = run_one(spec_path, overrides, sft_dir, steps, work / f"pipeline-k{k}", mode="pipeline", k=k)
        _progress(runs[f"k{k}"])
    return {"steps": steps, "runs": runs}


def pipeline_vs_ppo(pipeline: dict[str, Any], ppo: dict[str, Any]) -> dict[str, Any]:
    """The two runs side by side with their ratios (pipeline over ppo)."""
    ppo_gain = ppo["pass_rate_gain_per_device_hour"]
    return {"pipeline": pipeline, "ppo": ppo,
            "steps_per_hour_ratio_pipeline_over_ppo": pipeline["steps_per_hour"] / ppo["steps_per_hour"],
            "gain_per_device_hour_ratio_pipeline_over_ppo": (
                pipeline["pass_rate_gain_per_device_hour"] / ppo_gain if ppo_gain > 0 else None)}


def summary_lines(sweep: dict[str, Any]) -> list[str]:
    out = []
    for row in sweep["runs"].values():
        age = row["token_age"]
        out.append(f"k={row['k']}: token age mean {age['mean'] or 0:.2f}, max {age['max']} versions, "
                   f"{100 * (age['share_age_ge_1'] or 0):.0f}% of tokens >= 1 version old; dropped "
                   f"{row['dropped_stale']}; gain/device-hour {row['pass_rate_gain_per_device_hour']:.2f}"
                   f"{_interval(row)}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench/results.json")
    ap.add_argument("--spec", default="examples/quickstart.yaml")
    ap.add_argument("--steps", type=int, default=100, help="RL steps per run")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--init", default=None, help="an SFT'd model folder to start from (default: run the spec's SFT)")
    args = ap.parse_args()
    quiet_third_party_bars()  # transformers' deprecation notices and load bars, as the CLI does
    spec = load_spec(args.spec, args.overrides)
    seed_everything(spec.seed)
    work = Path(tempfile.mkdtemp(prefix="scalerl-ksweep-"))
    try:
        sft = Path(args.init) if args.init else work / "sft"
        if not args.init:
            print("bench: SFT warm start (shared by every run)...", file=sys.stderr, flush=True)
            initial_model(spec, make_task(spec), work)
        elif not (sft / "config.json").is_file():
            print(f"--init: {sft} has no config.json (expected an SFT'd model folder)", file=sys.stderr)
            return 2
        sweep = bench_k_sweep(args.spec, args.overrides, sft, args.steps, work)
        print(f"bench: PPO-off-policy-8, {args.steps} steps...", file=sys.stderr, flush=True)
        ppo = run_one(args.spec, args.overrides, sft, args.steps, work / "ppo-k8", mode="ppo", k=8)
        _progress(ppo)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    path = merge_sections(args.out, {"k_sweep": sweep, "pipeline_vs_sync": pipeline_vs_ppo(sweep["runs"]["k8"], ppo)})
    print("\n".join(summary_lines(sweep)))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
