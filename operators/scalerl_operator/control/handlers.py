"""The kopf operator: RLJob handlers, the per-job loop (status + autoscaler) and the finalizer (the
state and the work they drive: `scalerl_operator.control.runtime`).

- create / update / resume → `sync` (scalerl_operator.control.reconcile): render, apply, status. Level-based
  and idempotent, so an operator killed mid-way converges on its next start (resume).
- periodic passes on a bounded worker pool (scalerl_operator.control.workqueue, `workers` threads for any
  number of RLJobs, never one thread per RLJob): every `interval_s` the same `sync` (drift repair: a
  deleted child comes back) preceded by one autoscaler pass (scalerl_operator.autoscale.scaler) and the RL
  status from the metrics topic; failed passes back off exponentially with jitter. The children
  (Deployments, StatefulSets, Pods, Kueue Workloads labelled `app.kubernetes.io/managed-by: scalerl-operator`) are
  watched: a change queues a status pass of its RLJob within `CHILD_DELAY_S` (the autoscaler still
  runs only once per `interval_s`).
- delete (finalizer `scalerl.dev/finalizer`, only for what Kubernetes cannot clean;
  scalerl_operator.control.cleanup): the workloads are scaled to zero (the learner checkpoints on SIGTERM),
  then the job's consumer groups and topics are deleted once no member is left; children themselves go by
  garbage collection (owner refs). What cannot be cleaned (a credential Secret deleted with the namespace)
  is reported and left, never waited on forever.
Handlers of one RLJob never overlap: a lock per RLJob serialises the pool's passes and the event
handlers (kopf runs sync handlers in its own threads, which the pool leaves free).

kopf keeps its bookkeeping in `scalerl.dev/*` annotations (progress, last-handled configuration),
never in `status` (the CRD's structural schema would prune it); its own handler Events are off: the
operator posts one Event per scale and per phase change.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import kopf

from scalerl_operator.api import conditions as c
from scalerl_operator.api.spec import GROUP, PLURAL, VERSION
from scalerl_operator.cluster.kube import Kube, KubeError, load_client
from scalerl_operator.control.cleanup import CLEANUP_DELAY_S, CLEANUP_RETRIES
from scalerl_operator.control.jobstatus import write_status
from scalerl_operator.control.runtime import RECONCILE_ERRORS, OperatorConfig, Runtime

log = logging.getLogger("scalerl_operator")

FINALIZER = "scalerl.dev/finalizer"
CHILD_DELAY_S = 1.0  # a child's change → a status pass of its RLJob within this (changes coalesce)
MANAGED = {"app.kubernetes.io/managed-by": "scalerl-operator"}
JOB_LABEL = "scalerl.dev/job"


def may_scan_cluster(kube: Kube) -> bool:
    """Whether this identity may list and watch namespaces and CRDs (what kopf's cluster scanning
    needs), by SelfSubjectAccessReview; on an error, assume it may (kopf then finds out itself)."""
    checks = [("", "namespaces"), ("apiextensions.k8s.io", "customresourcedefinitions")]
    try:
        for group, resource in checks:
            for verb in ("list", "watch"):
                review = kube.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body={
                    "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                    "spec": {"resourceAttributes": {"verb": verb, "group": group, "resource": resource}}})
                if not (review.get("status") or {}).get("allowed"):
                    return False
    except KubeError as exc:
        log.warning("could not review the operator's own permissions: %s", exc)
    return True


def _runtime(memo: Any) -> Runtime:
    return memo.runtime  # type: ignore[no-any-return]


@kopf.on.startup()
def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="scalerl.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="scalerl.dev", key="last-handled-configuration")
    settings.posting.enabled = False  # our own Events: one per scale and phase change
    settings.networking.request_timeout = 60.0
    settings.watching.server_timeout = 300  # seconds; the API server wants an integer
    config = getattr(memo, "config", None) or OperatorConfig.from_env()
    memo.runtime = Runtime(Kube(load_client(config.kubeconfig)), config)
    if not may_scan_cluster(memo.runtime.kube):
        # namespaced RBAC (the chart's operator.scope=namespace): kopf would retry listing namespaces
        # and CRDs for about a minute before it falls back to the namespaces it was given
        settings.scanning.disabled = True
        log.info("no RBAC to list namespaces and CRDs: serving the given namespaces only")
    memo.runtime.start_queue()


@kopf.on.cleanup()
def shutdown(memo: kopf.Memo, **_: Any) -> None:
    flag = getattr(memo, "stop_flag", None)  # set by `python -m scalerl_operator`
    if flag is not None and not flag.done():
        flag.set_result(None)
    if hasattr(memo, "runtime"):
        _runtime(memo).close()
        _runtime(memo).kube.api.close()


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
def on_change(meta: kopf.Meta, memo: kopf.Memo, **_: Any) -> None:
    """Any change of spec, labels or annotations (and every RLJob at operator start)."""
    try:
        _runtime(memo).sync(str(meta["namespace"]), str(meta["name"]), scale=False)
    except Exception as exc:
        RECONCILE_ERRORS.labels(meta["namespace"], meta["name"]).inc()
        if isinstance(exc, KubeError) and exc.status in (401, 403):
            raise kopf.PermanentError(str(exc)) from exc
        raise kopf.TemporaryError(f"reconcile failed, retrying: {exc}", delay=5) from exc


@kopf.on.event(GROUP, VERSION, PLURAL)
async def track(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    """Every RLJob the watch lists or adds joins the pool's schedule (once; its own status writes do
    not re-queue it); a deleted one leaves it."""
    rt, obj = _runtime(memo), event["object"]
    key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
    if rt.queue is None:
        return
    if event["type"] == "DELETED":
        rt.queue.forget(key)
        rt.next_scale.pop(key, None)
    elif key not in rt.next_scale and not obj["metadata"].get("deletionTimestamp"):
        rt.next_scale.setdefault(key, 0.0)
        rt.queue.add(key)


async def child_changed(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    """A child of an RLJob changed (pod ready, restarted, Pending; a workload's status): refresh that
    RLJob's status within CHILD_DELAY_S."""
    rt, meta = _runtime(memo), event["object"]["metadata"]
    job = (meta.get("labels") or {}).get(JOB_LABEL)
    if job and rt.queue is not None and (meta["namespace"], job) in rt.next_scale:
        rt.queue.add((meta["namespace"], job), CHILD_DELAY_S)


# (a queued job's Kueue Workload too: its admission or eviction is acted on within CHILD_DELAY_S; kopf
# leaves the watch idle on a cluster without Kueue's CRDs)
for _group, _version, _plural in (("apps", "v1", "deployments"), ("apps", "v1", "statefulsets"), ("", "v1", "pods"),
                                  ("kueue.x-k8s.io", "v1beta2", "workloads")):
    kopf.on.event(_group, _version, _plural, labels=MANAGED)(child_changed)


@kopf.on.delete(GROUP, VERSION, PLURAL)
def on_delete(body: kopf.Body, memo: kopf.Memo, retry: int, **_: Any) -> None:
    """The finalizer (scalerl_operator.control.cleanup): retried while a step can still succeed, released with a
    report of what was left behind otherwise, so a namespace being deleted is never held."""
    rt = _runtime(memo)
    obj = dict(body)
    m = obj["metadata"]
    try:
        rt.cleanup(obj, retry)
    except kopf.TemporaryError:
        raise
    except Exception as exc:  # not a step's error (cleanup decides those): retried as long, then released
        if retry < CLEANUP_RETRIES:
            raise kopf.TemporaryError(f"cleanup failed, retrying: {exc}", delay=CLEANUP_DELAY_S) from exc
        log.error("%s/%s: giving up the cleanup (the topics %s.%s.* and, with store.retention: delete, the objects "
                  "under spec.store.uri may be left): %s", m["namespace"], m["name"], m["namespace"], m["name"], exc)
        try:
            write_status(rt.kube, obj, {"conditions": c.set_condition(
                (obj.get("status") or {}).get("conditions"), c.DEGRADED, "True", "CleanupFailed", str(exc)[:1000],
                m.get("generation"), datetime.now(UTC))})
        except KubeError as err:  # the RLJob may be gone already: the log line above says it
            log.info("%s/%s: CleanupFailed not written: %s", m["namespace"], m["name"], err)
    finally:
        rt.forget(m["uid"])
        if rt.queue is not None:
            rt.queue.forget((m["namespace"], m["name"]))
