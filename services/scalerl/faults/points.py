"""The process side of a fault plan: which faults this process may fire, and the crash points.

`activate(plan_path, role, role_id)` (by `scalerl serve --faults PLAN.json`) makes the plan active in this
process; nothing here does anything otherwise (`crash_point` is then one `None` check). A fault fires once
per run, in the first process of its role to reach its occurrence: firing claims the file
`<PLAN>.fired/<index>` (created exclusively, written and fsynced before the fault acts), so a restarted
process, or another replica of the role, never fires it again. The claims are what the chaos driver reads to
time recovery (`fired_faults`).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path

from scalerl.faults.plan import Fault, FaultPlan

log = logging.getLogger(__name__)


class Injector:
    def __init__(self, plan: FaultPlan, role: str, role_id: str, fired_dir: Path) -> None:
        self.plan = plan
        self.role = role
        self.role_id = role_id
        self.fired_dir = fired_dir
        self.fired_dir.mkdir(parents=True, exist_ok=True)
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def hit(self, kind: str) -> Fault | None:
        """Count one occurrence of `kind` in this process; the fault to fire now, if any (claimed)."""
        with self._lock:
            n = self._counts[kind] = self._counts.get(kind, 0) + 1
            for index, fault in enumerate(self.plan.faults):
                if fault.kind == kind and fault.role == self.role and fault.at == n and self._claim(index, fault):
                    return fault
        return None

    def _claim(self, index: int, fault: Fault) -> bool:
        path = self.fired_dir / f"{index:03d}.json"
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        record = {"index": index, "kind": fault.kind, "role": fault.role, "at": fault.at, "role_id": self.role_id,
                  "pid": os.getpid(), "time": time.time()}
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(record))
            f.flush()
            os.fsync(f.fileno())
        log.warning("fault injection: %s #%d in %s (%s)", fault.kind, fault.at, self.role_id, path.name)
        return True


ACTIVE: Injector | None = None


def fired_dir_of(plan_path: Path) -> Path:
    return plan_path.with_name(plan_path.name + ".fired")


def activate(plan_path: Path, role: str, role_id: str) -> Injector:
    """Make the plan at `plan_path` active in this process (see the module docstring)."""
    global ACTIVE
    ACTIVE = Injector(FaultPlan.load(plan_path), role, role_id, fired_dir_of(plan_path))
    return ACTIVE


def crash_point(name: str) -> None:
    """A place a process may die (`scalerl.faults.plan.CRASH_POINTS`): SIGKILL here when the plan says so."""
    if ACTIVE is None or ACTIVE.hit(name) is None:
        return
    for handler in logging.getLogger().handlers + logging.getLogger("scalerl").handlers:
        handler.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def fired_faults(plan_path: Path) -> list[dict[str, object]]:
    """The faults fired so far in a run of the plan at `plan_path`, in plan order."""
    folder = fired_dir_of(plan_path)
    if not folder.is_dir():
        return []
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
