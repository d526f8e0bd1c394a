"""The names an RLJob's children are found by: object names (`J-<role>`, `J-spec`), labels and the
immutable workload selectors, the Kafka topics and their partitions, and the prefix of the job's topics
and consumer groups. The reconciler, the autoscaler and Kueue's Workload all key on these.
"""

from __future__ import annotations

from scalerl_operator.api.spec import RLJobSpec

ROLES = ("generator", "verifier", "curriculum", "learner")
# the roles' topics `<job>.<kind>` (scalerl.bus.base.TOPIC_KINDS; a unit test keeps the two equal):
DATA_TOPIC_KINDS = ("prompts", "rollouts", "scored")  # partitioned by prompt id
SINGLE_TOPIC_KINDS = ("policy", "metrics", "dlq")  # one partition: the policy announcements stay in order
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # on the job's Workload (scalerl_operator.control.kueue)


RPC_TLS_MOUNT = "/var/run/scalerl/rpc"  # a role's certificate Secret in its Pods (SCALERL_RPC_TLS_DIR)
SCRAPE_TOKEN_FILE_ENV = "SCALERL_SCRAPE_TOKEN_FILE"  # the operator's: the chart's scrape token (control.rpc_tls)
RPC_CLIENT = "client"  # the identity of the user's own calls, allowed by every role (SCALERL_RPC_CLIENTS)


def rpc_secret(job: str, identity: str) -> str:
    """`<job>-rpc-<identity>`: the certificate Secret of a role or of `client`; `<job>-rpc-ca` the job's CA
    (scalerl_operator.control.rpc_tls)."""
    return f"{job}-rpc-{identity}"


def child_name(job: str, role: str) -> str:
    return f"{job}-spec" if role == "spec" else f"{job}-{role}"


def labels(job: str, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "scalerl", "app.kubernetes.io/instance": job,
            "app.kubernetes.io/component": component, "app.kubernetes.io/managed-by": "scalerl-operator",
            "scalerl.dev/job": job}


def selector(job: str, role: str) -> dict[str, str]:
    """Immutable Deployment/StatefulSet selectors: the smallest label set that names the pods."""
    return {"app.kubernetes.io/instance": job, "app.kubernetes.io/component": role}


def partitions(spec: RLJobSpec) -> int:
    """Partitions of the data topics: spec.bus.partitions, or (0) enough for the largest pool that
    can share a topic: max(generator, verifier) over maxReplicas and replicas."""
    if spec.bus.partitions > 0:
        return spec.bus.partitions
    g, v = spec.roles.generator, spec.roles.verifier
    return max(g.autoscaling.max_replicas, v.autoscaling.max_replicas, g.replicas, v.replicas, 1)


def topics(job: str) -> tuple[list[str], list[str]]:
    """(data topics, single-partition topics) of a job, as the roles name them."""
    return [f"{job}.{k}" for k in DATA_TOPIC_KINDS], [f"{job}.{k}" for k in SINGLE_TOPIC_KINDS]


def bus_prefix(name: str, namespace: str) -> str:
    """The prefix of an RLJob's topics and consumer groups: `<namespace>.<name>` (one Kafka cluster can
    serve RLJobs of the same name in different namespaces)."""
    return f"{namespace}.{name}"
