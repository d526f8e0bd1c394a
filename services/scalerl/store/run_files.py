"""A finished run's files in the object store, so they outlive the learner's pod.

On Kubernetes the learner's run folder is an emptyDir: deleted with the pod when the finished job is
scaled to zero. Checkpoints keep train.jsonl and metrics.jsonl (as of each checkpoint), but summary.json
and report.html are written only at the end. So the learner uploads the run's files, once it has
written them, under `run/` of the job's store (`<store>/run/summary.json`, ...) before it announces the
run done; the operator points `status.report` there, and `scalerl fetch-run` copies them back.

Layout: `run/<name>` for each name of `RUN_FILES` that exists in the run folder. A file missing from the
folder (a report that failed to render) is absent from the store too, never an empty object.
"""

from __future__ import annotations

from pathlib import Path

from scalerl.store.base import Store

PREFIX = "run"
RUN_FILES = ("summary.json", "report.html", "metrics.jsonl", "train.jsonl")


def upload_run_files(store: Store, root: Path) -> list[str]:
    """Upload the files of `RUN_FILES` present in `root` to `run/<name>`; returns the names uploaded
    (summary.json last: its presence means the others are there)."""
    names = [n for n in (*RUN_FILES[1:], RUN_FILES[0]) if (root / n).is_file()]
    for name in names:
        store.put_bytes(f"{PREFIX}/{name}", (root / name).read_bytes())
    return names


def job_store_url(uri: str) -> str:
    """The job's store URL from `uri`: status.report.uri (`<store>/run`) or the job's store itself."""
    base = uri.rstrip("/")
    return base.removesuffix(f"/{PREFIX}") if base.rsplit("/", 1)[-1] == PREFIX and "/" in base else base


def download_run_files(store: Store, out: Path) -> list[Path]:
    """Copy the run files of the job's `store` (`run/<name>`) into `out`; returns the paths written, sorted
    (empty: none there, e.g. the run has not finished)."""
    written = []
    for key in store.list(f"{PREFIX}/"):
        name = key.removeprefix(f"{PREFIX}/")
        if name not in RUN_FILES:  # only the run's own files, never a path from the store
            continue
        out.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(store.get_bytes(key))
        written.append(out / name)
    return sorted(written)
