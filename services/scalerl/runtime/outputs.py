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
