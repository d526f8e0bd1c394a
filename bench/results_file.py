"""bench/results.json, shared by the bench scripts: each writes its own sections and keeps the others'."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def merge_sections(out: str | Path, sections: dict[str, Any]) -> Path:
    """Write `sections` (top-level key -> JSON-able value) into the results file `out`, keeping its other
    keys; returns its path."""
    path = Path(out)
    results = json.loads(path.read_text()) if path.is_file() else {}
    results.update(sections)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    return path
