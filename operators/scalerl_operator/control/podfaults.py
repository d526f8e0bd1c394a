"""Containers of a job's pods that the kernel killed for exceeding their memory limit (OOMKilled).

The kubelet restarts such a container in place (the pod stays, `restartCount` grows), so without this a job
whose verifier or generator runs out of memory looks merely slow. Each pass the operator reads the job's pods
(`reconcile.job_pods`); every container termination with reason `OOMKilled` (in `lastState`, or in `state`
for a container not restarted yet) that status.containerKills does not list yet is reported once: a
Warning Event `OOMKilled` on the RLJob, and an entry in status.containerKills (the newest `MAX_KILLS`).
A kill is identified by pod UID, container and the time it finished, so a container killed again is a new
kill and one seen in several passes is reported once. A learner container killed this way also restarts
the whole learner group (scalerl_operator.control.gang), whose reason names the kill.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

OOM_KILLED = "OOMKilled"
MAX_KILLS = 16


@dataclass(frozen=True, slots=True)
class Kill:
    """One container termination by the kernel's OOM killer, as the kubelet reported it."""

    pod: str
    uid: str
    role: str
    container: str
    finished_at: str  # RFC 3339, the kubelet's
    exit_code: int
    memory_limit: str | None  # the container's resources.limits.memory, as written ("512Mi"), or None
    restarts: int  # the container's restartCount when seen

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.uid, self.container, self.finished_at)

    def message(self) -> str:
        """Example: "verifier pod j-verifier-5d9c-x2: container verifier was killed for exceeding its memory
        limit 96Mi (OOMKilled, exit code 137, at 2026-11-28T05:40:01Z); restarted 1 time(s) so far"."""
        limit = f"its memory limit {self.memory_limit}" if self.memory_limit else "the node's memory (no limit set)"
        return (f"{self.role} pod {self.pod}: container {self.container} was killed for exceeding {limit} "
                f"({OOM_KILLED}, exit code {self.exit_code}, at {self.finished_at}); restarted {self.restarts} "
                "time(s) so far")

    def to_status(self) -> dict[str, Any]:
        return {"pod": self.pod, "uid": self.uid, "role": self.role, "container": self.container,
                "reason": OOM_KILLED, "exitCode": self.exit_code, "finishedAt": self.finished_at,
                "memoryLimit": self.memory_limit, "restarts": self.restarts}


def _limits(pod: dict[str, Any]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for ct in (pod.get("spec") or {}).get("containers") or []:
        out[ct.get("name", "")] = ((ct.get("resources") or {}).get("limits") or {}).get("memory")
    return out


def oom_kills(pods: list[dict[str, Any]]) -> list[Kill]:
    """Every OOM kill the pods' container statuses show (the last termination of each container, and the
    current state of one not restarted yet), oldest first.
    Example: a verifier pod whose container has lastState.terminated {reason: OOMKilled, exitCode: 137,
    finishedAt: T} and restartCount 1 → [Kill(pod, uid, "verifier", "verifier", T, 137, "96Mi", 1)]."""
    kills: dict[tuple[str, str, str], Kill] = {}
    for pod in pods:
        m = pod.get("metadata") or {}
        role = (m.get("labels") or {}).get("app.kubernetes.io/component", "")
        limits = _limits(pod)
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            for state in (cs.get("lastState") or {}, cs.get("state") or {}):
                t = state.get("terminated") or {}
                if t.get("reason") != OOM_KILLED:
                    continue
                kill = Kill(pod=m.get("name", ""), uid=m.get("uid", ""), role=role, container=cs.get("name", ""),
                            finished_at=str(t.get("finishedAt") or ""), exit_code=int(t.get("exitCode") or 0),
                            memory_limit=limits.get(cs.get("name", "")), restarts=int(cs.get("restartCount") or 0))
                kills.setdefault(kill.key, kill)
    return sorted(kills.values(), key=lambda k: (k.finished_at, k.pod, k.container))


def new_kills(pods: list[dict[str, Any]], recorded: list[dict[str, Any]]) -> list[Kill]:
    """The kills in `pods` that status.containerKills (`recorded`) does not list yet."""
    seen = {(r.get("uid"), r.get("container"), r.get("finishedAt")) for r in recorded}
    return [k for k in oom_kills(pods) if k.key not in seen]


def kills_status(recorded: list[dict[str, Any]], new: list[Kill]) -> list[dict[str, Any]]:
    """status.containerKills after `new`: the newest MAX_KILLS, oldest first."""
    return [*recorded, *(k.to_status() for k in new)][-MAX_KILLS:]


def oom_of(pod: dict[str, Any], container: str) -> str:
    """' (OOMKilled: over its memory limit 96Mi)' when `container`'s last termination was an OOM kill, else ''."""
    for k in oom_kills([pod]):
        if k.container == container:
            return f" ({OOM_KILLED}: over its memory limit {k.memory_limit or '(none set)'})"
    return ""
