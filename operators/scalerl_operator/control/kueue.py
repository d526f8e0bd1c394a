"""Kueue admission of an RLJob (spec.queueName): the operator is the RLJob's Kueue integration.

Kueue has no controller for our kind; it is registered as an external framework
(`integrations.externalFrameworks: [RLJob.v1alpha1.scalerl.dev]` in Kueue's configuration), and the
operator does what Kueue's own job integrations do:
- it creates and owns ONE Workload (kueue.x-k8s.io/v1beta2, `rljob-<job>`, owner reference to the
  RLJob, label `kueue.x-k8s.io/queue-name`, `spec.queueName`) whose podSets are what the job needs to
  run at all: `learner` × roles.learner.nodes, `generator` and `verifier` × their minimum
  (autoscaling.minReplicas when autoscaled, else replicas; a pool whose minimum is 0 has no podSet),
  `curriculum` × 1, each with its role's pod template (containers' resources, nodeSelector,
  tolerations, affinity, priorityClassName: what quota and placement depend on). Pods an autoscaled
  pool adds above its minimum are outside the admitted quota: they are ordinary pods, placed by the
  scheduler where capacity is left, and the autoscaler treats unschedulable ones as no capacity;
- every role stays at zero (as while suspended) until the Workload is admitted (QuotaReserved and
  Admitted True, status.admission set); then the roles run, with the nodeLabels and tolerations of the
  ResourceFlavors the admission assigned to each podSet merged into that role's pod template;
- on eviction (Evicted True: preemption, deactivation, ...) every role goes back to zero, and once no
  pod of the job is left the quota reservation is released (QuotaReserved False, admission cleared,
  Requeued), which puts the Workload back in its queue;
- spec.suspend: true sets the Workload's spec.active false (Kueue evicts it and frees the quota);
- a finished job (Succeeded or Failed) sets the Workload's Finished condition (the quota is freed);
- a spec change that changes the podSets (learner nodes, a minimum, resources) replaces the Workload:
  Kueue's podSets are immutable while admitted, and the new shape must be admitted afresh.
Priority: the RLJob's `kueue.x-k8s.io/priority-class` label names a WorkloadPriorityClass; else the
learner pod template's priorityClassName (spec.podTemplate / roles.learner.podTemplate) names a
PriorityClass; the Workload gets its priorityClassRef and value (Kueue's webhook, which would fill
them, is not relied upon).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import kopf

from scalerl_operator.api import conditions as c
from scalerl_operator.api.spec import RLJobSpec
from scalerl_operator.cluster.kube import MERGE, Kube, KubeError, path
from scalerl_operator.render.names import QUEUE_LABEL, labels

API = "kueue.x-k8s.io/v1beta2"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
HASH_ANNOTATION = "scalerl.dev/pod-sets-hash"
POD_SETS = ("learner", "generator", "verifier", "curriculum")
_TEMPLATE_FIELDS = ("nodeSelector", "tolerations", "affinity", "priorityClassName", "runtimeClassName", "overhead")
# Kueue's reasons, kept as they come; these are ours
REASON_ADMITTED = "Admitted"
REASON_QUEUED = "Queued"
REASON_NOT_INSTALLED = "KueueNotInstalled"
REASON_PRIORITY_NOT_FOUND = "PriorityClassNotFound"
REASON_FINISHED = "Finished"
REASON_FORBIDDEN = "KueueObjectsForbidden"
REQUEUED_REASONS = ("Preempted", "NodeFailures")  # Kueue requeues only these evictions at once


@dataclass(frozen=True)
class Queue:
    """Where the job stands in Kueue: `admitted`, Kueue's reason and message, the Workload (None when
    none exists), and per role the nodeSelector/tolerations of its admitted flavors."""

    admitted: bool
    reason: str
    message: str
    workload: dict[str, Any] | None = None
    placement: dict[str, dict[str, Any]] = field(default_factory=dict)


def holds(obj: dict[str, Any], spec: RLJobSpec) -> bool:
    """Whether Kueue holds the job as of its last status (queued and not admitted): the autoscaler
    leaves its pools alone (reconcile keeps them at 0 anyway)."""
    return bool(spec.queue_name) and not c.is_true((obj.get("status") or {}).get("conditions"), c.QUEUE_ADMITTED)


def workload_name(job: str) -> str:
    return f"rljob-{job}"


def minimum(spec: RLJobSpec, role: str) -> int:
    """The pods of `role` the job needs to run at all (the admitted count)."""
    if role == "learner":
        return spec.roles.learner.nodes
    if role == "curriculum":
        return 1
    r = getattr(spec.roles, role)
    return int(r.autoscaling.min_replicas if r.autoscaling.enabled else r.replicas)


def _quota_template(template: dict[str, Any]) -> dict[str, Any]:
    """The part of a pod template quota and placement depend on."""
    s = template["spec"]

    def ctr(x: dict[str, Any]) -> dict[str, Any]:
        out = {"name": x["name"], "resources": x.get("resources") or {}}
        return {**out, "restartPolicy": x["restartPolicy"]} if x.get("restartPolicy") else out

    out: dict[str, Any] = {"containers": [ctr(x) for x in s["containers"]]}
    if s.get("initContainers"):
        out["initContainers"] = [ctr(x) for x in s["initContainers"]]
    out.update({k: s[k] for k in _TEMPLATE_FIELDS if s.get(k)})
    return {"spec": out}


def pod_sets(spec: RLJobSpec, children: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Workload's podSets from the rendered workloads (pure)."""
    templates = {ch["metadata"]["labels"]["app.kubernetes.io/component"]: ch["spec"]["template"]
                 for ch in children if ch["kind"] in ("Deployment", "StatefulSet")}
    return [{"name": role, "count": minimum(spec, role), "template": _quota_template(templates[role])}
            for role in POD_SETS if minimum(spec, role) > 0]


def render_workload(name: str, namespace: str, spec: RLJobSpec, children: list[dict[str, Any]],
                    priority: tuple[dict[str, str], int] | None = None) -> dict[str, Any]:
    """The Workload of the job (pure); `priority`: (priorityClassRef, value)."""
    body: dict[str, Any] = {"queueName": spec.queue_name, "podSets": pod_sets(spec, children)}
    if priority is not None:
        body["priorityClassRef"], body["priority"] = priority
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    return {"apiVersion": API, "kind": "Workload",
            "metadata": {"name": workload_name(name), "namespace": namespace,
                         "labels": {**labels(name, "workload"), QUEUE_LABEL: spec.queue_name},
                         "annotations": {HASH_ANNOTATION: digest}},
            "spec": {**body, "active": not spec.suspend}}


def _cond(wl: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return c.get_condition((wl.get("status") or {}).get("conditions"), type_)


def _true(wl: dict[str, Any], type_: str) -> bool:
    cond = _cond(wl, type_)
    return cond is not None and cond.get("status") == "True"


def reserved(wl: dict[str, Any]) -> bool:
    return _true(wl, "QuotaReserved") and bool((wl.get("status") or {}).get("admission"))


def state(wl: dict[str, Any]) -> Queue:
    """Where a Workload stands (pure); placement is filled by `sync`."""
    queue = wl["spec"].get("queueName", "")
    if _true(wl, "Finished"):
        cond = _cond(wl, "Finished") or {}
        return Queue(False, REASON_FINISHED, cond.get("message", "finished"), wl)
    if _true(wl, "Evicted"):
        cond = _cond(wl, "Evicted") or {}
        return Queue(False, cond.get("reason", "Evicted"), f"evicted: {cond.get('message', '')}", wl)
    if _true(wl, "Admitted") and reserved(wl):
        cq = wl["status"]["admission"].get("clusterQueue", "?")
        return Queue(True, REASON_ADMITTED, f"admitted by ClusterQueue {cq} (queue {queue})", wl)
    pending = _cond(wl, "QuotaReserved")
    if pending is not None and pending.get("message"):
        return Queue(False, pending.get("reason") or REASON_QUEUED, f"queue {queue}: {pending['message']}", wl)
    return Queue(False, REASON_QUEUED, f"queue {queue}: waiting for Kueue to admit the Workload", wl)


def priority_of(kube: Kube, obj: dict[str, Any], spec: RLJobSpec) -> tuple[dict[str, str], int] | None:
    """The Workload's (priorityClassRef, value): the RLJob's WorkloadPriorityClass label, else the
    learner template's priorityClassName; None when neither. LookupError names a missing class."""
    wpc = ((obj["metadata"].get("labels") or {}).get(PRIORITY_LABEL))
    if wpc:
        found = kube.get(API, "WorkloadPriorityClass", "", wpc)
        if found is None:
            raise LookupError(f"metadata.labels[{PRIORITY_LABEL}]: no WorkloadPriorityClass {wpc!r}")
        return {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": wpc}, int(found["value"])
    pc = spec.pod_template_of("learner").get("priorityClassName")
    if pc:
        found = kube.get("scheduling.k8s.io/v1", "PriorityClass", "", pc)
        if found is None:
            raise LookupError(f"priorityClassName: no PriorityClass {pc!r}")
        return {"group": "scheduling.k8s.io", "kind": "PriorityClass", "name": pc}, int(found["value"])
    return None


def placement(kube: Kube, wl: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per podSet, the nodeLabels and tolerations of the ResourceFlavors its admission assigned."""
    out: dict[str, dict[str, Any]] = {}
    flavors: dict[str, dict[str, Any]] = {}
    for psa in ((wl.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []:
        sel: dict[str, str] = {}
        tols: list[dict[str, Any]] = []
        for name in sorted(set((psa.get("flavors") or {}).values())):
            if name not in flavors:
                flavors[name] = (kube.get(API, "ResourceFlavor", "", name) or {}).get("spec") or {}
            sel.update(flavors[name].get("nodeLabels") or {})
            tols += [t for t in flavors[name].get("tolerations") or [] if t not in tols]
        out[psa["name"]] = {"nodeSelector": sel, "tolerations": tols}
    return out


def place(children: list[dict[str, Any]], where: dict[str, dict[str, Any]]) -> None:
    """Merge each role's admitted placement into its pod template (in place, pure)."""
    for ch in children:
        role = ch["metadata"]["labels"].get("app.kubernetes.io/component")
        if ch["kind"] not in ("Deployment", "StatefulSet") or role not in where:
            continue
        s = ch["spec"]["template"]["spec"]
        if where[role]["nodeSelector"]:
            s["nodeSelector"] = {**(s.get("nodeSelector") or {}), **where[role]["nodeSelector"]}
        extra = [t for t in where[role]["tolerations"] if t not in (s.get("tolerations") or [])]
        if extra:
            s["tolerations"] = [*(s.get("tolerations") or []), *extra]


def _patch_status(kube: Kube, wl: dict[str, Any], status: dict[str, Any]) -> None:
    m = wl["metadata"]
    kube.request("PATCH", path(API, "Workload", m["namespace"], m["name"], "status"), content_type=MERGE,
                 body={"metadata": {"resourceVersion": m["resourceVersion"]}, "status": status})


def _set(conds: list[dict[str, Any]] | None, type_: str, status: bool, reason: str, message: str,
         wl: dict[str, Any], now: datetime) -> list[dict[str, Any]]:
    return c.set_condition(conds, type_, "True" if status else "False", reason, message[:32768],
                           wl["metadata"].get("generation"), now)  # type: ignore[arg-type]


def sync(kube: Kube, obj: dict[str, Any], spec: RLJobSpec, children: list[dict[str, Any]], *,
         finished: str | None, now: datetime) -> Queue:
    """Create or update the job's Workload and read where it stands. `finished`: the job's terminal
    phase (Succeeded/Failed), which finishes the Workload; None while it runs."""
    m = obj["metadata"]
    try:
        priority = priority_of(kube, obj, spec)
    except LookupError as exc:
        return Queue(False, REASON_PRIORITY_NOT_FOUND, str(exc))
    except KubeError as exc:
        if exc.status != 403:
            raise
        return Queue(False, REASON_FORBIDDEN, f"the operator may not read the priority class: {exc.message} "
                     "(the chart grants it with operator.scope=cluster)")
    desired = render_workload(m["name"], m["namespace"], spec, children, priority)
    kopf.adopt(desired, owner=obj)  # type: ignore[arg-type]
    cur = None
    try:
        cur = kube.get(API, "Workload", m["namespace"], workload_name(m["name"]))
        if cur is not None and (cur["metadata"].get("annotations") or {}).get(HASH_ANNOTATION) != \
                desired["metadata"]["annotations"][HASH_ANNOTATION] and not _true(cur, "Finished"):
            kube.request("DELETE", path(API, "Workload", m["namespace"], cur["metadata"]["name"]),
                         body={"preconditions": {"uid": cur["metadata"]["uid"]}, "propagationPolicy": "Background"})
            kube.event(obj, "Normal", "WorkloadReplaced", "the pod sets changed (nodes, minimum replicas or "
                       "resources): a new Workload is queued", "Queue")
            cur = None
        if cur is None or cur["spec"].get("active", True) != desired["spec"]["active"]:
            cur = kube.apply(desired)
    except KubeError as exc:
        if exc.status == 404 and cur is None:
            return Queue(False, REASON_NOT_INSTALLED, f"spec.queueName: the cluster serves no {API} Workload "
                         f"API (is Kueue installed?): {exc.message}")
        raise
    if finished is not None:
        if not _true(cur, "Finished"):
            conds = _set((cur.get("status") or {}).get("conditions"), "Finished", True,
                         "Succeeded" if finished == c.PHASE_SUCCEEDED else "Failed", f"the RLJob {finished}", cur, now)
            _patch_status(kube, cur, {"conditions": conds})
        return Queue(False, REASON_FINISHED, f"the RLJob {finished}: Workload finished", cur)
    q = state(cur)
    if not q.admitted:
        return q
    try:
        return Queue(True, q.reason, q.message, cur, placement(kube, cur))
    except KubeError as exc:  # no pod runs without its admitted placement
        if exc.status != 403:
            raise
        return Queue(False, REASON_FORBIDDEN, f"admitted, but the operator may not read its ResourceFlavors: "
                     f"{exc.message} (the chart grants it with operator.scope=cluster)", cur)


def gate(kube: Kube, obj: dict[str, Any], spec: RLJobSpec, shape: Callable[[], list[dict[str, Any]]], *,
         finished: str | None, now: datetime) -> tuple[Queue | None, RLJobSpec]:
    """(where the job stands in Kueue, the spec its roles run by: spec.suspend true until admitted).
    `shape()`: the rendered children whose pod templates the podSets take. Without spec.queueName:
    (None, spec), and a Workload left from an earlier queueName is deleted."""
    if not spec.queue_name:
        if c.get_condition((obj.get("status") or {}).get("conditions"), c.QUEUE_ADMITTED) is not None:
            forget(kube, obj["metadata"]["namespace"], obj["metadata"]["name"])
        return None, spec
    q = sync(kube, obj, spec, shape(), finished=finished, now=now)
    return q, spec if q.admitted else spec.model_copy(update={"suspend": True})


def release(kube: Kube, obj: dict[str, Any], q: Queue, pods_left: int, now: datetime) -> bool:
    """An evicted Workload whose job has no pod left gives its quota back (QuotaReserved False,
    admission cleared, Requeued), as Kueue's job integrations do; True when it did."""
    wl = q.workload
    if q.admitted or wl is None or pods_left or not _true(wl, "Evicted") or not _true(wl, "QuotaReserved"):
        return False
    ev = _cond(wl, "Evicted") or {}
    reason, message = ev.get("reason", "Evicted"), ev.get("message", "")
    conds = (wl.get("status") or {}).get("conditions")
    conds = _set(conds, "Requeued", reason in REQUEUED_REASONS, reason, message, wl, now)
    conds = _set(conds, "QuotaReserved", False, "Pending", message, wl, now)
    conds = _set(conds, "Admitted", False, "NoReservation", "The workload has no reservation", wl, now)
    try:
        _patch_status(kube, wl, {"admission": None, "conditions": conds})
    except KubeError as exc:
        if exc.status == 409:  # Kueue wrote it meanwhile: the next pass looks again
            return False
        raise
    kube.event(obj, "Normal", "QuotaReleased", f"no pod left: the Workload's quota is released ({q.message})",
               "Queue")
    return True


def forget(kube: Kube, namespace: str, job: str) -> None:
    """spec.queueName was cleared: delete the job's Workload, if any."""
    try:
        kube.request("DELETE", path(API, "Workload", namespace, workload_name(job)))
    except KubeError as exc:
        if exc.status != 404:
            raise
