"""Device-hours as the paper counts GPU-hours: every device the job holds, integrated over training time.

**The pool.** What the job holds now is a `DevicePool`: per role, pods (processes) × devices per pod —
learner ranks, generators (which autoscale), verifiers and the curriculum where they hold accelerators.
Where it comes from:

- embedded (`scalerl run`): one process; `runtime.devices` (a CPU machine is 1, the quickstart's count);
- `scalerl run --distributed`: the launcher writes `<out>/pool.json` whenever a role process starts or
  exits, each process counted with `runtime.role_devices` (a learner × its torchrun ranks);
- the operator: renders `pool.json` into the job's ConfigMap (`J-spec`) from the replicas it applies
  and each role's accelerator limits (`nvidia.com/gpu`, ...; `runtime.role_devices` for a role that asks
  for none), re-rendered on every reconcile pass, so it follows the autoscaler; the learner pod mounts
  it at /etc/scalerl/pool.json (kubelet refreshes a mounted ConfigMap within about a minute).

The learner re-reads the file (`runtime.pool_file`) at every step: a file, not a bus topic, so a pool
change needs no consumer, survives learner and operator restarts, and is plain to test and inspect.
Without a pool file the count is fixed: max(runtime.devices, learner ranks).

**The integral.** `DeviceLedger` integrates the count over the training clock (evaluation excluded, as
before): the count observed at training second t holds until the next observation, so a pool change is
counted from the first step that sees it (the step granularity is the error bound).

This module is the pure part (the pool as data, the integral); reading and writing the pool file is in
`scalerl.runtime.devices`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

POOL_FILE = "pool.json"


@dataclass(frozen=True, slots=True)
class RolePool:
    """pods: processes/pods of the role running now; devices_per_pod: accelerators each holds."""

    pods: int
    devices_per_pod: int

    @property
    def devices(self) -> int:
        return self.pods * self.devices_per_pod


@dataclass(frozen=True, slots=True)
class DevicePool:
    """The devices a job holds now, per role."""

    roles: dict[str, RolePool]

    @property
    def devices(self) -> int:
        return sum(r.devices for r in self.roles.values())

    def to_dict(self) -> dict[str, Any]:
        """The pool.json object: {"devices": total, "roles": {role: {"pods", "devices_per_pod", "devices"}}}."""
        return {"devices": self.devices,
                "roles": {k: {"pods": r.pods, "devices_per_pod": r.devices_per_pod, "devices": r.devices}
                          for k, r in sorted(self.roles.items())}}

    @staticmethod
    def from_dict(obj: Any) -> DevicePool:
        """Parse a pool.json object; ValueError naming the bad field."""
        roles = obj.get("roles") if isinstance(obj, dict) else None
        if not isinstance(roles, dict):
            raise ValueError("pool: expected an object with a 'roles' mapping")
        out: dict[str, RolePool] = {}
        for name, r in roles.items():
            pods, per = (r.get("pods"), r.get("devices_per_pod")) if isinstance(r, dict) else (None, None)
            if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (pods, per)):
                raise ValueError(f"pool: roles.{name} needs integer pods and devices_per_pod >= 0")
            out[str(name)] = RolePool(int(pods), int(per))  # type: ignore[arg-type]
        return DevicePool(out)


class DeviceLedger:
    """Device-seconds integrated piecewise over training seconds (pure; the caller brings the clock)."""

    def __init__(self, devices: int, *, device_s: float = 0.0, at_s: float = 0.0) -> None:
        self.devices = devices
        self.device_s = device_s
        self.at_s = at_s

    def observe(self, train_s: float, devices: int) -> None:
        """At training second `train_s` the job holds `devices`: close the piece before, start a new one."""
        self.device_s += self.devices * max(0.0, train_s - self.at_s)
        self.at_s = max(self.at_s, train_s)
        self.devices = devices

    def device_hours(self, train_s: float) -> float:
        """Device-hours up to training second `train_s` (the current piece counted at the current count)."""
        return (self.device_s + self.devices * max(0.0, train_s - self.at_s)) / 3600.0

    def state(self, train_s: float) -> dict[str, float]:
        """For a checkpoint: the integral up to `train_s`."""
        return {"device_s": self.device_hours(train_s) * 3600.0, "at_s": train_s}
