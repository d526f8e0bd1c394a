"""`make bench`'s chaos section (`make bench-chaos` alone): distributed runs over the real Kafka and MinIO, each
under its own seeded fault plan (`scalerl.faults.plan.chaos_plan`), every crashed role restarted, each checked
by the accounting identity from the bus and the store (`scalerl.chaos.accounting`).

Reported under `chaos` in bench/results.json: runs finished (the learner reached its last step), groups lost,
groups double-trained, repeated step numbers and groups dead-lettered twice, summed over the runs; per fault
kind, how often it fired and its recovery time (seconds from the fault to the next learner step; one
ordinary step included: `step_s` is the median time between steps, for comparison); and every run's result.

A section can be completed over several invocations (`--resume`: the runs already in --out with the same
plan settings are kept, only the missing seeds run): each run's accounting stands on its own, and its
recovery times were measured on the machine and under the load of that invocation.

The runs share one warm start (`tests/warm_start.py`'s mixed-reward SFT, made once into --work).
Environment: KAFKA_BOOTSTRAP and S3_* (build/infra.env; `make bench` starts the servers).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the warm start the tests use


def _spec(name: str, init: str | None, steps: int, checkpoint_every: int) -> Any:
    """The tests' addition job (`tests/warm_start.py`): PipelineRL-2 over two partitions, one eval at the end."""
    from warm_start import addition_spec

    return addition_spec(name, init, steps=steps, off_policy={"mode": "pipeline", "k": 2},
                         checkpoint_every=checkpoint_every, eval_every=steps, partitions=2)


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The section's totals from the runs' results (pure)."""
    reports = [r["report"] for r in results if r["report"] is not None]
    kinds: dict[str, list[float]] = {}
    fired: dict[str, int] = {}
    for r in results:
        for f in r["fired"]:
            fired[str(f["kind"])] = fired.get(str(f["kind"]), 0) + 1
        for kind, times in r["recovery_s"].items():
            kinds.setdefault(kind, []).extend(times)
    steps = [r["step_s"] for r in results if r["step_s"] is not None]
    return {
        "runs": len(results), "runs_finished": sum(r["finished"] for r in results),
        "runs_checked": len(reports), "runs_identity_held": sum(bool(rep["ok"]) for rep in reports),
        "groups_issued": sum(rep["issued"] for rep in reports),
        "groups_lost": sum(len(rep["lost"]) + len(rep["lost_upstream"]) for rep in reports),
        "groups_double_trained": sum(len(rep["double_trained"]) for rep in reports),
        "groups_dead_lettered_twice": sum(len(rep["dead_lettered_twice"]) for rep in reports),
        "repeated_steps": sum(len(rep["repeated_steps"]) for rep in reports),
        "issue_numbers_reused": sum(len(rep.get("numbers_reused", [])) for rep in reports),
        # the learner's record of decided groups at the end: numbers kept past its watermark (scalerl.bus.dedup)
        "decided_window_max": max((int(rep.get("decided_window", 0)) for rep in reports), default=0),
        "faults_fired": dict(sorted(fired.items())),
        "recovery_s": {k: {"n": len(v), "median": round(statistics.median(v), 1), "max": round(max(v), 1)}
                       for k, v in sorted(kinds.items())},
        "step_s_median": round(statistics.median(steps), 2) if steps else None,
        "recovery_unit": "seconds from the fault to the next learner step",
    }


def _earlier_runs(out: Path, plan_settings: dict[str, int]) -> list[dict[str, Any]]:
    """The runs of the chaos section already in `out`, when they were made with the same plan settings."""
    import json

    section = (json.loads(out.read_text()) if out.is_file() else {}).get("chaos") or {}
    if section.get("plan") != plan_settings:
        if section:
            print(f"chaos bench: the runs in {out} used {section.get('plan')}, not {plan_settings}: starting afresh")
        return []
    return list(section.get("results") or [])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/results.json")
    ap.add_argument("--seeds", type=int, default=50, help="runs, one seeded fault plan each (>= 50 for the section)")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--faults", type=int, default=12, help="faults per plan (>= 12: every kind once + an early "
                                                           "learner kill)")
    ap.add_argument("--steps", type=int, default=8, help="learner steps per run")
    ap.add_argument("--checkpoint-every", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per run before it counts as unfinished")
    ap.add_argument("--work", default="build/chaos-bench", help="runs and the shared warm start go here")
    ap.add_argument("--resume", action="store_true",
                    help="keep the runs of the chaos section already in --out (same plan settings) and run only "
                         "the seeds it lacks")
    args = ap.parse_args()
    missing = [k for k in ("KAFKA_BOOTSTRAP", "S3_ENDPOINT", "S3_ACCESS_KEY", "S3_SECRET_KEY") if not os.environ.get(k)]
    if missing:
        print(f"chaos bench: error: {', '.join(missing)} not set (source build/infra.env; `make bench-chaos` "
              "starts the servers)", file=sys.stderr)
        return 2
    from results_file import merge_sections
    from scalerl.chaos.run import run_chaos
    from scalerl.console import quiet_third_party_bars
    from scalerl.faults.plan import chaos_plan
    from warm_start import mixed_reward_warm_start

    quiet_third_party_bars()
    work = Path(args.work)
    start = work / "warm-start"
    init = str(start) if (start / "config.json").is_file() else mixed_reward_warm_start(
        _spec("chaos-sft", None, args.steps, args.checkpoint_every), start)
    env = {k: v for k, v in os.environ.items() if k.startswith("S3_")}
    plan_settings = {"faults": args.faults, "steps": args.steps, "checkpoint_every": args.checkpoint_every}
    results = _earlier_runs(Path(args.out), plan_settings) if args.resume else []
    done_seeds = {int(r["seed"]) for r in results}
    todo = [s for s in range(args.first_seed, args.first_seed + args.seeds) if s not in done_seeds]
    t0 = time.monotonic()
    for i, seed in enumerate(todo):
        job = f"chaos-{seed}-{uuid.uuid4().hex[:6]}"
        plan = chaos_plan(seed, n_faults=args.faults, steps=args.steps, checkpoint_every=args.checkpoint_every)
        result = run_chaos(_spec(job, init, args.steps, args.checkpoint_every), work / job, plan,
                           bootstrap=os.environ["KAFKA_BOOTSTRAP"], store_url=f"s3://{job}/job", env=env,
                           timeout_s=args.timeout)
        results.append(result.to_dict())
        done = i + 1
        eta = (time.monotonic() - t0) / done * (len(todo) - done)
        rep = result.report
        print(f"chaos seed {seed}: {'finished' if result.finished else 'NOT finished'} in {result.wall_s:.0f} s, "
              f"{len(result.fired)} faults fired; {rep.describe() if rep else result.error} "
              f"[{done}/{len(todo)}, ETA {eta / 60:.0f} min]", flush=True)
        merge_sections(args.out, {"chaos": {**summarise(results), "plan": plan_settings, "results": results}})
    total = summarise(results)
    print(f"chaos: {total['runs_finished']}/{total['runs']} runs finished, {total['groups_lost']} groups lost, "
          f"{total['groups_double_trained']} double-trained, {total['repeated_steps']} repeated steps "
          f"(written to {args.out})")
    ok = total["runs_finished"] == total["runs"] == total["runs_identity_held"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
