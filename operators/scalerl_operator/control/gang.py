"""The learner's torchrun group restarts, updates and stalls as one gang.

torchrun ranks on N pods form one NCCL communicator: when one rank's container restarts, the
others block in a collective until the NCCL timeout, and a restarted rank cannot rejoin a running
group. So the operator treats the learner StatefulSet's pods as one unit (JobSet's
`RestartJobSet` / LeaderWorkerSet's `RecreateGroupOnPodRestart`):

- **group restart**: when any live learner pod had a container restart or failed (`failure`), or a
  rank of the running group was lost (`lost`: deleted by hand, evicted, lost with its node, replaced by
  the StatefulSet under a new UID), every learner pod is deleted; the StatefulSet (podManagementPolicy
  Parallel) recreates all ranks at once. One group restart counts one in `status.restarts`, however many
  pods it spans (a node failure on N nodes costs 1, not N), against `failurePolicy.maxRestarts`;
- **the group's memory** (`status.learnerGroup`, name → UID of each live rank, `remember`): a rank is lost
  when its recorded pod is being deleted, gone, or has another UID. The record survives operator restarts;
  it is emptied *before* the operator deletes pods itself (group restart or update) and whenever the
  learner is scaled to zero (suspended, held by Kueue, finished), so those deletions and the pods that
  replace them are never counted; a rank seen for the first time (a new or scaled-up group) is not a loss;
- **group update**: the StatefulSet's updateStrategy is `OnDelete`, so a template change (a new
  spec.job, image, resources) rolls nothing by itself; the operator deletes every pod whose
  revision is not the template's (`outdated`) and the group comes back whole on the new template;
- **progress watchdog**: with `failurePolicy.progressDeadlineSeconds`, a running group whose
  learner step (from `<job>.metrics`) has not advanced for that long is restarted the same way
  (Event `LearnerStalled`, condition `LearnerStalled`), and that counts as a restart;
- **the end is not a failure**: once the job is terminal or the learner reported `done`, nothing above
  is counted or done (`settled`); the learner stays up after its last step (`--when-finished wait`) until
  the operator scales the finished job to zero;
- a PodDisruptionBudget (`render.learner_pdb`) with minAvailable = nodes: a voluntary eviction
  (a node drain) of one rank would cost the whole group, so drains wait until the job is suspended.

How a restarted group resumes: every rank starts `scalerl serve learner` afresh and rank 0 reads the
latest checkpoint from the store (`spec.store.uri`: model, optimizer, consumed group ids, safe
positions of `scored`), as a single learner restarted by hand does; steps since that checkpoint are
trained again from the same records, and policy versions continue past the highest ever announced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scalerl_operator.api.conditions import parse_rfc3339
from scalerl_operator.control.podfaults import oom_of

REVISION_LABEL = "controller-revision-hash"


def live(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pods not already being deleted (a group restart in progress is not seen twice)."""
    return [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]


def failure(pods: list[dict[str, Any]]) -> str | None:
    """Why the group must restart (the first live pod with a container restart or a Failed phase), or None.
    Example: pod j-learner-1 with restartCount 1 → "pod j-learner-1: container learner restarted 1 time(s)";
    " (OOMKilled: over its memory limit 2Gi)" follows when the kernel killed it for its memory."""
    for p in live(pods):
        name = p["metadata"]["name"]
        st = p.get("status") or {}
        if st.get("phase") == "Failed":
            return f"pod {name} failed: {st.get('reason') or st.get('message') or 'phase Failed'}"
        for cs in st.get("containerStatuses") or []:
            n = int(cs.get("restartCount") or 0)
            if n > 0:
                return f"pod {name}: container {cs.get('name')} restarted {n} time(s){oom_of(p, cs.get('name', ''))}"
    return None


def remember(pods: list[dict[str, Any]]) -> dict[str, str]:
    """The running group to record (status.learnerGroup): name → UID of every live learner pod."""
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in live(pods)}


def group_of(status: dict[str, Any]) -> dict[str, str]:
    """The recorded group (status.learnerGroup, a list of {name, uid}) as name → UID."""
    return {g["name"]: g["uid"] for g in status.get("learnerGroup") or []}


def group_status(group: dict[str, str]) -> list[dict[str, str]]:
    """status.learnerGroup of `group` (a list, which a merge patch replaces whole), by name."""
    return [{"name": n, "uid": u} for n, u in sorted(group.items())]


def _disruption(pod: dict[str, Any]) -> str:
    """' (DisruptionTarget: <reason>)' when Kubernetes said why it deletes the pod (eviction, taint, preemption)."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            return f" (DisruptionTarget: {cond.get('reason') or 'no reason'})"
    return ""


def lost(pods: list[dict[str, Any]], group: dict[str, str]) -> str | None:
    """Why a rank of the recorded running group (`group`, name → UID) is lost, or None: its pod is being
    deleted, is gone, or was replaced under the same name with a new UID. A surviving rank is stuck in a
    collective and a fresh one cannot join, so this restarts the group like a container restart.
    Example: group {j-learner-0: u1}, pod j-learner-0 now has UID u2 → "pod j-learner-0 was replaced (UID u1 → u2):
    deleted outside the operator (kubectl delete, eviction or a lost node)"."""
    now = {p["metadata"]["name"]: p for p in pods}
    for name, uid in sorted(group.items()):
        pod = now.get(name)
        if pod is None:
            return f"pod {name} is gone: deleted outside the operator (kubectl delete, eviction or a lost node)"
        m = pod["metadata"]
        if m.get("uid") != uid:
            return (f"pod {name} was replaced (UID {uid} → {m.get('uid')}): deleted outside the operator "
                    "(kubectl delete, eviction or a lost node)")
        if m.get("deletionTimestamp"):
            return f"pod {name} is being deleted outside the operator{_disruption(pod)}"
    return None


def settled(*, terminal: bool, learner_done: bool) -> bool:
    """No restart, recreation or stall is counted or acted on: the job is terminal (Succeeded, or Failed for
    good), or the learner reported the run done (it turns Succeeded in this pass; a learner that exits after
    its last step, and is restarted by its StatefulSet, did not crash)."""
    return terminal or learner_done


def outdated(pods: list[dict[str, Any]], sts: dict[str, Any] | None, spec_hash: str, hash_key: str) -> list[str]:
    """Live pods not on the StatefulSet's current template: their revision label differs from
    status.updateRevision (when the controller reported one), or their `hash_key` annotation from
    `spec_hash` (the rendered job)."""
    rev = ((sts or {}).get("status") or {}).get("updateRevision")
    out = []
    for p in live(pods):
        m = p.get("metadata") or {}
        pod_rev = (m.get("labels") or {}).get(REVISION_LABEL)
        pod_hash = (m.get("annotations") or {}).get(hash_key)
        if (rev and pod_rev and pod_rev != rev) or (pod_hash is not None and pod_hash != spec_hash):
            out.append(m["name"])
    return out


@dataclass(frozen=True, slots=True)
class Progress:
    """The watchdog's memory in status: the last learner step seen and when it last advanced."""

    step: int | None
    since_s: float | None


def watchdog(prev: Progress, step: int | None, *, group_up: bool, now_s: float,
             deadline_s: int | None) -> tuple[Progress, bool]:
    """(new memory, stalled). The clock runs only while the group is up; a new step resets it.
    Example (deadline 600 s): step 7 seen at t=0, still 7 at t=601 with the group up → stalled."""
    if deadline_s is None or not group_up:
        return Progress(step if step is not None else prev.step, None), False
    if prev.since_s is None or step != prev.step:
        return Progress(step, now_s), False
    return prev, now_s - prev.since_s > deadline_s


def progress_of(status: dict[str, Any]) -> Progress:
    g = status.get("learnerProgress") or {}
    since = g.get("since")
    return Progress(g.get("step"), parse_rfc3339(since) if since else None)
