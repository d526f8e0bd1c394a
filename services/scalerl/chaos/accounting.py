"""The accounting identity of a distributed run, checked from the bus and the store, never the roles' logs.

Every group the curriculum issued (prompt id @ epoch on `prompts`) ends in exactly one of:
- **decided in a step**: in one step's `group_ids` (trained; or dropped by the batch as zero-variance or aged
  past k) or `dropped_group_ids` (dropped as stale or of a lost lineage before it took a place in a batch),
  in the learner's final checkpoint in the store (its `run/train.jsonl`);
- **dead-lettered**: on the dead-letter topic (a generator, verifier or the learner refused it), and not
  decided in a step; one source record (topic, partition, offset) per group;
- **in flight** at the end: neither, and its scored record, if any, lies at or past the learner's final
  positions (it would be read next; the run ended first).

Violations: a **lost** group (undecided and not dead-lettered although its scored record lies below the final
positions, or although a role committed past its prompt or rollout without producing its output), a group
**double-trained** (in two steps, or both in a step and dead-lettered), a **repeated step** number in
train.jsonl, a group **dead-lettered twice** (two source records), an **issue number reused** for another
group on any of the job's topics (the learner's record of decided groups is kept by number: `scalerl.bus.dedup`).
`AccountingReport.ok` is their absence. `decided_window` (not a violation): how many numbers past its watermark
the learner's final checkpoint keeps.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scalerl.messages import task_of
from scalerl.rpc.convert import decode_envelope


@dataclass
class AccountingReport:
    issued: int = 0
    decided_in_steps: int = 0
    dead_lettered: int = 0
    in_flight: int = 0
    steps: int = 0
    lost: list[str] = field(default_factory=list)
    double_trained: list[str] = field(default_factory=list)
    dead_lettered_twice: list[str] = field(default_factory=list)
    repeated_steps: list[int] = field(default_factory=list)
    lost_upstream: list[str] = field(default_factory=list)
    numbers_reused: list[int] = field(default_factory=list)
    duplicates_on_scored: int = 0
    decided_window: int = 0

    @property
    def ok(self) -> bool:
        return not (self.lost or self.double_trained or self.dead_lettered_twice or self.repeated_steps
                    or self.lost_upstream or self.numbers_reused)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}

    def describe(self) -> str:
        bad = {k: v for k, v in self.to_dict().items() if isinstance(v, list) and v}
        head = (f"{self.issued} issued: {self.decided_in_steps} decided in {self.steps} steps, "
                f"{self.dead_lettered} dead-lettered, {self.in_flight} in flight")
        return head if not bad else f"{head}; VIOLATED: {bad}"


def group_id_of(value: Any) -> str | None:
    """prompt id @ epoch of a prompt task, rollout group or scored group (None for anything else)."""
    task = task_of(value)
    return None if task is None else task.group_id


def _decoded(records: list[Any]) -> list[tuple[Any, Any]]:
    out = []
    for rec in records:
        try:
            out.append((rec, decode_envelope(rec.value)))
        except Exception:  # a poison record: not a group of the run
            continue
    return out


def final_state(store: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the learner's final checkpoint state, its train.jsonl step records) from the store."""
    import json

    from scalerl.learner.checkpoint import load_trainer_state
    from scalerl.store.checkpoints import download_latest_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = download_latest_checkpoint(store, Path(tmp))
        if ckpt is None:
            raise ValueError("the store holds no learner checkpoint")
        state = load_trainer_state(ckpt)
        train = ckpt / "run" / "train.jsonl"
        lines = train.read_text().splitlines() if train.is_file() else []
    steps = [r for r in (json.loads(x) for x in lines if x.strip()) if r.get("kind") == "step"]
    return state, steps


def check_accounting(bus: Any, store: Any, job: str) -> AccountingReport:
    """The identity of the module docstring for job `job` (topics `<job>.*`) on a Kafka bus and its store."""
    state, steps = final_state(store)
    report = AccountingReport(steps=len(steps))
    numbers = Counter(int(r["step"]) for r in steps)
    report.repeated_steps = sorted(n for n, c in numbers.items() if c > 1)
    in_steps = Counter(gid for r in steps for gid in [*r["group_ids"], *r.get("dropped_group_ids", [])])
    report.double_trained = sorted(g for g, c in in_steps.items() if c > 1)

    tasks = [t for _, v in _decoded(bus.read_raw(f"{job}.prompts")) if (t := task_of(v)) is not None]
    issued = {t.group_id for t in tasks}
    report.issued = len(issued)
    named: dict[int, set[str]] = {}  # issue number -> the group ids that carry it, on any topic of the job
    for kind in ("prompts", "rollouts", "scored", "dlq"):
        records = tasks if kind == "prompts" else [task_of(v) for _, v in _decoded(bus.read_raw(f"{job}.{kind}"))]
        for t in records:
            if t is not None and t.seq > 0:
                named.setdefault(t.seq, set()).add(t.group_id)
    report.numbers_reused = sorted(n for n, ids in named.items() if len(ids) > 1)
    report.decided_window = len(state.get("decided", {}).get("above", []))
    dead_sources: dict[str, set[tuple[str, str, str]]] = {}
    for rec, value in _decoded(bus.read_raw(f"{job}.dlq")):
        gid = group_id_of(value)
        if gid in issued:
            source = tuple(rec.headers.get(k, b"").decode() for k in ("source_topic", "source_partition",
                                                                        "source_offset"))
            dead_sources.setdefault(gid, set()).add(source)  # type: ignore[arg-type]
    report.dead_lettered_twice = sorted(g for g, s in dead_sources.items() if len(s) > 1)
    report.double_trained += sorted(g for g in dead_sources if g in in_steps)
    report.decided_in_steps = len(set(in_steps) & issued)
    report.dead_lettered = len(set(dead_sources) - set(in_steps))

    final = state["bus_positions"]
    scored = _decoded(bus.read_raw(f"{job}.scored"))
    below = Counter(gid for rec, v in scored if (gid := group_id_of(v))
                    and rec.offset < final.get(f"{rec.topic}:{rec.partition}", 0))
    report.duplicates_on_scored = sum(c - 1 for c in below.values())
    undecided = issued - set(in_steps) - set(dead_sources)
    report.lost = sorted(g for g in undecided if g in below)
    report.in_flight = len(undecided) - len(report.lost)
    report.lost_upstream = (_committed_without_output(bus, job, "prompts", "generators", "rollouts", dead_sources)
                            + _committed_without_output(bus, job, "rollouts", "verifiers", "scored", dead_sources))
    return report


def _committed_without_output(bus: Any, job: str, kind: str, role: str, out_kind: str,
                              dead: dict[str, set[tuple[str, str, str]]]) -> list[str]:
    """Groups of `<job>.<kind>` below the role group's committed offsets with no output on `<job>.<out_kind>`
    and no dead letter: a role that committed past work it never produced."""
    committed = bus.committed(f"{job}.{role}", f"{job}.{kind}")
    done = {gid for rec, v in _decoded(bus.read_raw(f"{job}.{kind}"))
            if (gid := group_id_of(v)) and rec.offset < committed.get(rec.partition, 0)}
    produced = {gid for _, v in _decoded(bus.read_raw(f"{job}.{out_kind}")) if (gid := group_id_of(v))}
    return sorted(f"{kind}:{g}" for g in done - produced - set(dead))
