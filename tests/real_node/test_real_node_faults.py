"""Faults on the real node, as a cluster produces them: Pods deleted mid-run (the kubelet sends SIGTERM, the
controllers replace them). Counted from the bus and the store (`scalerl.chaos.accounting`: every issued
group trained at most once, none lost, no step number twice), never from logs.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from rljob_helpers import start_job, wait_job

from infra_session import sasl_bus
from scalerl_operator.render.names import bus_prefix

pytestmark = [pytest.mark.infra]

STEPS = 18
TIMEOUT_S = 1200.0
GENERATORS = "app.kubernetes.io/component=generator"


def _wait_replaced(core: Any, ns: str, old: str, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    names: list[str] = []
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod(ns, label_selector=GENERATORS).items
        names = [p.metadata.name for p in pods]
        if any(p.metadata.name != old and p.status.phase == "Running" for p in pods):
            return
        time.sleep(0.5)
    raise AssertionError(f"generator pod {old} not replaced by a running one after {timeout_s:.0f} s: {names}")


def _finished(job: dict[str, Any]) -> bool:
    return (job.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _step(job: dict[str, Any]) -> int:
    return int((job.get("status") or {}).get("learnerStep") or 0)


def test_real_node_deleted_generator_and_learner_pods_lose_and_repeat_nothing(
        node_env, node_api, node_core, node_namespace, kubectl, chart, mixed_start, monkeypatch) -> None:
    from kubernetes import client

    from scalerl.chaos.accounting import check_accounting
    from scalerl.store.factory import open_store

    custom = client.CustomObjectsApi(node_api)
    name = "faults"
    bucket = start_job(kubectl, node_namespace, node_env, mixed_start, name, steps=STEPS)
    # a generator Pod deleted once the job trains: its Deployment replaces it, its prompts are generated
    wait_job(custom, node_namespace, name, lambda j: _step(j) >= 3, "at step 3", TIMEOUT_S)
    gen = node_core.list_namespaced_pod(node_namespace, label_selector=GENERATORS).items
    assert len(gen) == 1
    kubectl("delete", "pod", "-n", node_namespace, gen[0].metadata.name, "--wait=false")
    # its Deployment replaces it (the deleted one may still be draining: SIGTERM, then its grace period)
    _wait_replaced(node_core, node_namespace, gen[0].metadata.name)
    # the learner Pod deleted past its first checkpoint: it checkpoints on SIGTERM, the group restarts once
    wait_job(custom, node_namespace, name, lambda j: _step(j) >= 8, "at step 8", TIMEOUT_S)
    kubectl("delete", "pod", "-n", node_namespace, f"{name}-learner-0", "--wait=false")
    job = wait_job(custom, node_namespace, name, _finished, "finished", TIMEOUT_S)
    status = job["status"]
    assert status["phase"] == "Succeeded", json.dumps(status, indent=1)
    assert status["restarts"] == 1 and status["learnerStep"] == STEPS

    for key in ("S3_ENDPOINT", "S3_ACCESS_KEY", "S3_SECRET_KEY"):
        monkeypatch.setenv(key, node_env[key])
    monkeypatch.setenv("S3_REGION", "us-east-1")
    bus = sasl_bus(node_env)
    try:
        report = check_accounting(bus, open_store(f"s3://{bucket}/{name}"), bus_prefix(name, node_namespace))
    finally:
        bus.close()
    assert report.ok, report.describe()
    assert report.steps == STEPS and report.repeated_steps == []
