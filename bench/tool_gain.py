"""What tools are worth: the same job trained with its tools and without, compared on its held-out prompts.

    .venv/bin/python bench/tool_gain.py --spec examples/tool-use.yaml --seeds 0,1 --work runs/tool-gain

For each seed, two `scalerl run`s of the spec, identical but for `environment.tools` (the spec's, and none):
each warm-starts with SFT on the task's demonstrations (with tools, episodes that call them; without, the
gold chains of thought) and trains with RL. The held-out pass rate (mean@k, the spec's `eval`) of the two
runs is compared prompt by prompt, after SFT and at the end: the gain of tools is the mean over prompts of
(with tools − without), with a paired bootstrap interval over prompts (resampling prompts with both of
their values; `scalerl.evaluation.paired_gain`), per seed and pooled over seeds. Compute per arm is the
paper's (device-hours on this machine; the tools' prompts are longer, so a step costs more).

Runs finished in `--work` (their summary.json written, their spec the one this bench would write) are read,
not trained again. Writes the section `--section` (default `tool_gain`) of `--out`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from forecast_bench import kept_run
from results_file import merge_sections

ARMS = ("tools", "plain")
"""The two arms: the spec as given, and the spec without tools (and `--plain-set`'s overrides)."""


def arm_overrides(plain_set: Sequence[str]) -> dict[str, list[str]]:
    return {"tools": [], "plain": ["environment.tools=[]", *plain_set]}


def arm_folder(arm: str, seed: int, plain_set: Sequence[str]) -> str:
    """`tools-seed0`, `plain-seed0`, or with --plain-set `plain-sft.steps=2000-seed0`."""
    extra = "".join(f"-{o.replace('/', '_')}" for o in plain_set) if arm == "plain" else ""
    return f"{arm}{extra}-seed{seed}"


def train_arm(spec_path: str, overrides: Sequence[str], run_dir: Path) -> dict[str, Any]:
    """One `scalerl run` in `run_dir` (read when finished there before); returns its summary and eval records."""
    import json

    from scalerl.config import dump_spec, load_spec
    from scalerl.runtime.embedded import EmbeddedRun
    from scalerl.runtime.outputs import RunOutputs

    spec = load_spec(spec_path, list(overrides))
    if kept_run(run_dir, dump_spec(spec), "--work"):
        print(f"tool-gain: {run_dir} already run; reading it", file=sys.stderr, flush=True)
        summary = json.loads((run_dir / "summary.json").read_text())
    else:
        t0 = time.perf_counter()
        summary = EmbeddedRun(spec, run_dir, show_progress=sys.stderr.isatty()).run()
        print(f"tool-gain: {run_dir} {summary['steps']} steps in {time.perf_counter() - t0:.0f} s wall; pass rate "
              f"{summary['initial_pass_rate']:.3f} -> {summary['final_pass_rate']:.3f}", file=sys.stderr, flush=True)
    evals = [r for r in RunOutputs(run_dir).read(run_dir / "metrics.jsonl") if r.get("kind", "eval") == "eval"]
    return {"summary": summary, "first": evals[0], "last": evals[-1]}


def paired(with_tools: Sequence[float], without: Sequence[float], *, level: float = 0.95) -> dict[str, Any]:
    """Mean of (with − without) over prompts and its paired bootstrap interval at `level`."""
    from scalerl.evaluation import paired_gain

    gain, lo, hi = paired_gain(without, with_tools, n_resamples=2000, seed=0, level=level)
    return {"gain": gain, "interval": [lo, hi], "level": level, "prompts": len(with_tools)}


def compare(arms: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The two arms of one seed, after SFT and at the end, prompt by prompt (their held-out sets must match)."""
    t, p = arms["tools"], arms["plain"]
    if t["last"].get("heldout_set") != p["last"].get("heldout_set"):
        raise SystemExit("the two arms were evaluated on different held-out prompts; nothing to pair")
    out: dict[str, Any] = {}
    for when in ("first", "last"):
        out[when] = {"tools": t[when]["pass_rate"], "plain": p[when]["pass_rate"], "step": t[when]["step"],
                     **paired(t[when]["prompt_pass_rates"], p[when]["prompt_pass_rates"])}
    for arm in ARMS:
        s = arms[arm]["summary"]
        out[arm] = {"rl_compute_device_hours": s["compute"], "rl_wall_s": s["train_wall_s"],
                    "sft_steps": s.get("sft_steps"), "sft_wall_s": s.get("sft_wall_s"),
                    "rl_gain": s.get("gain"), "rl_gain_interval": s.get("gain_interval")}
    return out


def format_table(result: dict[str, Any]) -> str:
    def row(name: str, c: dict[str, Any]) -> str:
        lo, hi = c["interval"]
        return (f"{name:>10} {c['step']:>5} {c['plain']:>9.3f} {c['tools']:>9.3f} {c['gain']:>+8.3f} "
                f"[{lo:+.3f}, {hi:+.3f}]")

    lines = [f"held-out mean@{result['k']} over {result['prompts']} prompts; gain = with tools − without, "
             f"{result['level']:.0%} paired bootstrap interval over prompts",
             f"{'seed':>10} {'step':>5} {'no tools':>9} {'tools':>9} {'gain':>8} interval"]
    for seed, c in result["seeds"].items():
        lines.append(row(f"{seed} SFT", c["first"]))
        lines.append(row(f"{seed} RL", c["last"]))
    for seed, c in result["seeds"].items():
        for arm in ARMS:
            a = c[arm]
            sft = f"{a['sft_wall_s']:.0f} s" if a["sft_wall_s"] is not None else "(not recorded)"
            lines.append(f"  seed {seed} {arm:>5}: SFT {a['sft_steps']} steps, {sft} wall; RL "
                         f"{a['rl_wall_s']:.0f} s wall, {a['rl_compute_device_hours']:.4f} device-hours")
    if "pooled" in result:
        lines.append(row("pooled RL", result["pooled"]))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", default="examples/tool-use.yaml", help="job spec with environment.tools")
    ap.add_argument("--seeds", default="0", help="comma-separated seeds, one pair of runs each")
    ap.add_argument("--work", default="runs/tool-gain", help="folder of the runs (<arm>-seed<S>)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="spec override for both arms, as for `scalerl run`")
    ap.add_argument("--plain-set", action="append", default=[], metavar="KEY=VALUE",
                    help="spec override for the arm without tools only, e.g. sft.steps=2000 to give it the "
                    "compute the tools' longer prompts take")
    ap.add_argument("--out", default="bench/results.json", help="results file")
    ap.add_argument("--section", default="tool_gain", help="the key of the results file the section goes under")
    args = ap.parse_args()
    problems = []
    if not Path(args.spec).is_file():
        problems.append(f"--spec: {args.spec} is not a file; give a job spec YAML")
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        problems.append(f"--seeds: {args.seeds!r} is not a comma-separated list of integers")
    work = Path(args.work)
    if not work.parent.is_dir() or (work.exists() and not work.is_dir()):
        problems.append(f"--work: {work} must be a folder (new, or of an earlier run of this bench) in an "
                        "existing folder")
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 2
    from scalerl.config import load_spec
    from scalerl.console import quiet_third_party_bars

    quiet_third_party_bars()
    if not load_spec(args.spec, args.overrides).environment.tools:
        print(f"--spec: {args.spec} has no environment.tools; nothing to compare", file=sys.stderr)
        return 2
    work.mkdir(exist_ok=True)
    t0 = time.perf_counter()
    result: dict[str, Any] = {"spec": args.spec, "overrides": args.overrides, "plain_overrides": args.plain_set,
                              "seeds": {}}
    pooled: dict[str, list[float]] = {"tools": [], "plain": []}
    for seed in seeds:
        arms = {arm: train_arm(args.spec, [*args.overrides, f"seed={seed}", *extra],
                               work / arm_folder(arm, seed, args.plain_set))
                for arm, extra in arm_overrides(args.plain_set).items()}
        result["seeds"][str(seed)] = compare(arms)
        for arm in ARMS:
            pooled[arm] += arms[arm]["last"]["prompt_pass_rates"]
        result.update(k=arms["tools"]["last"]["k"], prompts=arms["tools"]["last"]["n_prompts"], level=0.95)
    if len(seeds) > 1:  # prompts of every seed, paired within their seed
        last = [c["last"] for c in result["seeds"].values()]
        result["pooled"] = {"step": last[0]["step"], "tools": sum(c["tools"] for c in last) / len(last),
                            "plain": sum(c["plain"] for c in last) / len(last),
                            **paired(pooled["tools"], pooled["plain"])}
    result["wall_s"] = time.perf_counter() - t0
    print(format_table(result))
    merge_sections(args.out, {args.section: result})
    print(f"wrote {args.out} (key {args.section!r}); {result['wall_s']:.0f} s wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())
