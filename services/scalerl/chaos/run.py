"""One chaos run: a distributed job (every role its own process over Kafka and the store) under a seeded fault
plan, with every crashed role restarted, checked at the end by the accounting identity
(`scalerl.chaos.accounting`). Used by the CI chaos test and `make bench`'s chaos section.

Besides the plan's faults the run is given records that must be dead-lettered: an undecodable record on
`rollouts` and on `scored`, a scored group with a non-finite reward, and a prompt of a known id (a new
epoch) too long for the model's positions — so the dead-letter paths, and the plan's `dlq_send` faults on
them, are exercised.

Recovery time of a fault: from the moment it fired to the next learner step recorded after it (so it includes
one ordinary step; compare with `step_s`, the median time between steps).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalerl.chaos.accounting import AccountingReport, check_accounting
from scalerl.faults.plan import FaultPlan
from scalerl.faults.points import fired_faults


@dataclass
class ChaosResult:
    seed: int
    finished: bool
    learner_exit: int | None
    wall_s: float
    report: AccountingReport | None
    planned: list[str]
    fired: list[dict[str, Any]]
    recovery_s: dict[str, list[float]] = field(default_factory=dict)
    step_s: float | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["report"] = self.report.to_dict() if self.report is not None else None
        return out


def _poison(bus: Any, spec: Any, job: str) -> None:
    """Records the run must dead-letter (see the module docstring)."""
    import copy
    import math

    from scalerl.messages import PromptTask, ScoredGroup
    from scalerl.parts import make_task
    from scalerl.rpc.convert import decode_envelope

    bus.publish_raw(f"{job}.rollouts", b"\x00chaos-poison-rollout", key=b"poison")
    bus.publish_raw(f"{job}.scored", b"\x00chaos-poison-scored", key=b"poison")
    problem = make_task(spec).problems("train")[0]
    long_prompt = "9+" * (4 * spec.model.tiny.max_positions if spec.model.tiny else 4096)
    bus.publish(f"{job}.prompts", PromptTask(problem.id, 901, long_prompt, problem.answer,
                                             spec.generation.group_size, spec.task.kind), key=problem.id)
    scored = [decode_envelope(r.value) for r in bus.read_raw(f"{job}.scored") if not r.value.startswith(b"\x00")]
    template = next((g for g in scored if isinstance(g, ScoredGroup)), None)
    if template is not None:
        bad = copy.deepcopy(template)
        # another group (epoch 902), issued by no one: no issue number (scalerl.bus.dedup: a number names one group)
        bad.rollout.task.epoch, bad.rollout.task.seq = 902, 0
        bad.rewards[0] = math.nan
        bus.publish(f"{job}.scored", bad, key="poison-nan")
    bus.flush()


def _step_times(out: Path, seen: dict[int, float]) -> None:
    """Record the wall time each learner step first appeared in `<out>/train.jsonl`."""
    path = out / "train.jsonl"
    if not path.is_file():
        return
    now = time.time()
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:  # a line being written
            continue
        if rec.get("kind") == "step":
            seen.setdefault(int(rec["step"]), now)


def recovery_times(fired: list[dict[str, Any]], step_times: dict[int, float]) -> dict[str, list[float]]:
    """Per fault kind: seconds from each firing to the next learner step after it (pure)."""
    times = sorted(step_times.values())
    out: dict[str, list[float]] = {}
    for f in fired:
        after = [t for t in times if t > float(f["time"])]
        if after:
            out.setdefault(str(f["kind"]), []).append(round(after[0] - float(f["time"]), 2))
    return out


def run_chaos(spec: Any, out: Path, plan: FaultPlan, *, bootstrap: str, store_url: str, env: dict[str, str],
              generators: int = 1, verifiers: int = 1, timeout_s: float = 900.0,
              max_restarts: int = 30) -> ChaosResult:
    """Run `spec` as local processes under `plan`; restart what crashes; check the accounting identity."""
    from scalerl.bus.kafka import KafkaBus
    from scalerl.runtime.launcher import LocalCluster
    from scalerl.store import open_store

    out.mkdir(parents=True, exist_ok=True)
    plan_path = out / "faults.json"
    plan_path.write_text(plan.to_json())
    cluster = LocalCluster(spec, out, f"kafka://{bootstrap}", store_url, generators=generators,
                           verifiers=verifiers, max_restarts=max_restarts, env=env, faults=plan_path)
    job = spec.runtime.bus_prefix or spec.name
    bus = KafkaBus(bootstrap)
    t0 = time.monotonic()
    steps: dict[int, float] = {}
    rc: int | None = None
    error = None
    try:
        cluster.start_all()
        poisoned = False
        while time.monotonic() - t0 < timeout_s:
            rc = cluster.check_roles()
            _step_times(out, steps)
            if not poisoned and steps:  # once a scored group exists to copy
                _poison(bus, spec, job)
                poisoned = True
            if rc is not None:
                break
            time.sleep(0.3)
        else:
            error = f"the learner did not finish within {timeout_s:.0f} s"
    finally:
        cluster.stop_all(timeout_s=30)
    wall = time.monotonic() - t0
    report = None
    if rc == 0:
        try:
            report = check_accounting(bus, open_store(store_url), job)  # (S3 settings: this process's env)
        except Exception as exc:  # reported in the result: a chaos bench keeps going over seeds
            error = f"accounting check failed: {exc!r}"
    bus.close()
    fired = fired_faults(plan_path)
    times = sorted(steps.values())
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return ChaosResult(plan.seed, rc == 0, rc, round(wall, 1), report, [f.kind for f in plan.faults], fired,
                       recovery_times(fired, steps), round(statistics.median(gaps), 2) if gaps else None, error)

