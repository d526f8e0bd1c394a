"""Why a role's pods do not run: the scheduler's verdict on the job's Pending pods (pure).

The scheduler marks a pod it cannot place with the condition `PodScheduled=False`, reason
`Unschedulable`, and a message such as `0/3 nodes are available: 1 Insufficient nvidia.com/gpu,
2 node(s) had untolerated taint {nvidia.com/gpu: present}. preemption: ...`. `unschedulable` groups
those pods by role; `missing_resources` names the resources the message says were short (for a
`ScalingLimited`-style reason: pods that cannot be placed are not capacity).

The operator reports it on the Ready condition (reason `Unschedulable`, see reconcile.status_patch);
the autoscaler can reuse the same two functions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

ROLE_LABEL = "app.kubernetes.io/component"
_INSUFFICIENT = re.compile(r"Insufficient ([A-Za-z0-9](?:[A-Za-z0-9./_-]*[A-Za-z0-9])?)")


@dataclass(frozen=True, slots=True)
class Unschedulable:
    """The Pending pods of one role that the scheduler could not place."""

    pods: int
    message: str  # the scheduler's message for the first of them (by name)

    @property
    def missing(self) -> list[str]:
        return missing_resources(self.message)


def scheduling_block(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(reason, message) of a pod that waits unplaced: its PodScheduled condition is False with reason
    `Unschedulable` (no node fits) or `SchedulingGated` (a queue such as Kueue holds it); else None."""
    status = pod.get("status") or {}
    if status.get("phase") not in (None, "Pending") or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    for cond in status.get("conditions") or ():
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" \
                and cond.get("reason") in ("Unschedulable", "SchedulingGated"):
            return str(cond["reason"]), str(cond.get("message") or "")
    return None


def _verdict(pod: Mapping[str, Any]) -> str | None:
    block = scheduling_block(pod)
    if block is None or block[0] != "Unschedulable":
        return None
    return block[1] or "no node fits"


def unschedulable(pods: Iterable[Mapping[str, Any]]) -> dict[str, Unschedulable]:
    """Role (the pod's `app.kubernetes.io/component` label) -> its unschedulable Pending pods."""
    found: dict[str, list[tuple[str, str]]] = {}
    for pod in pods:
        message = _verdict(pod)
        if message is None:
            continue
        meta = pod.get("metadata") or {}
        role = (meta.get("labels") or {}).get(ROLE_LABEL, "")
        found.setdefault(role, []).append((str(meta.get("name", "")), message))
    return {role: Unschedulable(len(v), min(v)[1]) for role, v in sorted(found.items())}


def missing_resources(message: str) -> list[str]:
    """The resources a scheduler message calls insufficient, in order, once each
    (`1 Insufficient nvidia.com/gpu, 2 Insufficient cpu` -> ['nvidia.com/gpu', 'cpu'])."""
    return list(dict.fromkeys(_INSUFFICIENT.findall(message)))


def summary(found: Mapping[str, Unschedulable]) -> str:
    """One line for a condition message: `learner: 1 pod(s) unschedulable (missing nvidia.com/gpu): 0/3
    nodes are available: ...; generator: ...`."""
    parts = []
    for role, u in found.items():
        missing = f" (missing {', '.join(u.missing)})" if u.missing else ""
        parts.append(f"{role}: {u.pods} pod(s) unschedulable{missing}: {u.message.strip()}")
    return "; ".join(parts)
