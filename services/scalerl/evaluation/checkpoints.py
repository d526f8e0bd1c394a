"""Which checkpoints `scalerl eval TARGET` evaluates, and the RL compute each one cost.

TARGET is a checkpoint folder (`runs/<job>/checkpoints/step_000600`, a Hugging Face model folder) or a
run folder (`runs/<job>`: its newest checkpoint, or with `--checkpoints all` every checkpoint plus the
model RL started from, the SFT warm start `runs/<job>/sft` or `model.init_checkpoint`, at RL compute
0). The spec is the run's `spec.yaml` unless `--spec` is given.

RL compute of a checkpoint at step s is the `compute` (device-hours) of the run's eval record at step
s in metrics.jsonl, else of its step record in train.jsonl; None when the run folder has neither.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from scalerl.report.runfiles import load_run

CHECKPOINT_GLOB = "step_*"
SCORER_META = "scorer.json"


class TargetError(ValueError):
    """TARGET or --spec does not name something `scalerl eval` can use (one-line message)."""


@dataclass(frozen=True, slots=True)
class CheckpointRef:
    step: int
    folder: Path
    rl_device_hours: float | None


def is_sequence_classifier(folder: Path) -> bool:
    """A Hugging Face *ForSequenceClassification model folder (a reward model `--scorer` can use)."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return any(str(a).endswith("ForSequenceClassification") for a in config.get("architectures") or [])


def is_scorer_folder(folder: Path) -> bool:
    """A folder `--scorer` accepts: a scalerl outcome scorer (scorer.json) or a sequence classifier."""
    return (folder / SCORER_META).is_file() or is_sequence_classifier(folder)


def _is_model(folder: Path) -> bool:
    return (folder / "config.json").is_file()


def _step_of(folder: Path) -> int | None:
    digits = folder.name.removeprefix("step_")
    return int(digits) if folder.name.startswith("step_") and digits.isdigit() else None


def rl_compute_by_step(run: Path) -> dict[int, float]:
    """{step: device-hours} from metrics.jsonl eval records, then train.jsonl step records."""
    folder = load_run(run)
    out: dict[int, float] = {}
    for rec in folder.train:
        if rec.get("kind") == "step" and isinstance(rec.get("compute"), int | float):
            out[int(rec["step"])] = float(rec["compute"])
    for rec in folder.metrics:
        if rec.get("kind", "eval") == "eval" and isinstance(rec.get("compute"), int | float):
            out[int(rec["step"])] = float(rec["compute"])
    return out


def run_checkpoints(run: Path) -> list[Path]:
    root = run / "checkpoints"
    found = [p for p in root.glob(CHECKPOINT_GLOB) if _is_model(p) and _step_of(p) is not None] if root.is_dir() else []
    return sorted(found, key=lambda p: _step_of(p) or 0)


def resolve_target(target: Path, *, which: str, spec: Path | None) -> tuple[Path, Path | None, list[CheckpointRef]]:
    """(spec file, run folder or None, checkpoints in step order). Raises TargetError."""
    if not target.exists():
        raise TargetError(f"CHECKPOINT_OR_RUN: {target} does not exist; give a checkpoint folder "
                          "(runs/<job>/checkpoints/step_NNNNNN) or a run folder (runs/<job>)")
    if _is_model(target):
        run = target.parent.parent if target.parent.name == "checkpoints" else None
        if which == "all":
            raise TargetError(f"--checkpoints: 'all' needs a run folder, but {target} is one checkpoint; "
                              "allowed: latest, or pass the run folder")
        folders = [target]
    elif (target / "checkpoints").is_dir() or (target / "spec.yaml").is_file():
        run = target
        folders = run_checkpoints(run)
        if not folders:
            raise TargetError(f"CHECKPOINT_OR_RUN: the run folder {target} has no checkpoints "
                              f"(checkpoints/{CHECKPOINT_GLOB} with a config.json)")
        if which == "latest":
            folders = folders[-1:]
    else:
        raise TargetError(f"CHECKPOINT_OR_RUN: {target} is neither a checkpoint folder (no config.json) nor a "
                          "run folder (no checkpoints/ or spec.yaml)")
    spec_file = spec if spec is not None else (run / "spec.yaml" if run is not None else None)
    if spec_file is None or not spec_file.is_file():
        where = f"{spec_file} does not exist" if spec_file is not None else f"{target} is not inside a run folder"
        raise TargetError(f"--spec: {where}; give --spec SPEC.yaml (the job spec the policy was trained with)")
    compute = rl_compute_by_step(run) if run is not None else {}
    steps = [_step_of(f) for f in folders]  # None: not a step_* folder (no RL compute of its own)
    refs = [CheckpointRef(step=s or 0, folder=f, rl_device_hours=None if s is None else compute.get(s))
            for f, s in zip(folders, steps, strict=True)]
    return spec_file, run, refs


def start_ref(run: Path, init_checkpoint: str | None) -> CheckpointRef | None:
    """The model RL started from (step 0, RL compute 0): `init_checkpoint`, else the run's SFT folder."""
    start = Path(init_checkpoint) if init_checkpoint else run / "sft"
    return CheckpointRef(step=0, folder=start, rl_device_hours=0.0) if _is_model(start) else None
