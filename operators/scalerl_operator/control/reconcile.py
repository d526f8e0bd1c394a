"""Reconcile one RLJob: validate → render → apply (server-side, idempotent) → status (`jobstatus`).

Level-based: every call renders the whole desired state from the current object and applies it, so
it does not matter which event (create, update, resume after an operator restart, the periodic tick)
triggered it, nor whether a previous run died half-way. Server-side apply as one field manager makes
a second pass with nothing new a no-op: the API server keeps every child's resourceVersion.

Order: the certificates of the roles' endpoints (`rpc_tls`, or cert-manager's: `rpc_certmanager`) →
ConfigMap (the pods mount it) → Kafka topics (partitions sized for the pools) → workloads and
Services → the roles' NetworkPolicy (`render.netpol`; deleted when the operator is set not to render
them). Children get owner references (`kopf.adopt`): garbage collection removes them with the
RLJob; the finalizer only cleans what Kubernetes cannot (Kafka topics and consumer groups).

A spec the operator cannot realise (schema-valid, but not runnable: see `unrealisable`) or a child
the API server rejects sets phase Failed with a Failed condition and a Warning Event; a new
generation is evaluated afresh. Other Failed reasons (deadline) and Succeeded are terminal: every
role is scaled to zero, the objects stay for inspection.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kopf

from scalerl.config import SpecError
from scalerl_operator.api import conditions as c
from scalerl_operator.api.newer_fields import FieldsFromNewerCRD
from scalerl_operator.api.spec import RLJobSpec, parse_served_spec
from scalerl_operator.cluster.kube import Kube, KubeError, path
from scalerl_operator.cluster.rlstatus import LearnerStatus
from scalerl_operator.cluster.scheduling import unschedulable
from scalerl_operator.control import gang, kueue, podfaults, rpc_certmanager
from scalerl_operator.control.jobstatus import (
    SPEC_REPLICAS,
    failed_status,
    is_terminal,
    spec_replicas_status,
    status_patch,
    write_status,
)
from scalerl_operator.render.children import SPEC_HASH_ANNOTATION, desired_replicas, render
from scalerl_operator.render.devices import accelerator_problem, device_pool
from scalerl_operator.render.images import image_defaults, image_problem, pinned_image_defaults
from scalerl_operator.render.names import ROLES, bus_prefix, child_name, partitions, selector, topics
from scalerl_operator.render.netpol import network_defaults, network_policy, policy_name

log = logging.getLogger(__name__)

APPLY_ATTEMPTS = 5  # reads and applies of one workload per pass while others keep changing it
WORKLOADS = {"generator": "Deployment", "verifier": "Deployment", "curriculum": "Deployment",
             "learner": "StatefulSet"}


@dataclass
class Outcome:
    """What one reconcile did (for Events, logs and tests)."""

    phase: str
    scaled: dict[str, tuple[int, int]] = field(default_factory=dict)  # role -> (before, after)
    error: str | None = None


def unrealisable(spec: RLJobSpec) -> str | None:
    """Why a schema-valid spec cannot run on a cluster (one line naming the field), or None."""
    job = spec.job_spec("check")
    if job.off_policy.mode != "pipeline":
        return (f"spec.job.off_policy.mode: the distributed learner runs 'pipeline' (PipelineRL-k), "
                f"got {job.off_policy.mode!r}")
    if (problem := accelerator_problem(spec)) is not None:
        return problem
    gpus = spec.roles.learner.resources.limits.get("nvidia.com/gpu")
    if gpus is not None and str(gpus).isdigit() and spec.roles.learner.devices_per_node > int(str(gpus)):
        return (f"spec.roles.learner.devicesPerNode: {spec.roles.learner.devices_per_node} ranks per pod, but "
                f"resources.limits nvidia.com/gpu is {gpus}")
    if job.generation.engine == "vllm" and "nvidia.com/gpu" not in spec.roles.generator.resources.limits:
        return "spec.roles.generator.resources.limits: job.generation.engine=vllm needs nvidia.com/gpu"
    return None


def _workload_replicas(obj: dict[str, Any] | None) -> tuple[int, int] | None:
    """(ready, desired) of a Deployment/StatefulSet, or None when it does not exist."""
    if obj is None:
        return None
    return int((obj.get("status") or {}).get("readyReplicas") or 0), int(obj["spec"].get("replicas") or 0)


def apply_workload(kube: Kube, child: dict[str, Any], decide: Callable[[int | None], int]) -> dict[str, Any]:
    """Apply a Deployment/StatefulSet whose replicas depend on what it runs now (`decide`: its live
    spec.replicas, None when it does not exist, -> the replicas to apply): read it, decide, apply on
    that resourceVersion. A scale written in between (an HPA, KEDA, `kubectl scale`) makes the API
    server answer 409; the workload is read and decided again, so it is never reverted by a pass that
    read it before. Sets child.spec.replicas and metadata.resourceVersion; returns the applied object."""
    m = child["metadata"]
    for _ in range(APPLY_ATTEMPTS):
        cur = kube.get("apps/v1", child["kind"], m["namespace"], m["name"])
        child["spec"]["replicas"] = decide(None if cur is None else int(cur["spec"].get("replicas") or 0))
        if cur is None:
            m.pop("resourceVersion", None)
        else:
            m["resourceVersion"] = cur["metadata"]["resourceVersion"]
        try:
            return kube.apply(child)
        except KubeError as exc:
            if exc.status != 409:
                raise
    raise KubeError(409, "Conflict", f"changed by others on each of {APPLY_ATTEMPTS} attempts to apply it",
                    f"{child['kind']} {m['namespace']}/{m['name']}")


def observe(kube: Kube, namespace: str, name: str) -> dict[str, dict[str, Any] | None]:
    return {role: kube.get("apps/v1", kind, namespace, child_name(name, role)) for role, kind in WORKLOADS.items()}


def job_pods(kube: Kube, namespace: str, name: str) -> list[dict[str, Any]]:
    """Every pod of the job's workloads now (one list per pass: restarts and scheduling read it), by the
    label every workload's selector has (`selector`); pods of other components are left out."""
    key = "app.kubernetes.io/instance"
    pods = kube.list_objects("v1", "Pod", namespace, f"{key}={selector(name, '')[key]}")
    return [p for p in pods if ((p.get("metadata") or {}).get("labels") or {}).get(
        "app.kubernetes.io/component") in WORKLOADS]


def learner_pods(kube: Kube, namespace: str, name: str) -> list[dict[str, Any]]:
    return kube.list_objects("v1", "Pod", namespace, ",".join(f"{k}={v}" for k, v in selector(name, "learner").items()))


def _delete_group(kube: Kube, obj: dict[str, Any], pods: list[dict[str, Any]], *, restarts: int) -> None:
    """Delete every live learner pod (the StatefulSet recreates all ranks together). status.learnerGroup
    is emptied (and `restarts` written) first, so neither these deletions nor the pods that replace them
    are taken for a lost rank, whatever happens to this pass or this process afterwards."""
    m = obj["metadata"]
    kube.patch_status(m["namespace"], m["name"], {"restarts": restarts, "learnerGroup": []})
    for p in gang.live(pods):
        try:
            kube.request("DELETE", path("v1", "Pod", m["namespace"], p["metadata"]["name"]))
        except KubeError as exc:
            if exc.status != 404:
                raise


@dataclass(frozen=True, slots=True)
class GangPass:
    """What `gang_pass` did: group restarts so far, the watchdog's memory, why the group stalled (or None),
    and the running group to record in status.learnerGroup (name → UID; empty after the operator deleted
    the pods itself or while the learner is at zero)."""

    restarts: int
    progress: gang.Progress
    stall: str | None
    group: dict[str, str]


def gang_pass(kube: Kube, obj: dict[str, Any], spec: RLJobSpec, *, learner: LearnerStatus, group_up: bool,
              sts: dict[str, Any] | None, spec_hash: str, now: datetime) -> GangPass:
    """Restart or recreate the learner group when it must (scalerl_operator.control.gang). A job that reached
    a terminal phase, or whose learner reported the run done (`done` on the metrics topic: this pass turns it
    Succeeded), is left alone: its pods' exits and restarts are the end of the run, not failures
    (`gang.settled`); it, and a suspended job, remember no group (the learner goes to zero)."""
    m, prev = obj["metadata"], obj.get("status") or {}
    restarts = int(prev.get("restarts") or 0)
    deadline = spec.failure_policy.progress_deadline_seconds
    progress, stalled = gang.watchdog(gang.progress_of(prev), learner.step if learner.records else None,
                                      group_up=group_up, now_s=now.timestamp(), deadline_s=deadline)
    if gang.settled(terminal=is_terminal(prev), learner_done=learner.done) or spec.suspend:
        return GangPass(restarts, progress, None, {})
    pods = learner_pods(kube, m["namespace"], m["name"])
    stall = (f"learner step {progress.step if progress.step is not None else '(none yet)'} has not advanced for "
             f"{deadline}s (failurePolicy.progressDeadlineSeconds)") if stalled and gang.live(pods) else None
    if (why := gang.failure(pods) or gang.lost(pods, gang.group_of(prev)) or stall) is not None:
        restarts += 1
        _delete_group(kube, obj, pods, restarts=restarts)
        kube.event(obj, "Warning", "LearnerStalled" if stall and why == stall else "GroupRestart",
                   f"restarting the whole learner group ({restarts} so far): {why}", "Restart")
        return GangPass(restarts, gang.Progress(progress.step, None), stall, {})
    if old := gang.outdated(pods, sts, spec_hash, SPEC_HASH_ANNOTATION):
        _delete_group(kube, obj, pods, restarts=restarts)
        kube.event(obj, "Normal", "GroupRecreated", f"learner template changed ({', '.join(old)} outdated): "
                   "recreating every rank together", "Update")
        return GangPass(restarts, progress, None, {})
    return GangPass(restarts, progress, None, gang.remember(pods))


EnsureTopics = Callable[[str, list[str], list[str], int], None]


class _Sizes:
    """The replicas of one pass per role, decided (`desired_replicas`) from the spec, the status and
    what each workload runs: `observed` at first, then what its apply read (`decide`)."""

    def __init__(self, spec: RLJobSpec, prev: dict[str, Any], live: dict[str, dict[str, Any] | None]) -> None:
        self.spec, self.terminal, scaling = spec, is_terminal(prev), prev.get("scaling") or {}
        self.remembered = {r: (scaling.get(r) or {}).get("lastReplicas") for r in ("generator", "verifier")}
        self.applied = {r: (scaling.get(r) or {}).get(SPEC_REPLICAS) for r in ("generator", "verifier")}
        self.observed = {r: b[1] if (b := _workload_replicas(o)) else None for r, o in live.items()}
        self.decided = {r: self.decide(r, self.observed[r]) for r in ROLES}

    def decide(self, role: str, now: int | None) -> int:
        """The replicas for `role` when its workload runs `now` (None: it does not exist)."""
        self.observed[role] = now
        if self.terminal:
            return 0
        return desired_replicas(self.spec, live=self.observed, remembered=self.remembered,
                                applied=self.applied)[role]


def _apply_children(kube: Kube, children: list[dict[str, Any]], spec: RLJobSpec, prefix: str,
                    ensure_topics: EnsureTopics, sizes: _Sizes, live: dict[str, dict[str, Any] | None],
                    replicas: dict[str, int]) -> None:
    """Apply `children` in order, the Kafka topics after the ConfigMap (before the workloads that use
    them); each workload on what it runs now (`apply_workload`): `live` and `replicas` are updated."""
    for i, child in enumerate(children):
        if i == 1:
            data, single = topics(prefix)
            ensure_topics(spec.bus.bootstrap, data, single, partitions(spec))
        if child["kind"] in WORKLOADS.values():
            role = child["metadata"]["labels"]["app.kubernetes.io/component"]
            live[role] = apply_workload(kube, child, functools.partial(sizes.decide, role))
            replicas[role] = child["spec"]["replicas"]
        else:
            kube.apply(child)


def reconcile(kube: Kube, obj: dict[str, Any], *, learner: LearnerStatus, ensure_topics: EnsureTopics,
              now: datetime | None = None) -> Outcome:
    """One full pass for `obj` (a fresh RLJob dict). `ensure_topics(bootstrap, data, single,
    partitions)` creates the Kafka topics; Kafka errors propagate (the caller retries)."""
    now = now or datetime.now(UTC)
    m = obj["metadata"]
    name, ns = m["name"], m["namespace"]
    prev = obj.get("status") or {}
    try:
        spec = parse_served_spec(obj.get("spec") or {})
        problem = unrealisable(spec)
    except FieldsFromNewerCRD as exc:  # for the operator build that serves them: nothing changed, nothing written
        log.warning("%s/%s: %s", ns, name, exc)
        return Outcome(phase=prev.get("phase", c.PHASE_PENDING), error=str(exc))
    except SpecError as exc:
        spec, problem = None, str(exc)
    if spec is None or problem is not None:
        return _fail(kube, obj, c.REASON_INVALID_SPEC, problem or "invalid spec", now)
    live = observe(kube, ns, name)
    images = pinned_image_defaults(live, image_defaults(os.environ))  # those the children were created with
    if (problem := image_problem(spec, images)) is not None:
        return _fail(kube, obj, c.REASON_INVALID_SPEC, problem, now)
    # run: the spec the roles run by (suspended while Kueue holds the job)
    queue, run = kueue.gate(kube, obj, spec, lambda: render(name, ns, spec, dict.fromkeys(ROLES, 0), images),
                            finished=prev["phase"] if is_terminal(prev) else None, now=now)
    if not is_terminal(prev):  # the roles' certificates, before the Pods that mount them
        rpc_certmanager.ensure_certificates(kube, obj, now, tuple(spec.rpc.clients), os.environ)
    sizes = _Sizes(run, prev, live)
    replicas = dict(sizes.decided)
    children = render(name, ns, run, replicas, images) + _network_policy(kube, name, ns, spec)
    if queue is not None and queue.admitted:
        kueue.place(children, queue.placement)
    kopf.adopt(children, owner=obj)  # type: ignore[arg-type]
    out = Outcome(phase=prev.get("phase", c.PHASE_PENDING))
    try:
        _apply_children(kube, children, spec, bus_prefix(name, ns), ensure_topics, sizes, live, replicas)
    except KubeError as exc:
        if exc.status in (400, 422):  # the API server rejects what we rendered: the spec cannot be realised
            return _fail(kube, obj, c.REASON_CHILD_APPLY_FAILED, str(exc), now)
        raise
    why = ("suspended" if spec.suspend else f"Kueue: {queue.reason}" if run.suspend and queue else
           f"job {prev['phase']}" if is_terminal(prev) else "spec change or resume")
    out.scaled = {r: (b, replicas[r]) for r, b in sizes.observed.items() if b is not None and b != replicas[r]}
    for role, (b, after) in out.scaled.items():
        kube.event(obj, "Normal", "Scaled", f"{role}: {b} -> {after} replicas ({why})", "Scale")
    roles = {r: _workload_replicas(o) or (0, replicas[r]) for r, o in live.items()}
    sts = next(ch for ch in children if ch["kind"] == "StatefulSet")
    ready, want = roles["learner"]
    g = gang_pass(kube, obj, run, learner=learner, group_up=want > 0 and ready >= want, sts=live["learner"],
                  spec_hash=sts["spec"]["template"]["metadata"]["annotations"][SPEC_HASH_ANNOTATION], now=now)
    progress, stall = g.progress, g.stall
    pods = job_pods(kube, ns, name)
    recorded = prev.get("containerKills") or []
    kills = podfaults.new_kills(pods, recorded)
    for kill in kills:
        kube.event(obj, "Warning", podfaults.OOM_KILLED, kill.message(), "Observe")
    if queue is not None:
        kueue.release(kube, obj, queue, len(pods), now)
    patch = status_patch(obj, spec, roles=roles, learner=learner, now=now, restarts=g.restarts,
                         devices=device_pool(spec, replicas), pending=unschedulable(pods), queue=queue)
    patch["learnerGroup"] = gang.group_status(g.group)
    if kills:
        patch["containerKills"] = podfaults.kills_status(recorded, kills)
    patch["learnerProgress"] = {"step": progress.step,
                                "since": c.rfc3339_us(progress.since_s) if progress.since_s is not None else None}
    if spec.failure_policy.progress_deadline_seconds is not None:
        patch["conditions"] = c.set_condition(
            patch["conditions"], c.LEARNER_STALLED, "True" if stall else "False",
            c.REASON_STEP_NOT_ADVANCING if stall else c.REASON_STEP_ADVANCING, stall or "the learner step advances",
            obj["metadata"].get("generation"), now)
    patch["scaling"] = spec_replicas_status(run, terminal=is_terminal(prev))
    write_status(kube, obj, patch)
    out.phase = patch["phase"]
    return out


def _network_policy(kube: Kube, name: str, ns: str, spec: RLJobSpec) -> list[dict[str, Any]]:
    """[the roles' NetworkPolicy] to apply, or [] when the operator is set not to render them; a policy
    rendered before that is then deleted."""
    network = network_defaults(os.environ)
    if network.enabled:
        return [network_policy(name, ns, spec, network)]
    try:
        kube.request("DELETE", path("networking.k8s.io/v1", "NetworkPolicy", ns, policy_name(name)))
    except KubeError as exc:
        if exc.status != 404:
            raise
    return []


def _fail(kube: Kube, obj: dict[str, Any], reason: str, message: str, now: datetime) -> Outcome:
    log.warning("RLJob %s/%s cannot be realised: %s", obj["metadata"]["namespace"], obj["metadata"]["name"], message)
    write_status(kube, obj, failed_status(obj, reason, message, now))
    return Outcome(phase=c.PHASE_FAILED, error=message)
