"""Unit tests of the RLJob → children rendering (operators/scalerl_operator/render/children.py): pure dicts,
checked field by field, against the Kubernetes 1.34 schemas (kubernetes-validate, strict) and with
the owner references kopf.adopt adds."""

from __future__ import annotations

from typing import Any

import kopf
import kubernetes_validate
import pytest

from scalerl.bus.base import TopicNames
from scalerl.config import spec_from_dict
from scalerl_operator.api.infra import GRPC_PORT
from scalerl_operator.api.spec import RLJobSpec, parse_spec
from scalerl_operator.control.reconcile import unrealisable
from scalerl_operator.render.children import (
    JOB_FILE,
    PRESTOP_S,
    SPEC_HASH_ANNOTATION,
    desired_replicas,
    parse_job_yaml,
    render,
)
from scalerl_operator.render.images import ImageDefaults
from scalerl_operator.render.names import partitions, topics

JOB = "j1"
OPERATOR_IMAGES = ImageDefaults("registry.example/scalerl:1.2.3", "Always", ("regcred",))
NS = "team-a"


def make_spec(**over: Any) -> RLJobSpec:
    base: dict[str, Any] = {
        "job": {"train": {"steps": 5, "prompts_per_step": 4}, "off_policy": {"k": 4}},
        "bus": {"bootstrap": "kafka-0.kafka:9092"},
        "store": {"uri": "s3://bucket/runs", "endpoint": "http://minio:9000",
                  "credentialsSecret": {"name": "s3-creds", "accessKeyKey": "ak", "secretKeyKey": "sk"}},
        "telemetry": {"otlpEndpoint": "http://otel:4317", "metricsPort": 9091},
        "roles": {
            "generator": {"replicas": 2, "resources": {"limits": {"nvidia.com/gpu": 1, "memory": "16Gi"}},
                          "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                          "nodeSelector": {"gpu": "a100"}},
            "verifier": {"replicas": 3, "image": "verifier:2"},
            "learner": {"nodes": 2, "devicesPerNode": 4, "resources": {"limits": {"nvidia.com/gpu": 4}}},
        },
    }
    for k, v in over.items():
        base[k] = v
    return parse_spec(base)


def by_kind_name(objs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


@pytest.fixture
def children() -> dict[tuple[str, str], dict[str, Any]]:
    spec = make_spec()
    return by_kind_name(render(JOB, NS, spec, desired_replicas(spec, live={}, remembered={}), OPERATOR_IMAGES))


def test_the_contract_children_and_labels(children: dict[tuple[str, str], dict[str, Any]]) -> None:
    assert set(children) == {("ConfigMap", "j1-spec"), ("Deployment", "j1-generator"), ("Deployment", "j1-verifier"),
                             ("Deployment", "j1-curriculum"), ("StatefulSet", "j1-learner"),
                             ("Service", "j1-learner"), ("Service", "j1-generator"), ("Service", "j1-verifier"),
                             ("Service", "j1-environment"), ("PodDisruptionBudget", "j1-learner")}
    pdb, sts = children[("PodDisruptionBudget", "j1-learner")], children[("StatefulSet", "j1-learner")]
    assert pdb["spec"]["selector"] == sts["spec"]["selector"]  # the learner group, every rank
    assert pdb["spec"]["minAvailable"] == sts["spec"]["replicas"]  # no voluntary eviction of any rank
    assert sts["spec"]["updateStrategy"] == {"type": "OnDelete"}  # the operator recreates the group
    for (kind, name), o in children.items():
        lab = o["metadata"]["labels"]
        assert o["metadata"]["namespace"] == NS
        assert (lab["app.kubernetes.io/name"], lab["app.kubernetes.io/instance"], lab["scalerl.dev/job"]) == \
               ("scalerl", JOB, JOB)
        assert name == f"{JOB}-{lab['app.kubernetes.io/component']}"
        if kind in ("Deployment", "StatefulSet"):  # the selector picks exactly this role's pods
            sel = o["spec"]["selector"]["matchLabels"]
            assert sel.items() <= o["spec"]["template"]["metadata"]["labels"].items()
            assert sel["app.kubernetes.io/component"] == lab["app.kubernetes.io/component"]
        if kind == "Service":  # J-environment: the verifier Pods (they serve the tool calls)
            name = name.replace("environment", "verifier")
            workload = children[("StatefulSet" if name.endswith("learner") else "Deployment", name)]
            assert o["spec"]["selector"] == workload["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize("kind_name", [("ConfigMap", "j1-spec"), ("Deployment", "j1-generator"),
                                       ("Deployment", "j1-verifier"), ("Deployment", "j1-curriculum"),
                                       ("StatefulSet", "j1-learner"), ("Service", "j1-learner"),
                                       ("Service", "j1-generator"), ("Service", "j1-verifier"),
                                       ("Service", "j1-environment")])
def test_every_child_is_a_valid_kubernetes_object(children: dict[tuple[str, str], dict[str, Any]],
                                                  kind_name: tuple[str, str]) -> None:
    kubernetes_validate.validate(children[kind_name], "1.34", strict=True)  # raises on any schema error


def test_configmap_holds_the_full_jobspec(children: dict[tuple[str, str], dict[str, Any]]) -> None:
    tree = parse_job_yaml(children[("ConfigMap", "j1-spec")]["data"]["job.yaml"])
    job = spec_from_dict(tree)  # the roles validate it the same way
    assert job.name == JOB and job.train.steps == 5 and job.off_policy.k == 4
    assert job.runtime.bus == "kafka://kafka-0.kafka:9092" and job.runtime.store == "s3://bucket/runs"
    assert job.runtime.partitions == 8  # max(generator maxReplicas 4, verifier maxReplicas 8, replicas 2, 3)
    assert TopicNames.of(job).prompts == f"{job.runtime.bus_prefix}.prompts" == f"{NS}.{JOB}.prompts"

def test_partitions_and_topics() -> None:
    # bus.partitions 0: max(generator max 4, verifier max 8, replicas 2 and 3) = 8
    assert partitions(make_spec()) == 8
    assert partitions(make_spec(bus={"bootstrap": "k:9092", "partitions": 12})) == 12
    data, single = topics("j1")
    assert data == ["j1.prompts", "j1.rollouts", "j1.scored"] and single == ["j1.policy", "j1.metrics", "j1.dlq"]
    assert sorted(data + single) == sorted(TopicNames("j1").all())  # the roles' names


def test_role_containers(children: dict[tuple[str, str], dict[str, Any]]) -> None:
    gen = children[("Deployment", "j1-generator")]["spec"]
    pod = gen["template"]["spec"]
    c = pod["containers"][0]
    assert c["command"] == ["tini", "-g", "--", "scalerl"]  # tini is PID 1: SIGTERM reaches the role at once
    assert c["args"] == ["serve", "generator", "--job", JOB_FILE, "--bus", "kafka://kafka-0.kafka:9092",
                         "--store", "s3://bucket/runs", "--id", "$(POD_NAME)", "--grpc-port", str(GRPC_PORT),
                         "--http-port", "9091"]
    assert c["resources"] == {"limits": {"nvidia.com/gpu": 1, "memory": "16Gi"}}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["nodeSelector"] == {"gpu": "a100"}
    # ready only when /readyz says so (a generator: once the current policy is loaded); the side port is HTTPS
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics", "scheme": "HTTPS"}
    assert {c[p]["httpGet"]["scheme"] for p in ("startupProbe", "livenessProbe")} == {"HTTPS"}
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"grpc": GRPC_PORT, "metrics": 9091}
    # drain: endpoints drop the pod during preStop, then SIGTERM; the grace covers both
    assert c["lifecycle"]["preStop"] == {"sleep": {"seconds": PRESTOP_S}}
    assert pod["terminationGracePeriodSeconds"] > PRESTOP_S + 60
    assert gen["replicas"] == 2 and gen["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    env = {e["name"]: e for e in c["env"]}
    assert env["S3_ACCESS_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "s3-creds", "key": "ak"}}
    assert env["S3_SECRET_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "s3-creds", "key": "sk"}}
    assert env["S3_ENDPOINT"]["value"] == "http://minio:9000"
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"] == "http://otel:4317"
    ver = children[("Deployment", "j1-verifier")]["spec"]["template"]["spec"]["containers"][0]
    # the role's image, else spec.image (unset here), else the operator's default; its pull policy and secrets
    assert ver["image"] == "verifier:2" and c["image"] == "registry.example/scalerl:1.2.3"
    assert c["imagePullPolicy"] == "Always" and pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert children[("Deployment", "j1-curriculum")]["spec"]["strategy"] == {"type": "Recreate"}
    assert children[("Deployment", "j1-curriculum")]["spec"]["replicas"] == 1


def test_learner_statefulset_runs_torchrun_across_pods(children: dict[tuple[str, str], dict[str, Any]]) -> None:
    sts = children[("StatefulSet", "j1-learner")]["spec"]
    svc = children[("Service", "j1-learner")]["spec"]
    c = sts["template"]["spec"]["containers"][0]
    cmd = c["command"]
    assert cmd[:5] == ["tini", "-g", "--", "torchrun", "--nnodes"] and cmd[cmd.index("--nnodes") + 1] == "2"
    assert cmd[cmd.index("--nproc_per_node") + 1] == "4" and cmd[cmd.index("--node_rank") + 1] == "$(NODE_RANK)"
    assert "--standalone" not in cmd
    # rank 0's pod FQDN: <statefulset>-0.<headless service>.<namespace>.svc (resolves from every pod)
    assert cmd[cmd.index("--master_addr") + 1] == f"j1-learner-0.{sts['serviceName']}.{NS}.svc"
    assert sts["serviceName"] == "j1-learner" and svc["clusterIP"] == "None" and svc["publishNotReadyAddresses"]
    assert children[("Service", "j1-learner")]["metadata"]["namespace"] == NS
    assert {"name": "torch", "port": 29500, "targetPort": "torch", "protocol": "TCP"} in svc["ports"]
    assert cmd[cmd.index("-m") + 1:cmd.index("-m") + 4] == ["scalerl.cli", "serve", "learner"]
    # after its last step the learner stays up until scaled down (no exit into a StatefulSet restart)
    assert cmd[-2:] == ["--when-finished", "wait"]
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['apps.kubernetes.io/pod-index']"
    assert sts["replicas"] == 2 and sts["podManagementPolicy"] == "Parallel"
    assert c["resources"] == {"limits": {"nvidia.com/gpu": 4}}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]


def test_a_one_node_learner_runs_torchrun_standalone() -> None:
    spec = make_spec(roles={"learner": {"nodes": 1, "devicesPerNode": 2}})
    objs = by_kind_name(render(JOB, NS, spec, desired_replicas(spec, live={}, remembered={})))
    cmd = objs[("StatefulSet", "j1-learner")]["spec"]["template"]["spec"]["containers"][0]["command"]
    # a local rendezvous: no master address to resolve, so no cluster DNS is needed
    assert cmd[:7] == ["tini", "-g", "--", "torchrun", "--standalone", "--nnodes", "1"]
    assert not {"--master_addr", "--master_port", "--node_rank", "--rdzv_endpoint"} & set(cmd)
    assert cmd[cmd.index("--nproc_per_node") + 1] == "2"
    assert cmd[cmd.index("-m") + 1:cmd.index("-m") + 4] == ["scalerl.cli", "serve", "learner"]


def test_every_rendered_container_runs_under_tini(children: dict[tuple[str, str], dict[str, Any]]) -> None:
    pods = [o["spec"]["template"]["spec"] for o in children.values() if o["kind"] in ("Deployment", "StatefulSet")]
    assert len(pods) == 4
    for pod in pods:
        for c in pod["containers"] + pod.get("initContainers", []):
            assert c["command"][:3] == ["tini", "-g", "--"], c["name"]


def test_spec_hash_rolls_pods_only_when_the_job_changes() -> None:
    def pod_hash(spec: RLJobSpec) -> str:
        objs = by_kind_name(render(JOB, NS, spec, desired_replicas(spec, live={}, remembered={})))
        return str(objs[("Deployment", "j1-verifier")]["spec"]["template"]["metadata"]["annotations"]
                   [SPEC_HASH_ANNOTATION])

    base = make_spec()
    assert pod_hash(base) == pod_hash(make_spec())
    assert pod_hash(autoscaled(replicas=3)) == pod_hash(autoscaled(replicas=5))  # replicas are not in job.yaml
    changed = make_spec(job={"train": {"steps": 6, "prompts_per_step": 4}, "off_policy": {"k": 4}})
    assert pod_hash(changed) != pod_hash(base)


def autoscaled(enabled: bool = True, replicas: int = 3, lo: int = 2, hi: int = 6, suspend: bool = False) -> RLJobSpec:
    roles = {"verifier": {"replicas": replicas, "autoscaling": {"enabled": enabled, "minReplicas": lo,
                                                                 "maxReplicas": hi}}}
    return make_spec(roles=roles, suspend=suspend)


@pytest.mark.parametrize(("spec", "live", "remembered", "want"), [
    (autoscaled(enabled=False), 5, None, 3),      # no autoscaling: spec replicas, whatever runs
    (autoscaled(), None, None, 3),                # new pool: spec replicas within [2, 6]
    (autoscaled(replicas=9), None, None, 6),      # clamped to maxReplicas
    (autoscaled(), 5, None, 5),                   # the autoscaler's size is kept
    (autoscaled(), 8, None, 6),                   # ... clamped if the bounds shrank
    (autoscaled(), 0, 4, 4),                      # resume: the last autoscaler size (status.scaling)
    (autoscaled(), 0, None, 3),                   # resume with no history: spec replicas
    (autoscaled(suspend=True), 5, 4, 0),          # suspended: zero
])
def test_desired_replicas(spec: RLJobSpec, live: int | None, remembered: int | None, want: int) -> None:
    got = desired_replicas(spec, live={"verifier": live}, remembered={"verifier": remembered})
    assert got["verifier"] == want
    assert got["learner"] == (0 if spec.suspend else 1) and got["curriculum"] == (0 if spec.suspend else 1)


def test_owner_references_from_kopf_adopt() -> None:
    spec = make_spec()
    objs = render(JOB, NS, spec, desired_replicas(spec, live={}, remembered={}))
    owner = {"apiVersion": "scalerl.dev/v1alpha1", "kind": "RLJob",
             "metadata": {"name": JOB, "namespace": NS, "uid": "1234-uid", "labels": {"team": "a"}}}
    kopf.adopt(objs, owner=owner)  # type: ignore[arg-type]
    for o in objs:
        assert o["metadata"]["ownerReferences"] == [{"apiVersion": "scalerl.dev/v1alpha1", "kind": "RLJob",
                                                     "name": JOB, "uid": "1234-uid", "controller": True,
                                                     "blockOwnerDeletion": True}]
        assert o["metadata"]["labels"]["team"] == "a"  # the owner's labels are carried over


@pytest.mark.parametrize(("over", "field"), [
    ({"job": {"off_policy": {"mode": "ppo"}}}, "spec.job.off_policy.mode"),
    ({"roles": {"learner": {"devicesPerNode": 4, "resources": {"limits": {"nvidia.com/gpu": 2}}}}},
     "spec.roles.learner.devicesPerNode"),
    ({"job": {"generation": {"engine": "vllm"}}, "roles": {}}, "spec.roles.generator.resources.limits"),
])
def test_unrealisable_specs_name_the_field(over: dict[str, Any], field: str) -> None:
    assert unrealisable(make_spec()) is None
    problem = unrealisable(make_spec(**over))
    assert problem is not None and problem.startswith(f"{field}:")


def test_spec_weight_sync_reaches_the_roles_job_yaml_and_bad_values_are_refused_by_name() -> None:
    spec = make_spec(weightSync={"dtype": "bfloat16", "snapshotEvery": 3, "shardMb": 16})
    cm = by_kind_name(render(JOB, NS, spec, desired_replicas(spec, live={}, remembered={})))[("ConfigMap", "j1-spec")]
    ws = spec_from_dict(parse_job_yaml(cm["data"]["job.yaml"])).runtime.weight_sync
    assert (ws.dtype, ws.snapshot_every, ws.shard_mb, ws.delta, ws.parallel) == ("bfloat16", 3, 16, True, 4)
    with pytest.raises(Exception, match=r"spec\.weightSync\.snapshotEvery"):
        make_spec(weightSync={"snapshotEvery": 0})
    with pytest.raises(Exception, match=r"spec\.job\.runtime|runtime: not allowed"):
        make_spec(job={"runtime": {"weight_sync": {"dtype": "bfloat16"}}})


def test_a_job_with_tools_sends_its_calls_to_the_verifiers_through_a_headless_service() -> None:
    spec = make_spec(job={"train": {"steps": 5, "prompts_per_step": 4}, "environment": {"tools": ["python"]}})
    objs = by_kind_name(render(JOB, NS, spec, desired_replicas(spec, live={}, remembered={})))
    env = spec_from_dict(parse_job_yaml(objs[("ConfigMap", "j1-spec")]["data"]["job.yaml"])).environment
    assert env.service == f"dns:///j1-environment.{NS}.svc:{GRPC_PORT}"
    svc = objs[("Service", "j1-environment")]["spec"]
    assert svc["clusterIP"] == "None" and "publishNotReadyAddresses" not in svc  # one record per Ready verifier
    assert svc["selector"] == objs[("Deployment", "j1-verifier")]["spec"]["selector"]["matchLabels"]
    assert svc["ports"] == [{"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc", "protocol": "TCP"}]
    own = make_spec(job={"environment": {"tools": ["python"], "service": "env.tools.svc:7000"}})
    cm = by_kind_name(render(JOB, NS, own, desired_replicas(own, live={}, remembered={})))[("ConfigMap", "j1-spec")]
    assert spec_from_dict(parse_job_yaml(cm["data"]["job.yaml"])).environment.service == "env.tools.svc:7000"
    none = make_spec()
    cm = by_kind_name(render(JOB, NS, none, desired_replicas(none, live={}, remembered={})))[("ConfigMap", "j1-spec")]
    assert spec_from_dict(parse_job_yaml(cm["data"]["job.yaml"])).environment.service == ""


def test_weight_broadcast_points_the_generators_at_learner_rank_0_and_a_taken_port_is_refused() -> None:
    spec = make_spec(weightSync={"broadcast": {"enabled": True, "port": 29700, "timeoutS": 12}})
    objs = by_kind_name(render(JOB, NS, spec, desired_replicas(spec, live={}, remembered={})))
    ws = spec_from_dict(parse_job_yaml(objs[("ConfigMap", "j1-spec")]["data"]["job.yaml"])).runtime.weight_sync
    b = ws.broadcast
    assert (b.enabled, b.address, b.port, b.timeout_s, b.generators) == (True, f"j1-learner-0.j1-learner.{NS}.svc",
                                                                          29700, 12.0, 0)
    learner = objs[("StatefulSet", "j1-learner")]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "weights", "containerPort": 29700, "protocol": "TCP"} in learner["ports"]
    off = by_kind_name(render(JOB, NS, make_spec(), desired_replicas(make_spec(), live={}, remembered={})))
    assert "weights" not in {p["name"] for p in off[("StatefulSet", "j1-learner")]["spec"]["template"]["spec"]
                             ["containers"][0]["ports"]}
    for taken in (GRPC_PORT, 29500, 9091):  # gRPC, torchrun's rendezvous, this spec's metrics port
        with pytest.raises(Exception, match=rf"weightSync\.broadcast\.port: {taken} is"):
            make_spec(weightSync={"broadcast": {"enabled": True, "port": taken}})
