"""Reading a run folder and metric files (JSONL, JSON, CSV). The only file reading of the scaling feature.

A run folder `runs/<name>/` holds `metrics.jsonl` (eval records), `train.jsonl` (step and fit records)
and `summary.json`. Metric files from other frameworks may be CSV with a header row; numeric cells are
read as numbers and empty cells are left out of the record.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalerl.config import FitConfig

METRICS = "metrics.jsonl"
TRAIN = "train.jsonl"
SUMMARY = "summary.json"


class RunFileError(ValueError):
    """A run folder or metric file is missing or unreadable; the message says which and why."""


@dataclass(frozen=True, slots=True)
class RunFolder:
    """The contents of a run folder; any part may be empty when its file is absent."""

    path: Path
    name: str
    metrics: list[dict[str, Any]] = field(default_factory=list)
    train: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] | None = None


def metrics_file(run: Path) -> Path:
    """`run` itself when it is a file, else `run/metrics.jsonl`; RunFileError when neither exists."""
    if run.is_dir():
        path = run / METRICS
        if not path.is_file():
            raise RunFileError(f"{run} is a folder without {METRICS}. Point at a run folder or a metrics file.")
        return path
    if not run.is_file():
        raise RunFileError(f"{run} does not exist. Give a run folder (with {METRICS}) or a JSONL/CSV file.")
    return run


def read_records(path: Path) -> list[dict[str, Any]]:
    """Records of a .csv (header row), .json (a list of objects) or JSONL file (one object per line)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise RunFileError(f"cannot read {path}: {e.strerror or e}.") from None
    except UnicodeDecodeError:
        raise RunFileError(f"{path} is not UTF-8 text; metrics must be JSONL or CSV.") from None
    if path.suffix.lower() == ".csv":
        return _read_csv(text, path)
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise RunFileError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}).") from None
        if isinstance(data, list) and all(isinstance(r, dict) for r in data):
            return data
        raise RunFileError(f"{path}: a .json metrics file must hold a list of objects; use JSONL otherwise.")
    return _read_jsonl(text, path)


def _read_jsonl(text: str, path: Path) -> list[dict[str, Any]]:
    lines = text.split("\n")
    out: list[dict[str, Any]] = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines) and not text.endswith("\n"):
                break  # a half-written last line of a run in progress
            raise RunFileError(
                f"{path}:{i}: not valid JSON ({e.msg}). Each line of a JSONL file must be one JSON object."
            ) from None
        if not isinstance(rec, dict):
            raise RunFileError(f"{path}:{i}: a JSON {type(rec).__name__}, not an object.")
        out.append(rec)
    return out


def _cell(v: str) -> Any:
    v = v.strip()
    try:
        return int(v)
    except ValueError:
        pass
    try:
        return float(v)
    except ValueError:
        return v


def _read_csv(text: str, path: Path) -> list[dict[str, Any]]:
    reader = csv.DictReader(text.splitlines())
    if not reader.fieldnames:
        raise RunFileError(f"{path}: empty CSV; the first row must name the columns (e.g. compute,pass_rate).")
    return [{k.strip(): _cell(v) for k, v in row.items() if k is not None and v not in (None, "")} for row in reader]


def _read_summary(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def run_name(run: Path, summary: dict[str, Any] | None = None) -> str:
    """The run's name: summary.json's "name", else the folder name, else the file stem."""
    if summary and isinstance(summary.get("name"), str) and summary["name"]:
        return str(summary["name"])
    if run.is_dir():
        return run.resolve().name
    return run.parent.resolve().name if run.name == METRICS else run.stem


def load_run(run_dir: Path) -> RunFolder:
    """Read a run folder; RunFileError when the folder does not exist. Missing files give empty parts."""
    if not run_dir.is_dir():
        raise RunFileError(f"{run_dir} is not a run folder (expected a folder holding {METRICS}).")
    summary = _read_summary(run_dir / SUMMARY)
    metrics = read_records(run_dir / METRICS) if (run_dir / METRICS).is_file() else []
    train = read_records(run_dir / TRAIN) if (run_dir / TRAIN).is_file() else []
    return RunFolder(path=run_dir, name=run_name(run_dir, summary), metrics=metrics, train=train, summary=summary)


def json_safe(obj: Any) -> Any:
    """`obj` with non-finite floats replaced by None, so json.dumps writes strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


SPEC = "spec.yaml"


def fit_settings(run: Path) -> FitConfig:
    """The `fit` settings of the run that `run` (a run folder or a file in one) belongs to: the `fit`
    section of its spec.yaml, else the JobSpec default (a metrics file from elsewhere). RunFileError when
    that section is not valid."""
    import yaml
    from pydantic import ValidationError

    folder = run if run.is_dir() else run.parent
    path = folder / SPEC
    if not path.is_file():
        return FitConfig()
    try:
        tree = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        return FitConfig.model_validate((tree.get("fit") if isinstance(tree, dict) else None) or {})
    except (OSError, yaml.YAMLError, ValidationError) as e:
        raise RunFileError(f"{path}: cannot read its fit settings ({str(e).splitlines()[0]}).") from None
