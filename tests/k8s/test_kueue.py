"""spec.queueName with a REAL Kueue (scripts/infra/kueue.sh: Kueue's controller manager, built from its Go
module, with RLJob.v1alpha1.scalerl.dev as an external framework) on the Pod-running cluster (real
scheduler, controller-manager, kwok's two 8-GPU nodes), the operator in-process. Nothing here plays
Kueue's part: Kueue admits, queues and evicts the Workloads the operator creates; the scheduler places
the pods.

The queue: a ClusterQueue whose nvidia.com/gpu quota is exactly ONE job's learner + minimum generators
(learner 1 node × 4 GPUs + 2 generators × 1 GPU = 6), split in two resource groups: cpu/memory on a plain
flavor, nvidia.com/gpu on a flavor whose nodeLabels and tolerations are the GPU nodes' (the RLJobs name
neither: the pods reach the tainted GPU nodes only through the admitted flavor). Two RLJobs that each
need the whole quota: the first is admitted and runs, the second waits with Kueue's message and no pod;
deleting the first admits the second; suspending that one deactivates its Workload, Kueue evicts it,
the operator scales it to zero and gives the quota back. A job that ends (Failed: its deadline) finishes
its Workload, which frees the quota for the next. A job labelled with a higher WorkloadPriorityClass
preempts a running one (ClusterQueue preemption withinClusterQueue: LowerPriority): the victim is
scaled to zero, its quota released, and it waits again. With the chart's namespaced RBAC the operator
queues the job, but may not read the cluster-scoped ResourceFlavors: the admitted job runs nothing and
its status says so.

On the bare API server (no Kueue): a queued RLJob runs nothing and says Kueue is not installed; the
CRD refuses a bad queue name.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from operator_helpers import (
    QUIET_KAFKA,
    condition,
    create,
    get_job,
    kafka_bootstrap,
    operator,
    replicas,
    rljob,
    unique_job,
)

from scalerl_operator.api import conditions as c
from scalerl_operator.api.spec import GROUP, VERSION
from scalerl_operator.cluster.kube import Kube, KubeError, path
from scalerl_operator.control.kueue import (
    API,
    REASON_FORBIDDEN,
    REASON_NOT_INSTALLED,
    REASON_PRIORITY_NOT_FOUND,
    workload_name,
)
from scalerl_operator.render.names import QUEUE_LABEL
from waiting import wait_for

pytestmark = [*QUIET_KAFKA, pytest.mark.infra]

Call = Callable[..., tuple[int, Any]]
GPU = "nvidia.com/gpu"
GPU_NODE_LABELS = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
GPU_TOLERATION = {"key": GPU, "operator": "Exists", "effect": "NoSchedule"}
WAIT_S = 90.0  # Kueue's admission, scheduling and kwok's stages take seconds; the machine may be loaded
KUEUE = f"/apis/{API}"


def job_roles() -> dict[str, Any]:
    """Learner 1 × 4 GPUs, generators 2 × 1 GPU (their minimum: 2), a CPU verifier: 6 GPUs admitted."""
    return {"learner": {"nodes": 1, "devicesPerNode": 4,
                        "resources": {"limits": {GPU: 4}, "requests": {GPU: 4, "cpu": "1"}}},
            "generator": {"replicas": 2, "resources": {"limits": {GPU: 1}, "requests": {GPU: 1, "cpu": "1"}}},
            "verifier": {"replicas": 1, "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}}


@pytest.fixture
def queue(cluster_call: Call, cluster_namespace: str, kueue_env: dict[str, str]) -> Iterator[dict[str, str]]:
    """ResourceFlavors, a ClusterQueue (6 GPUs), a WorkloadPriorityClass (1000) and a LocalQueue in the
    test namespace, all named per test: {"name": LocalQueue, "high": WorkloadPriorityClass}; removed
    afterwards (the jobs first, so Kueue lets the ClusterQueue go)."""
    tag = uuid.uuid4().hex[:8]
    cpu_rf, gpu_rf, cq, lq = f"cpu-{tag}", f"gpu-{tag}", f"cq-{tag}", "team-a"
    objs = [
        (f"{KUEUE}/resourceflavors", {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": cpu_rf},
                                      "spec": {}}),
        (f"{KUEUE}/resourceflavors", {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": gpu_rf},
                                      "spec": {"nodeLabels": GPU_NODE_LABELS, "tolerations": [GPU_TOLERATION]}}),
        (f"{KUEUE}/clusterqueues", {"apiVersion": API, "kind": "ClusterQueue", "metadata": {"name": cq}, "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": cluster_namespace}},
            "queueingStrategy": "BestEffortFIFO",
            "preemption": {"withinClusterQueue": "LowerPriority"},
            "resourceGroups": [
                {"coveredResources": ["cpu", "memory"], "flavors": [{"name": cpu_rf, "resources": [
                    {"name": "cpu", "nominalQuota": "64"}, {"name": "memory", "nominalQuota": "256Gi"}]}]},
                {"coveredResources": [GPU], "flavors": [{"name": gpu_rf, "resources": [
                    {"name": GPU, "nominalQuota": "6"}]}]}]}}),
        (f"{KUEUE}/workloadpriorityclasses", {"apiVersion": API, "kind": "WorkloadPriorityClass",
                                              "metadata": {"name": f"high-{tag}"}, "value": 1000}),
        (f"{KUEUE}/namespaces/{cluster_namespace}/localqueues",
         {"apiVersion": API, "kind": "LocalQueue", "metadata": {"name": lq, "namespace": cluster_namespace},
          "spec": {"clusterQueue": cq}}),
    ]
    for collection, obj in objs:
        status, body = cluster_call("POST", collection, obj)
        assert status == 201, body
    wait_for(f"ClusterQueue {cq} active", lambda: (cluster_call("GET", f"{KUEUE}/clusterqueues/{cq}")[1].get(
        "status") or {}).get("conditions", [{}])[0].get("status") == "True", timeout_s=WAIT_S)
    try:
        yield {"name": lq, "high": f"high-{tag}"}
    finally:
        rljobs = f"/apis/{GROUP}/{VERSION}/namespaces/{cluster_namespace}/rljobs"
        try:
            for item in cluster_call("GET", rljobs)[1].get("items", []):  # the operator has stopped
                cluster_call("PATCH", f"{rljobs}/{item['metadata']['name']}", {"metadata": {"finalizers": None}},
                             content_type="application/merge-patch+json")
            cluster_call("DELETE", rljobs)
            wait_for("the test's Workloads gone (garbage collection)", lambda: cluster_call(
                "GET", f"{KUEUE}/namespaces/{cluster_namespace}/workloads")[1].get("items") == [], timeout_s=WAIT_S)
        finally:
            # (the namespace fixture finalizes the namespace itself: its custom objects must go first)
            for collection, obj in reversed(objs):
                cluster_call("DELETE", f"{collection}/{obj['metadata']['name']}")
            for collection, obj in objs:
                wait_for(f"{obj['kind']} {obj['metadata']['name']} deleted", lambda c=collection, o=obj: cluster_call(
                    "GET", f"{c}/{o['metadata']['name']}")[0] == 404, timeout_s=WAIT_S)


def workload(kube: Kube, ns: str, job: str) -> dict[str, Any] | None:
    return kube.get(API, "Workload", ns, workload_name(job))


def wl_condition(wl: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    return next((x for x in ((wl or {}).get("status") or {}).get("conditions") or [] if x["type"] == type_), {})


def pods(kube: Kube, ns: str, job: str) -> list[dict[str, Any]]:
    return kube.list_objects("v1", "Pod", ns, f"app.kubernetes.io/instance={job}")


def all_scheduled(kube: Kube, ns: str, job: str, n: int) -> list[dict[str, Any]] | None:
    ps = pods(kube, ns, job)
    return ps if len(ps) == n and all(p["spec"].get("nodeName") for p in ps) else None


def queue_status(kube: Kube, ns: str, job: str) -> dict[str, Any]:
    j = get_job(kube, ns, job) or {}
    return next((x for x in (j.get("status") or {}).get("conditions") or [] if x["type"] == c.QUEUE_ADMITTED), {})


@pytest.fixture
def kube(cluster_kube: Kube) -> Kube:  # every test here works on the Pod-running cluster
    return cluster_kube


def test_the_quota_admits_one_job_the_other_waits_then_runs(
        kube: Kube, cluster_namespace: str, cluster_env: dict[str, str], queue: dict[str, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    ns, bootstrap = cluster_namespace, kafka_bootstrap(cluster_env)
    first, second = unique_job(), unique_job()
    with operator(ns, cluster_env["CLUSTER_KUBECONFIG"], monkeypatch):
        create(kube, ns, rljob(first, bootstrap, queueName=queue["name"], roles=job_roles()))
        # the Workload: learner × 1, generator × 2 (its minimum), verifier × 1, curriculum × 1, owned by the RLJob
        wl = wait_for("first Workload admitted", lambda: (w := workload(kube, ns, first)) and
                      wl_condition(w, "Admitted").get("status") == "True" and w, timeout_s=WAIT_S)
        assert wl["metadata"]["labels"][QUEUE_LABEL] == queue["name"] == wl["spec"]["queueName"]
        assert {p["name"]: p["count"] for p in wl["spec"]["podSets"]} == {
            "learner": 1, "generator": 2, "verifier": 1, "curriculum": 1}
        (owner,) = wl["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("RLJob", first, True)
        usage = {p["name"]: p.get("resourceUsage", {}).get(GPU) for p in wl["status"]["admission"]["podSetAssignments"]}
        assert usage["learner"] == "4" and usage["generator"] == "2"
        # its pods: created, and scheduled on the GPU nodes through the flavor's nodeLabels and toleration
        running = wait_for("first job's 5 pods scheduled", lambda: all_scheduled(kube, ns, first, 5), timeout_s=WAIT_S)
        for p in running:
            role = p["metadata"]["labels"]["app.kubernetes.io/component"]
            if role in ("learner", "generator"):
                assert p["spec"]["nodeName"].startswith("gpu-node-"), (role, p["spec"]["nodeName"])
                assert p["spec"]["nodeSelector"].items() >= GPU_NODE_LABELS.items()
                assert GPU_TOLERATION in p["spec"]["tolerations"]
            else:
                assert not (p["spec"].get("nodeSelector") or {}).keys() & GPU_NODE_LABELS.keys(), role
        wait_for("first job QueueAdmitted", lambda: queue_status(kube, ns, first).get("status") == "True",
                 timeout_s=WAIT_S)

        # the second needs the whole quota too: Kueue keeps it pending, the operator creates no pod
        create(kube, ns, rljob(second, bootstrap, queueName=queue["name"], roles=job_roles()))
        pending = wait_for("second Workload pending with Kueue's message", lambda: (
            w := workload(kube, ns, second)) and "insufficient" in wl_condition(w, "QuotaReserved").get(
            "message", "") and w, timeout_s=WAIT_S)
        assert wl_condition(pending, "QuotaReserved")["status"] == "False"
        assert GPU in wl_condition(pending, "QuotaReserved")["message"]
        status = wait_for("second RLJob says it is queued", lambda: (q := queue_status(kube, ns, second)).get(
            "status") == "False" and "insufficient" in q.get("message", "") and q, timeout_s=WAIT_S)
        assert status["reason"] == "Pending"
        j = get_job(kube, ns, second)
        assert j is not None and j["status"]["phase"] == c.PHASE_SUSPENDED
        assert condition(j, c.SUSPENDED) == ("True", c.REASON_WAITING_FOR_KUEUE)
        assert set(replicas(kube, ns, second).values()) == {0} and pods(kube, ns, second) == []

        # the first goes: its Workload goes with it (owner reference), the second is admitted and runs
        kube.request("DELETE", path(f"{GROUP}/{VERSION}", "RLJob", ns, first))
        wait_for("second Workload admitted", lambda: wl_condition(workload(kube, ns, second), "Admitted").get(
            "status") == "True", timeout_s=WAIT_S)
        wait_for("second job's 5 pods scheduled", lambda: all_scheduled(kube, ns, second, 5), timeout_s=WAIT_S)
        assert workload(kube, ns, first) is None

        # suspend it: the Workload is deactivated, Kueue evicts it, the operator scales it to zero and, once
        # no pod is left, gives the quota back
        kube.request("PATCH", path(f"{GROUP}/{VERSION}", "RLJob", ns, second), body={"spec": {"suspend": True}},
                     content_type="application/merge-patch+json")
        wait_for("evicted: every role at 0", lambda: set(replicas(kube, ns, second).values()) == {0}, timeout_s=WAIT_S)
        wl = wait_for("quota released", lambda: (w := workload(kube, ns, second)) and
                      wl_condition(w, "QuotaReserved").get("status") == "False" and w, timeout_s=WAIT_S)
        assert wl["spec"]["active"] is False and not wl["status"].get("admission")
        assert wl_condition(wl, "Evicted")["reason"] == "Deactivated"  # Kueue v0.17's reason
        assert pods(kube, ns, second) == []
        wait_for("RLJob reports the eviction", lambda: (q := queue_status(kube, ns, second)).get(
            "reason") == "Deactivated" and q.get("status") == "False", timeout_s=WAIT_S)


# ---- the bare API server: no Kueue ------------------------------------------------------------------

def test_without_kueue_a_queued_job_runs_nothing_and_says_why(
        k8s: Any, rljob_crd: dict[str, Any], namespace: str, k8s_env: dict[str, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    kube = Kube(k8s)
    name = unique_job()
    with operator(namespace, k8s_env["KUBECONFIG"], monkeypatch):
        create(kube, namespace, rljob(name, kafka_bootstrap(k8s_env), queueName="team-a"))
        q = wait_for("QueueAdmitted False", lambda: (x := queue_status(kube, namespace, name)).get("reason") and x,
                     timeout_s=60)
        assert (q["status"], q["reason"]) == ("False", REASON_NOT_INSTALLED) and "Kueue" in q["message"]
        assert set(replicas(kube, namespace, name).values()) == {0}


def test_the_crd_refuses_a_bad_queue_name(k8s: Any, rljob_crd: dict[str, Any], namespace: str) -> None:
    with pytest.raises(KubeError) as exc:
        create(Kube(k8s), namespace, rljob(unique_job(), "127.0.0.1:9", queueName="Team_A"))
    assert exc.value.status == 422 and "queueName" in exc.value.message


def admitted_and_running(kube: Kube, ns: str, job: str) -> list[dict[str, Any]]:
    wait_for(f"{job}'s Workload admitted", lambda: wl_condition(workload(kube, ns, job), "Admitted").get(
        "status") == "True", timeout_s=WAIT_S)
    return wait_for(f"{job}'s 5 pods scheduled", lambda: all_scheduled(kube, ns, job, 5), timeout_s=WAIT_S)


def pending_on_quota(kube: Kube, ns: str, job: str) -> dict[str, Any]:
    return wait_for(f"{job}'s Workload pending on quota", lambda: (w := workload(kube, ns, job)) and "insufficient" in
                    wl_condition(w, "QuotaReserved").get("message", "") and w, timeout_s=WAIT_S)


def test_a_job_that_ends_finishes_its_workload_and_the_next_is_admitted(
        kube: Kube, cluster_namespace: str, cluster_env: dict[str, str], queue: dict[str, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    ns, bootstrap = cluster_namespace, kafka_bootstrap(cluster_env)
    first, second = unique_job(), unique_job()
    with operator(ns, cluster_env["CLUSTER_KUBECONFIG"], monkeypatch):
        # the first fails once it ran 15 s (activeDeadlineSeconds counts from admission, not from creation)
        create(kube, ns, rljob(first, bootstrap, queueName=queue["name"], roles=job_roles(), activeDeadlineSeconds=15))
        admitted_and_running(kube, ns, first)
        create(kube, ns, rljob(second, bootstrap, queueName=queue["name"], roles=job_roles()))
        pending_on_quota(kube, ns, second)
        wl = wait_for("first Workload Finished", lambda: (w := workload(kube, ns, first)) and
                      wl_condition(w, "Finished").get("status") == "True" and w, timeout_s=WAIT_S)
        assert wl_condition(wl, "Finished")["reason"] == "Failed"
        j = get_job(kube, ns, first)
        assert j is not None and j["status"]["phase"] == c.PHASE_FAILED
        assert condition(j, c.FAILED) == ("True", c.REASON_DEADLINE_EXCEEDED)
        admitted_and_running(kube, ns, second)
        wait_for("first job's pods gone", lambda: pods(kube, ns, first) == [], timeout_s=WAIT_S)


def test_a_higher_priority_job_preempts_a_running_one(
        kube: Kube, cluster_namespace: str, cluster_env: dict[str, str], queue: dict[str, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    ns, bootstrap = cluster_namespace, kafka_bootstrap(cluster_env)
    high = queue["high"]
    low, urgent = unique_job(), unique_job()
    with operator(ns, cluster_env["CLUSTER_KUBECONFIG"], monkeypatch):
        create(kube, ns, rljob(low, bootstrap, queueName=queue["name"], roles=job_roles()))
        admitted_and_running(kube, ns, low)
        obj = rljob(urgent, bootstrap, queueName=queue["name"], roles=job_roles())
        obj["metadata"]["labels"] = {"kueue.x-k8s.io/priority-class": high}
        create(kube, ns, obj)
        wl = wait_for("urgent Workload with its priority", lambda: workload(kube, ns, urgent), timeout_s=WAIT_S)
        assert wl["spec"]["priority"] == 1000 and wl["spec"]["priorityClassRef"] == {
            "group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": high}
        # Kueue evicts the low one; the operator stops it and gives the quota back; the urgent one runs
        q = wait_for("low RLJob reports the preemption", lambda: (x := queue_status(kube, ns, low)).get(
            "reason") == "Preempted" and x, timeout_s=WAIT_S)
        assert q["status"] == "False"
        admitted_and_running(kube, ns, urgent)
        assert pods(kube, ns, low) == [] and set(replicas(kube, ns, low).values()) == {0}
        victim = pending_on_quota(kube, ns, low)  # requeued: it waits for the quota again
        assert wl_condition(victim, "Requeued")["status"] == "True" and not victim["status"].get("admission")



def test_with_namespaced_rbac_an_admitted_job_runs_nothing_and_says_what_it_may_not_read(
        kube: Kube, cluster_namespace: str, cluster_env: dict[str, str], queue: dict[str, str],
        operator_kubeconfig: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    ns, job = cluster_namespace, unique_job()
    with operator(ns, str(operator_kubeconfig), monkeypatch):
        create(kube, ns, rljob(job, kafka_bootstrap(cluster_env), queueName=queue["name"], roles=job_roles()))
        wait_for("Workload admitted", lambda: wl_condition(workload(kube, ns, job), "Admitted").get(
            "status") == "True", timeout_s=WAIT_S)
        q = wait_for("RLJob says what it may not read", lambda: (x := queue_status(kube, ns, job)).get(
            "reason") == REASON_FORBIDDEN and x, timeout_s=WAIT_S)
        assert q["status"] == "False" and "resourceflavors" in q["message"]
        assert set(replicas(kube, ns, job).values()) == {0} and pods(kube, ns, job) == []


def test_the_pods_priority_class_is_the_workloads_priority(
        kube: Kube, cluster_namespace: str, cluster_env: dict[str, str], queue: dict[str, str], cluster_call: Call,
        monkeypatch: pytest.MonkeyPatch) -> None:
    ns, bootstrap = cluster_namespace, kafka_bootstrap(cluster_env)
    pc = f"scalerl-test-{uuid.uuid4().hex[:8]}"
    missing, job = unique_job(), unique_job()
    with operator(ns, cluster_env["CLUSTER_KUBECONFIG"], monkeypatch):
        # a class that does not exist: no Workload, the status names it
        create(kube, ns, rljob(missing, bootstrap, queueName=queue["name"], roles=job_roles(),
                               podTemplate={"priorityClassName": pc}))
        q = wait_for("PriorityClassNotFound", lambda: (x := queue_status(kube, ns, missing)).get(
            "reason") == REASON_PRIORITY_NOT_FOUND and x, timeout_s=WAIT_S)
        assert pc in q["message"] and workload(kube, ns, missing) is None
        kube.request("DELETE", path(f"{GROUP}/{VERSION}", "RLJob", ns, missing))
        status, body = cluster_call("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", {
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": pc}, "value": 500})
        assert status == 201, body
        try:
            create(kube, ns, rljob(job, bootstrap, queueName=queue["name"], roles=job_roles(),
                                   podTemplate={"priorityClassName": pc}))
            wl = wait_for("Workload with the class's priority", lambda: workload(kube, ns, job), timeout_s=WAIT_S)
            assert wl["spec"]["priority"] == 500 and wl["spec"]["priorityClassRef"] == {
                "group": "scheduling.k8s.io", "kind": "PriorityClass", "name": pc}
            running = admitted_and_running(kube, ns, job)
            assert {p["spec"].get("priority") for p in running} == {500}  # the pods' own scheduling priority
        finally:
            cluster_call("DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{pc}")
