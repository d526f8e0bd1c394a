"""Checkpoints in the object store, so a learner restarted on another machine resumes where it was.

Layout under the store: `checkpoints/step_000050/<files>` (the local checkpoint folder, file by file)
and `checkpoints/LATEST` (the folder name). Publication is atomic in the same way as the policy weights:
every file is uploaded first, `LATEST` is written last, so a reader never sees half a checkpoint.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from scalerl.faults.points import crash_point
from scalerl.store.base import Store

PREFIX = "checkpoints"
LATEST = f"{PREFIX}/LATEST"


def upload_checkpoint(store: Store, folder: Path, *, keep: int = 2) -> str:
    """Upload `folder` (e.g. .../checkpoints/step_000050) and point LATEST at it; prune to `keep`."""
    name = folder.name
    for i, path in enumerate(sorted(p for p in folder.rglob("*") if p.is_file())):
        store.put_bytes(f"{PREFIX}/{name}/{path.relative_to(folder).as_posix()}", path.read_bytes())
        if i == 0:
            crash_point("learner.checkpoint_upload")
    store.put_bytes(LATEST, name.encode())
    steps = sorted({k.split("/")[1] for k in store.list(f"{PREFIX}/") if k.count("/") >= 2})
    for old in steps[:-keep] if keep > 0 else []:
        if old != name:
            for key in store.list(f"{PREFIX}/{old}/"):
                store.delete(key)
    return store.uri(f"{PREFIX}/{name}")


def latest_checkpoint_name(store: Store) -> str | None:
    return store.get_bytes(LATEST).decode() if store.exists(LATEST) else None


def download_latest_checkpoint(store: Store, dest_root: Path) -> Path | None:
    """Download the checkpoint LATEST names into `dest_root/<name>`; None when there is none."""
    name = latest_checkpoint_name(store)
    if name is None:
        return None
    dest = dest_root / name
    tmp = dest_root / f".download_{name}"
    shutil.rmtree(tmp, ignore_errors=True)
    for key in store.list(f"{PREFIX}/{name}/"):
        path = tmp / key.removeprefix(f"{PREFIX}/{name}/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(store.get_bytes(key))
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest
