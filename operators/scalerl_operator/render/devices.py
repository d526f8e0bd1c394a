"""The devices an RLJob holds, as the learner counts them into compute (pure: no API calls, no clock).

Per role: pods (the replicas the operator applies: generators and verifiers as the autoscaler sized
them, `nodes` learner pods, one curriculum) × devices per pod. Devices per pod are the accelerators the
pod's container asks for (`resources.limits`, else `requests`, of the keys in `ACCELERATORS`); a role
that asks for none counts the JobSpec's `runtime.role_devices` (a learner pod: per rank ×
`devicesPerNode`), which is how a CPU cluster counts. A pod that waits for a node counts: the job has
claimed its devices.

The result goes three ways, computed once per reconcile pass: `pool.json` in the job's ConfigMap
(mounted at /etc/scalerl/pool.json; the learner re-reads it every step and integrates the total over
training time, `scalerl.scaling.devices`), `status.devices`, and nothing else recomputes it.
"""

from __future__ import annotations

import json
from typing import Any

from scalerl.config import RoleDevices
from scalerl.scaling.devices import DevicePool, RolePool
from scalerl_operator.api.spec import PodPlacement, RLJobSpec

ACCELERATORS = ("nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915", "habana.ai/gaudi", "google.com/tpu",
                "aws.amazon.com/neuron")
"""Extended resources counted as devices."""
ROLES = ("generator", "verifier", "curriculum", "learner")


def _whole(q: int | str) -> int | None:
    text = str(q)
    return int(text) if text.isdigit() else None


def accelerator_problem(spec: RLJobSpec) -> str | None:
    """One line naming an accelerator quantity that is not a whole number of devices, or None."""
    for role in ROLES:
        res = getattr(spec.roles, role).resources
        for kind, m in (("limits", res.limits), ("requests", res.requests)):
            for key in ACCELERATORS:
                if key in m and _whole(m[key]) is None:
                    return (f"spec.roles.{role}.resources.{kind}.{key}: devices are counted whole, got "
                            f"{m[key]!r} (allowed: 0, 1, 2, ...)")
    return None


def accelerators(r: PodPlacement) -> int | None:
    """Accelerators one pod of the role asks for (limits, else requests), or None when it asks for none."""
    found = [_whole(m[k]) for m in (r.resources.limits, r.resources.requests) for k in ACCELERATORS if k in m]
    if not found:
        return None
    limits = [_whole(r.resources.limits[k]) for k in ACCELERATORS if k in r.resources.limits]
    return sum(v or 0 for v in (limits if limits else found))


def devices_per_pod(spec: RLJobSpec, role: str, fallback: RoleDevices) -> int:
    """Devices one pod of `role` holds (module docstring)."""
    asked = accelerators(getattr(spec.roles, role))
    if asked is not None:
        return asked
    if role == "learner":
        return fallback.learner_rank * spec.roles.learner.devices_per_node
    return int(getattr(fallback, role))


def device_pool(spec: RLJobSpec, replicas: dict[str, int]) -> DevicePool:
    """The job's devices with `replicas` pods per role (what the operator applies this pass)."""
    fallback = spec.job_spec("devices").runtime.role_devices
    return DevicePool({role: RolePool(replicas.get(role, 0), devices_per_pod(spec, role, fallback))
                       for role in ROLES})


def pool_json(pool: DevicePool) -> str:
    """The ConfigMap's pool.json (the object `DevicePool.from_dict` reads)."""
    return json.dumps(pool.to_dict(), sort_keys=True)


def devices_status(pool: DevicePool) -> dict[str, Any]:
    """status.devices: per role and in total, devices."""
    return {**{role: r.devices for role, r in pool.roles.items()}, "total": pool.devices}
