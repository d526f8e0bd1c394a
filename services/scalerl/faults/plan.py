"""Fault plans: what goes wrong, where and when, drawn deterministically from a seed (pure, no I/O).

A `Fault` names a role (learner, generator, verifier, curriculum), a kind and an occurrence `at` (the
at-th time that process reaches the fault's site; counted per process lifetime). Kinds:

  crash points (the process SIGKILLs itself there; `scalerl.faults.points.crash_point`):
    learner.step              after an optimizer step, before its commit, announcement and checkpoint
                              (at < train.checkpoint_every: before the first periodic checkpoint)
    learner.checkpoint_upload after the first file of a checkpoint is uploaded, before LATEST moves
    learner.announce          after the weights are uploaded, before they are announced
    generator.batch           after a batch is generated, before its rollouts are published and committed
    verifier.batch            after a batch is scored, before it is flushed and committed
    curriculum.issue          after prompts are published, before the curriculum's state is saved
  bus faults (`scalerl.faults.bus.FaultyProducer` / `FaultyConsumer`):
    send        the at-th send of the process fails without reaching the broker (an outage past the
                producer's delivery timeout)
    flush       the at-th flush times out (its records stay in flight)
    dlq_send    the at-th send to a dead-letter topic fails without reaching the broker
    membership  the at-th poll of a group consumer first drops the group membership (a session lost
                across a broker restart): its partitions are revoked and assigned again
    policy_delay  from the at-th announcement read, announcements reach the process `seconds` late
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

CRASH_POINTS = {"learner.step": "learner", "learner.checkpoint_upload": "learner", "learner.announce": "learner",
                "generator.batch": "generator", "verifier.batch": "verifier", "curriculum.issue": "curriculum"}
BUS_FAULTS = ("send", "flush", "dlq_send", "membership", "policy_delay")
KINDS = (*CRASH_POINTS, *BUS_FAULTS)
ROLES = ("learner", "generator", "verifier", "curriculum")


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    role: str
    at: int
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"fault kind {self.kind!r}: allowed {', '.join(KINDS)}")
        if self.role not in ROLES:
            raise ValueError(f"fault role {self.role!r}: allowed {', '.join(ROLES)}")
        if self.kind in CRASH_POINTS and CRASH_POINTS[self.kind] != self.role:
            raise ValueError(f"fault {self.kind}: a crash point of the {CRASH_POINTS[self.kind]}, not the {self.role}")
        if self.at < 1:
            raise ValueError(f"fault {self.kind}: at = {self.at}, allowed >= 1 (the at-th occurrence)")


@dataclass(frozen=True, slots=True)
class FaultPlan:
    seed: int
    faults: tuple[Fault, ...] = field(default_factory=tuple)

    def to_json(self) -> str:
        return json.dumps({"seed": self.seed, "faults": [asdict(f) for f in self.faults]}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> FaultPlan:
        data = json.loads(text)
        return cls(int(data["seed"]), tuple(Fault(**f) for f in data["faults"]))

    @classmethod
    def load(cls, path: Path) -> FaultPlan:
        return cls.from_json(path.read_text())

    def kinds(self) -> list[str]:
        return sorted({f.kind for f in self.faults})


def chaos_plan(seed: int, *, n_faults: int = 12, steps: int = 10, checkpoint_every: int = 4) -> FaultPlan:
    """A seeded plan with every kind of fault at least once (n_faults >= len(KINDS) + 1: the learner is also
    killed before its first periodic checkpoint), spread over a run of `steps` learner steps.

    Occurrences are drawn small enough to happen within the run: learner crash points within the steps
    (learner.step once below `checkpoint_every`), the others within the first few batches and sends."""
    if n_faults < len(KINDS) + 1:
        raise ValueError(f"n_faults = {n_faults}: a chaos plan has every kind once and an early learner kill, "
                         f"so at least {len(KINDS) + 1}")
    rng = random.Random(seed)
    kinds = [*KINDS, "learner.step"] + [rng.choice(KINDS) for _ in range(n_faults - len(KINDS) - 1)]
    faults: list[Fault] = []
    early_kill = True
    for kind in kinds:
        if kind in CRASH_POINTS:
            role = CRASH_POINTS[kind]
            if kind == "learner.step" and early_kill:
                at, early_kill = rng.randint(1, max(1, checkpoint_every - 1)), False
            elif role == "learner":
                at = rng.randint(1, max(1, steps // 2))
            else:
                at = rng.randint(1, 4)
            faults.append(Fault(kind, role, at))
        elif kind == "policy_delay":
            faults.append(Fault(kind, rng.choice(("generator", "curriculum")), rng.randint(1, 3),
                                seconds=round(rng.uniform(1.0, 4.0), 1)))
        elif kind == "membership":
            faults.append(Fault(kind, rng.choice(("learner", "generator", "verifier")), rng.randint(2, 30)))
        elif kind == "dlq_send":
            faults.append(Fault(kind, rng.choice(("learner", "verifier")), 1))
        else:
            faults.append(Fault(kind, rng.choice(ROLES), rng.randint(1, 8)))
    return FaultPlan(seed, tuple(faults))
