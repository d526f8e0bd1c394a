"""Faults of the control plane and of memory on the real node: the operator Pod killed and its Deployment
upgraded by `helm upgrade` while a job trains (the job's Pods keep running, the new operator takes the Lease
and the job succeeds), and a role container that exceeds its memory limit (the kernel kills it, the kubelet
restarts it, the RLJob reports it). Read from the API server (Pods, the Lease, status, Events).
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest
from rljob_helpers import RELEASE, REPO, SYSTEM_NS, start_job, wait_job

pytestmark = [pytest.mark.infra]

STEPS = 80
TIMEOUT_S = 900.0
OPERATOR = "app.kubernetes.io/component=operator"
# the verifier peaks at ~80 MB (81 MB maximum RSS measured on its own, 2026-12-06: it no longer imports torch);
# numpy alone is 30 MB, so it is killed while importing, with runc's own few MB well inside
OOM_LIMIT = "40Mi"


def _step(job: dict[str, Any]) -> int:
    return int((job.get("status") or {}).get("learnerStep") or 0)


def _finished(job: dict[str, Any]) -> bool:
    return (job.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _ready_operator(core: Any, other_than: set[str], timeout_s: float = 180.0) -> str:
    """The name of a Ready operator Pod not in `other_than` (its replacement)."""
    deadline = time.monotonic() + timeout_s
    names: list[str] = []
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod(SYSTEM_NS, label_selector=OPERATOR).items
        names = [p.metadata.name for p in pods]
        for p in pods:
            ready = any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
            if p.metadata.name not in other_than and ready and not p.metadata.deletion_timestamp:
                return str(p.metadata.name)
        time.sleep(1.0)
    raise AssertionError(f"no new Ready operator Pod after {timeout_s:.0f} s (Pods: {names})")


def _lease_holder(coord: Any) -> str | None:
    leases = coord.list_namespaced_lease(SYSTEM_NS).items
    held = [le.spec.holder_identity for le in leases if le.spec.holder_identity]
    return held[0] if len(held) == 1 else None


def _wait_holder(coord: Any, name: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    holder = None
    while time.monotonic() < deadline:
        holder = _lease_holder(coord)
        if holder == name:
            return
        time.sleep(1.0)
    raise AssertionError(f"the operator's Lease is held by {holder!r}, not by the new operator Pod {name}")


def _job_pods(core: Any, ns: str) -> dict[str, tuple[str, int]]:
    """Running job Pods: name -> (UID, restarts of its containers)."""
    out = {}
    for p in core.list_namespaced_pod(ns).items:
        if p.status.phase == "Running" and not p.metadata.deletion_timestamp:
            out[p.metadata.name] = (p.metadata.uid, sum(c.restart_count for c in p.status.container_statuses or []))
    return out


def test_real_node_operator_killed_and_upgraded_mid_run_the_job_goes_on(
        node_env, node_api, node_core, node_namespace, kubectl, chart, mixed_start) -> None:
    from kubernetes import client

    custom, coord = client.CustomObjectsApi(node_api), client.CoordinationV1Api(node_api)
    name = "opfault"
    start_job(kubectl, node_namespace, node_env, mixed_start, name, steps=STEPS)
    wait_job(custom, node_namespace, name, lambda j: _step(j) >= 2, "at step 2", TIMEOUT_S)
    before = _job_pods(node_core, node_namespace)
    assert {"learner", "generator", "verifier", "curriculum"} <= {n.split("-")[1] for n in before}, before

    # the operator Pod deleted: its Deployment replaces it and the replacement holds the Lease
    (old,) = [p.metadata.name for p in node_core.list_namespaced_pod(SYSTEM_NS, label_selector=OPERATOR).items]
    assert _lease_holder(coord) == old
    kubectl("delete", "pod", "-n", SYSTEM_NS, old, "--wait=false")
    second = _ready_operator(node_core, {old})
    _wait_holder(coord, second)

    # `helm upgrade` of the operator (a changed value rolls its Deployment), the job still running
    proc = subprocess.run([*chart["helm"], "upgrade", RELEASE, str(REPO / "helm" / "scalerl"), "--reuse-values",
                           "--set", "operator.logLevel=debug", "--wait", "--timeout", "180s"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"helm upgrade failed: {proc.stderr}"
    third = _ready_operator(node_core, {old, second})
    _wait_holder(coord, third)
    step_at_upgrade = _step(custom.get_namespaced_custom_object("scalerl.dev", "v1alpha1", node_namespace,
                                                                "rljobs", name))
    assert step_at_upgrade < STEPS, "the job ended before the upgrade: raise STEPS"
    after = _job_pods(node_core, node_namespace)
    assert {n: before[n] for n in before} == {n: after.get(n) for n in before}, (
        f"the job's Pods changed across the operator's restarts: before {before}, after {after}")

    # the new operator reconciles: status advances to the end
    job = wait_job(custom, node_namespace, name, _finished, "finished", TIMEOUT_S)
    status = job["status"]
    assert status["phase"] == "Succeeded" and status["learnerStep"] == STEPS, json.dumps(status, indent=1)
    assert status["restarts"] == 0
    subprocess.run([*chart["helm"], "upgrade", RELEASE, str(REPO / "helm" / "scalerl"), "--reuse-values",
                    "--set", "operator.logLevel=info", "--wait", "--timeout", "180s"],
                   capture_output=True, text=True, timeout=240, check=False)


def test_real_node_role_over_its_memory_limit_is_oom_killed_and_reported(
        node_env, node_api, node_core, node_namespace, kubectl, chart, mixed_start) -> None:
    from kubernetes import client

    custom = client.CustomObjectsApi(node_api)
    name = "oom"
    start_job(kubectl, node_namespace, node_env, mixed_start, name, steps=200,
              roles={"generator": {"replicas": 1},
                     "verifier": {"replicas": 1, "resources": {"limits": {"memory": OOM_LIMIT}}}})
    job = wait_job(custom, node_namespace, name, lambda j: bool((j.get("status") or {}).get("containerKills")),
                   "reporting a container kill", 300.0)
    kill = job["status"]["containerKills"][0]
    # the kubelet's own account of the Pod agrees
    pod = node_core.read_namespaced_pod(kill["pod"], node_namespace)
    terminated = [cs.last_state.terminated or cs.state.terminated for cs in pod.status.container_statuses]
    assert any(t is not None and t.reason == "OOMKilled" for t in terminated), pod.status.container_statuses
    assert (kill["role"], kill["reason"], kill["memoryLimit"], kill["exitCode"]) == (
        "verifier", "OOMKilled", OOM_LIMIT, 137), kill
    events = node_core.list_namespaced_event(node_namespace, field_selector=f"involvedObject.name={name}").items
    oom = [e for e in events if e.reason == "OOMKilled"]
    assert oom and oom[0].type == "Warning" and kill["pod"] in oom[0].message and OOM_LIMIT in oom[0].message
    custom.delete_namespaced_custom_object("scalerl.dev", "v1alpha1", node_namespace, "rljobs", name)
