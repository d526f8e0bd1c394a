"""The pool file (`pool.json`) of `scalerl.scaling.devices`: written by the launcher and the operator, read
by the learner at every step."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from scalerl.scaling.devices import POOL_FILE, DeviceLedger, DevicePool, RolePool

__all__ = ["POOL_FILE", "DeviceLedger", "DevicePool", "RolePool", "read_pool_file", "write_pool_file"]

log = logging.getLogger(__name__)


def write_pool_file(path: Path, pool: DevicePool) -> None:
    """Write pool.json atomically (a reader never sees half a file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(pool.to_dict(), sort_keys=True))
    tmp.replace(path)


def read_pool_file(path: str | Path) -> DevicePool | None:
    """The pool in `path`, or None (logged) when it is missing or not a valid pool (the caller keeps the
    count it had)."""
    try:
        return DevicePool.from_dict(json.loads(Path(path).read_text()))
    except (OSError, ValueError) as exc:
        log.warning("device pool %s unreadable, keeping the last count: %s", path, exc)
        return None
