"""The operator's runtime against the REAL kube-apiserver: many RLJobs on a bounded pool of passes do not
starve the create handler of a new one, and a child's change reaches the RLJob's status within seconds
even with a long period. No kubelet runs: readiness is simulated by patching the children's /status."""

from __future__ import annotations

import time

import pytest
from operator_helpers import (
    QUIET_KAFKA,
    children,
    create,
    get_job,
    operator,
    rljob,
    simulate_ready,
    unique_job,
    wait_for,
)

from scalerl_operator.api import conditions as c
from scalerl_operator.cluster.kube import Kube

pytestmark = [*QUIET_KAFKA, pytest.mark.infra]


def test_forty_rljobs_do_not_starve_the_create_handler(kube: Kube, namespace: str, bootstrap: str,
                                                        k8s_env: dict[str, str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """40 RLJobs, each with a periodic pass every 0.5 s on 2 shared workers (one kopf daemon thread per
    RLJob filled kopf's pool at a handful of RLJobs here); a 41st gets its children promptly."""
    many = [unique_job() for _ in range(40)]
    # schema-valid but not runnable on a cluster (PPO-off-policy: the distributed learner runs PipelineRL):
    # every pass is API calls only, no Kafka
    ppo = {"train": {"steps": 20, "prompts_per_step": 4}, "off_policy": {"mode": "ppo", "k": 4}}
    with operator(namespace, k8s_env["KUBECONFIG"], monkeypatch, workers=2):
        for name in many:
            create(kube, namespace, rljob(name, bootstrap, job=ppo))
        wait_for("all 40 evaluated", lambda: all(
            ((get_job(kube, namespace, n) or {}).get("status") or {}).get("phase") == c.PHASE_FAILED for n in many),
            timeout_s=120, every_s=1.0)
        name = unique_job()
        t0 = time.monotonic()
        create(kube, namespace, rljob(name, bootstrap))
        wait_for("the new RLJob's children", lambda: len(children(kube, namespace, name)) == 8, timeout_s=60)
        took = time.monotonic() - t0
    print(f"\n[operator] 41st RLJob's 8 children {took:.1f}s after its creation, 40 RLJobs on 2 workers")
    assert took < 15.0, f"the create handler took {took:.1f}s"


def test_a_child_change_reaches_the_status_within_seconds(kube: Kube, namespace: str, bootstrap: str,
                                                          k8s_env: dict[str, str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Period 60 s: the status still follows the workloads' readiness within seconds (children watched)."""
    name = unique_job()
    with operator(namespace, k8s_env["KUBECONFIG"], monkeypatch, interval_s=60.0):
        create(kube, namespace, rljob(name, bootstrap))
        wait_for("children", lambda: len(children(kube, namespace, name)) == 8, timeout_s=60)
        wait_for("status Pending", lambda: ((get_job(kube, namespace, name) or {}).get("status") or {}).get(
            "phase") == c.PHASE_PENDING, timeout_s=30)
        time.sleep(2.0)  # the first periodic pass is over: the next one is a minute away
        t0 = time.monotonic()
        simulate_ready(kube, namespace, name)
        j = wait_for("Ready from the children's status", lambda: (j := get_job(kube, namespace, name)) and c.is_true(
            j["status"].get("conditions"), c.READY) and j, timeout_s=30)
        took = time.monotonic() - t0
    print(f"\n[operator] status Ready {took:.1f}s after the workloads became ready (period 60 s)")
    assert j["status"]["phase"] == c.PHASE_RUNNING and took < 15.0
