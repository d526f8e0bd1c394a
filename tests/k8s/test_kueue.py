"""The operator's side of Kueue against the REAL kube-apiserver (no Kueue runs here): spec.queueName puts the
`kueue.x-k8s.io/queue-name` label on every workload and pod template; an RLJob created suspended (as Kueue
wants a job before admission) gets its objects with zero replicas and no learner group; unsuspending it
(what Kueue does on admission) brings every role up; suspending it again (preemption) takes them to 0."""

from __future__ import annotations

import pytest
from operator_helpers import (
    QUIET_KAFKA,
    children,
    condition,
    create,
    get_job,
    operator,
    patch_spec,
    replicas,
    rljob,
    unique_job,
    wait_for,
)

from scalerl_operator import conditions as c
from scalerl_operator.kube import Kube, KubeError
from scalerl_operator.render import QUEUE_LABEL

pytestmark = [*QUIET_KAFKA, pytest.mark.infra]


def test_queue_label_and_the_suspend_handshake(kube: Kube, namespace: str, bootstrap: str, k8s_env: dict[str, str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    name = unique_job()
    roles = {"learner": {"nodes": 2}, "generator": {"replicas": 1, "autoscaling": {
        "enabled": True, "minReplicas": 2, "maxReplicas": 4}}, "verifier": {"replicas": 1}}
    with operator(namespace, k8s_env["KUBECONFIG"], monkeypatch):
        create(kube, namespace, rljob(name, bootstrap, queueName="team-a-gpu", suspend=True, roles=roles))
        wait_for("children", lambda: len(children(kube, namespace, name)) == 8, timeout_s=60)
        # queued: the objects exist, no role has a replica (no pod to admit or to hold GPUs yet)
        assert replicas(kube, namespace, name) == {"generator": 0, "verifier": 0, "curriculum": 0, "learner": 0}
        j = wait_for("Suspended", lambda: (j := get_job(kube, namespace, name)) and
                     j["status"].get("phase") == c.PHASE_SUSPENDED and j, timeout_s=30)
        assert condition(j, c.SUSPENDED) == ("True", c.REASON_SUSPENDED)
        assert "queue team-a-gpu" in next(x["message"] for x in j["status"]["conditions"] if x["type"] == c.SUSPENDED)
        for key, o in children(kube, namespace, name).items():
            if key.startswith(("Deployment/", "StatefulSet/")):
                assert o["metadata"]["labels"][QUEUE_LABEL] == "team-a-gpu", key
                assert o["spec"]["template"]["metadata"]["labels"][QUEUE_LABEL] == "team-a-gpu", key
            else:
                assert QUEUE_LABEL not in o["metadata"]["labels"], key
        # admitted: Kueue sets suspend false; the learner group and the minimum generators come up
        patch_spec(kube, namespace, name, {"suspend": False})
        wait_for("admitted sizes", lambda: replicas(kube, namespace, name) == {
            "generator": 2, "verifier": 1, "curriculum": 1, "learner": 2}, timeout_s=30)
        wait_for("Suspended=False", lambda: condition(get_job(kube, namespace, name), c.SUSPENDED) ==
                 ("False", c.REASON_RESUMED), timeout_s=30)
        # preempted: Kueue suspends again; every role back to 0
        patch_spec(kube, namespace, name, {"suspend": True})
        wait_for("preempted: all 0", lambda: set(replicas(kube, namespace, name).values()) == {0}, timeout_s=30)


def test_the_crd_refuses_a_bad_queue_name(kube: Kube, namespace: str) -> None:
    with pytest.raises(KubeError) as exc:
        create(kube, namespace, rljob(unique_job(), "127.0.0.1:9", queueName="Team_A"))
    assert exc.value.status == 422 and "queueName" in exc.value.message
