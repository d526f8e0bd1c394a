"""The operator on the Pod-running test cluster (scripts/infra/cluster.sh): a real scheduler and
controller-manager, kwok's fake kubelets on two 8-GPU nodes and a CPU node. Nothing here patches a
status: the controllers and kwok report what the tests wait for.

The operator runs in-process (kopf), logged in as the chart's ServiceAccount with a TokenRequest token
and the chart's namespaced RBAC (helm template, operator.scope=namespace), not as a cluster admin:
every test also proves those rules are enough.

What kwok cannot show: containers never run (no image pull, no probes, no GPUs really allocated; a
container restart is only what a stage reports), so the roles' own behaviour is tested elsewhere
(tests/integration, tests/e2e). The autoscaler and the learner gang on this cluster: test_cluster_operator.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from cluster_helpers import (
    CPU_ROLE,
    GPU,
    MERGE,
    WAIT_S,
    Call,
    all_ready,
    by_role,
    gpu_role,
    is_ready,
    job_ready,
    nodes,
    pods,
)
from operator_helpers import QUIET_KAFKA, condition, create, get_job, rljob, unique_job

from scalerl_operator.api import conditions as c
from scalerl_operator.api.spec import GROUP, VERSION
from scalerl_operator.cluster.kube import Kube, path
from waiting import wait_for

pytestmark = [*QUIET_KAFKA, pytest.mark.infra]

NOT_READY_LABEL = "node-not-ready.stage.kwok.x-k8s.io"  # kwok's node-not-ready stage: Ready=False


# ---- tests ---------------------------------------------------------------------------------------------

def test_children_become_scheduled_running_pods_on_the_right_nodes_and_go_with_the_rljob(
        cluster_call: Call, cluster_kube: Kube, cluster_namespace: str, cluster_bootstrap: str,
        cluster_operator: None) -> None:
    call, kube, bootstrap = cluster_call, cluster_kube, cluster_bootstrap
    ns, name = cluster_namespace, unique_job()
    roles = {"learner": gpu_role(8, devicesPerNode=8), "generator": {**gpu_role(4), "replicas": 1},
             "verifier": {**CPU_ROLE, "replicas": 2}, "curriculum": CPU_ROLE}
    job = create(kube, ns, rljob(name, bootstrap, roles=roles))
    want = {"learner": 1, "generator": 1, "verifier": 2, "curriculum": 1}
    placed = wait_for("every pod Running and Ready", lambda: all_ready(call, ns, name, want), timeout_s=WAIT_S)
    gpu_nodes, cpu_nodes = nodes(call, "gpu"), nodes(call, "cpu")
    learner, generator = placed["learner"][0]["spec"]["nodeName"], placed["generator"][0]["spec"]["nodeName"]
    # nodeSelector + toleration: on GPU nodes; 8 + 4 GPUs do not fit one 8-GPU node: two different ones
    assert learner in gpu_nodes and generator in gpu_nodes and learner != generator
    # no toleration of the GPU taint: the CPU roles land on the CPU node
    assert {p["spec"]["nodeName"] for r in ("verifier", "curriculum") for p in placed[r]} == set(cpu_nodes)
    # Deployments became ReplicaSets (owned by them), the StatefulSet made its pod itself
    status, rs = call("GET", f"/apis/apps/v1/namespaces/{ns}/replicasets",
                             query={"labelSelector": f"app.kubernetes.io/instance={name}"})
    assert status == 200
    assert sorted((r["metadata"]["ownerReferences"][0]["kind"], r["metadata"]["ownerReferences"][0]["name"])
                  for r in rs["items"]) == [("Deployment", f"{name}-{r}") for r in ("curriculum", "generator",
                                                                                      "verifier")]
    assert placed["learner"][0]["metadata"]["ownerReferences"][0]["kind"] == "StatefulSet"
    # the status comes from the controllers' counts, nothing faked
    ready = wait_for("RLJob Ready", lambda: job_ready(kube, ns, name), timeout_s=WAIT_S)
    assert ready["status"]["phase"] == c.PHASE_RUNNING
    assert {r: v["summary"] for r, v in ready["status"]["roles"].items()} == {
        "generator": "1/1", "verifier": "2/2", "curriculum": "1/1", "learner": "1/1"}

    # deletion: the finalizer cleans Kafka, then the garbage collector removes every child for real
    kube.request("DELETE", path(f"{GROUP}/{VERSION}", "RLJob", ns, name))
    wait_for("the RLJob gone", lambda: get_job(kube, ns, name) is None, timeout_s=WAIT_S)

    def leftovers() -> list[str]:
        out = []
        for coll in ("/api/v1/namespaces/{ns}/pods", "/api/v1/namespaces/{ns}/services",
                     "/api/v1/namespaces/{ns}/configmaps", "/apis/apps/v1/namespaces/{ns}/deployments",
                     "/apis/apps/v1/namespaces/{ns}/replicasets", "/apis/apps/v1/namespaces/{ns}/statefulsets"):
            _, body = call("GET", coll.format(ns=ns),
                                  query={"labelSelector": f"app.kubernetes.io/instance={name}"})
            out += [f"{o['kind'] if 'kind' in o else coll.rsplit('/', 1)[1]}/{o['metadata']['name']}"
                    for o in body["items"]]
        return out

    wait_for("every child garbage-collected", lambda: not leftovers() or None, timeout_s=WAIT_S)
    assert job["metadata"]["uid"]  # the children were owned by this RLJob (ownerReferences checked in test_operator)


def test_out_of_gpus_pods_stay_pending_and_the_status_names_the_missing_resource(
        cluster_call: Call, cluster_kube: Kube, cluster_namespace: str, cluster_bootstrap: str,
        cluster_operator: None) -> None:
    call, kube, bootstrap = cluster_call, cluster_kube, cluster_bootstrap
    ns, name = cluster_namespace, unique_job()
    gpu_nodes = nodes(call, "gpu")
    # one learner pod per GPU node fills them; one more cannot be placed anywhere
    learners = len(gpu_nodes) + 1
    roles = {"learner": gpu_role(8, devicesPerNode=8, nodes=learners), "generator": {**CPU_ROLE, "replicas": 1},
             "verifier": {**CPU_ROLE, "replicas": 1}, "curriculum": CPU_ROLE}
    create(kube, ns, rljob(name, bootstrap, roles=roles))

    want = {"generator": "1/1", "verifier": "1/1", "curriculum": "1/1", "learner": f"{len(gpu_nodes)}/{learners}"}

    def settled() -> dict[str, Any] | None:  # every pod that can run does; the status says why one cannot
        j = get_job(kube, ns, name)
        roles = {r: v["summary"] for r, v in ((j or {}).get("status") or {}).get("roles", {}).items()}
        return j if roles == want and condition(j, c.READY) == ("False", c.REASON_UNSCHEDULABLE) else None

    j = wait_for(f"roles {want}, Ready=False (Unschedulable)", settled, timeout_s=WAIT_S)
    ready = c.get_condition(j["status"]["conditions"], c.READY)
    assert ready is not None
    assert f"learner: 1 pod(s) unschedulable (missing {GPU}): 0/3 nodes are available" in ready["message"], ready
    assert j["status"]["phase"] == c.PHASE_PENDING  # a learner group with a rank missing does not run
    placed = by_role(pods(call, ns, name))["learner"]
    running = sorted(p["spec"]["nodeName"] for p in placed if is_ready(p))
    pending = [p for p in placed if p["status"].get("phase") == "Pending"]
    assert running == gpu_nodes and len(pending) == 1
    cond = next(x for x in pending[0]["status"]["conditions"] if x["type"] == "PodScheduled")
    assert (cond["status"], cond["reason"]) == ("False", "Unschedulable") and f"Insufficient {GPU}" in cond["message"]


def test_a_node_going_not_ready_evicts_its_pods_and_the_status_shows_it(
        cluster_call: Call, cluster_kube: Kube, cluster_namespace: str, cluster_bootstrap: str,
        cluster_operator: None) -> None:
    call, kube, bootstrap = cluster_call, cluster_kube, cluster_bootstrap
    ns, name = cluster_namespace, unique_job()
    gpu_nodes = nodes(call, "gpu")
    # the learner fills every GPU node: a pod evicted from a failed node has nowhere else to go
    roles = {"learner": gpu_role(8, devicesPerNode=8, nodes=len(gpu_nodes)), "generator": {**CPU_ROLE, "replicas": 1},
             "verifier": {**CPU_ROLE, "replicas": 1}, "curriculum": CPU_ROLE}
    create(kube, ns, rljob(name, bootstrap, roles=roles))
    want = {"learner": len(gpu_nodes), "generator": 1, "verifier": 1, "curriculum": 1}
    wait_for("every pod Running and Ready", lambda: all_ready(call, ns, name, want), timeout_s=WAIT_S)
    wait_for("RLJob Ready", lambda: job_ready(kube, ns, name), timeout_s=WAIT_S)
    failed = gpu_nodes[0]
    node_path = f"/api/v1/nodes/{failed}"
    status, body = call("PATCH", node_path, {"metadata": {"labels": {NOT_READY_LABEL: "true"}}},
                               content_type=MERGE)
    assert status == 200, body
    try:
        def taint_and_degraded() -> dict[str, Any] | None:
            _, node = call("GET", node_path)
            tainted = any(t["key"] == "node.kubernetes.io/not-ready" and t["effect"] == "NoExecute"
                          for t in node["spec"].get("taints") or [])
            j = get_job(kube, ns, name)
            return j if tainted and condition(j, c.DEGRADED) == ("True", c.REASON_UNSCHEDULABLE) else None

        # node-lifecycle taints it; taint-eviction evicts after the default toleration; a rank lost with its node
        # restarts the whole torchrun group (the operator deletes the surviving ranks); the StatefulSet makes the
        # pods again, and the one that no longer fits cannot be placed: the job runs degraded and says why
        j = wait_for("node tainted not-ready, RLJob Degraded (Unschedulable)", taint_and_degraded, timeout_s=WAIT_S)
        assert j["status"]["phase"] == c.PHASE_RUNNING
        assert condition(j, c.READY) == ("False", c.REASON_UNSCHEDULABLE)

        def regrouped() -> list[dict[str, Any]] | None:  # nothing left on the failed node, every other rank Ready
            learner = by_role(pods(call, ns, name))["learner"]
            on_failed = failed in {p["spec"].get("nodeName") for p in learner}
            return None if on_failed or sum(1 for p in learner if is_ready(p)) != len(gpu_nodes) - 1 else learner

        wait_for("the learner group restarted without the failed node", regrouped, timeout_s=WAIT_S)
        j = wait_for("status.restarts 1", lambda: (j := get_job(kube, ns, name)) and j["status"].get(
            "restarts") == 1 and j, timeout_s=WAIT_S)
        lost = [e for e in kube.events(ns, name) if e["reason"] == "GroupRestart"]
        assert len(lost) == 1 and "deleted outside the operator" in lost[0]["message"], lost
    finally:
        call("PATCH", node_path, {"metadata": {"labels": {NOT_READY_LABEL: None}}}, content_type=MERGE)
    # the node recovers (kwok's node-initialize stage): the pod is placed on it again and the job is Ready
    wait_for("every pod Running and Ready again", lambda: all_ready(call, ns, name, want), timeout_s=WAIT_S)
    j = wait_for("RLJob Ready again", lambda: job_ready(kube, ns, name), timeout_s=WAIT_S)
    assert condition(j, c.DEGRADED) == ("False", c.REASON_ALL_ROLES_READY)
    assert j["status"]["restarts"] == 1  # the pending rank placed on the recovered node is the same pod
