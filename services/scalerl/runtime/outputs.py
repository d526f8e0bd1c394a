"""Files of a run folder (architecture.md §4): metrics.jsonl, train.jsonl, summary.json, spec.yaml.

Units: `compute` is device-hours (devices × training wall hours, evaluation time excluded, a CPU
machine counting as one device, as the paper counts GPU-hours); `*_s` are seconds; tokens are counts.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


class RunOutputs:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.metrics_path = root / "metrics.jsonl"
        self.train_path = root / "train.jsonl"
        self.summary_path = root / "summary.json"
        self.checkpoints = root / "checkpoints"

    def append(self, path: Path, record: dict[str, Any]) -> None:
        with path.open("a") as f:
            f.write(json.dumps(_clean(record), separators=(",", ":")) + "\n")

    def eval_record(self, record: dict[str, Any]) -> None:
        self.append(self.metrics_path, {"kind": "eval", **record})

    def train_record(self, record: dict[str, Any]) -> None:
        self.append(self.train_path, record)

    def read(self, path: Path) -> list[dict[str, Any]]:
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def truncate_after(self, step: int) -> None:
        """On resume: drop records written after the checkpoint's step (they will be redone)."""
        for path in (self.metrics_path, self.train_path):
            kept = [r for r in self.read(path) if int(r.get("step", 0)) <= step]
            path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in kept))

    def write_summary(self, summary: dict[str, Any]) -> None:
        self.summary_path.write_text(json.dumps(_clean(summary), indent=2) + "\n")


def step_line(rec: dict[str, Any], *, total_steps: int, bound_k: int, rollouts_per_s: float) -> str:
    """The learner's one log line per step (its stdout, what `kubectl logs` follows), from its train.jsonl
    record. A number the step has not (no loss when every group was dropped) shows as "—", never 0.
    Example: "step 3/10: loss 0.0123, train pass rate 0.42, staleness mean 0.5 max 1 (bound k=4) policy
    versions, 12.5 rollouts/s, step 1.60 s, wait 0.40 s, 2 groups"."""

    def shown(key: str, fmt: str) -> str:
        value = rec.get(key)
        return "—" if value is None else format(value, fmt)

    return (f"step {rec.get('step')}/{total_steps}: loss {shown('loss', '.4f')}, "
            f"train pass rate {shown('train_pass_rate', '.2f')}, staleness mean {shown('staleness_mean', '.1f')} "
            f"max {shown('staleness_max', '.0f')} (bound k={bound_k}) policy versions, "
            f"{rollouts_per_s:.1f} rollouts/s, step {shown('step_time_s', '.2f')} s, "
            f"wait {shown('batch_wait_s', '.2f')} s, {shown('effective_batch', '.0f')} groups trained")
