"""Pod-template overrides against the real kube-apiserver: the CRD accepts a full override and refuses
bad ones naming the field (as the pydantic model does); the children rendered with an override pass a
strict server-side dry run and are stored as rendered; a volume the API server refuses fails the
RLJob (ChildApplyFailed) with the field named."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from operator_helpers import OPERATOR_IMAGE, QUIET_KAFKA, kafka_bootstrap, unique_job

from scalerl.config import SpecError
from scalerl_operator.api import conditions as cond
from scalerl_operator.api.spec import GROUP, PLURAL, VERSION, parse_rljob, parse_spec
from scalerl_operator.cluster.kube import Kube, load_client
from scalerl_operator.cluster.kube import path as kube_path
from scalerl_operator.cluster.rlstatus import LearnerStatus
from scalerl_operator.control.reconcile import reconcile
from scalerl_operator.control.runtime import OperatorConfig, Runtime
from scalerl_operator.render.children import desired_replicas, render
from scalerl_operator.render.images import ImageDefaults

pytestmark = [pytest.mark.infra, *QUIET_KAFKA]
Call = Callable[..., tuple[int, Any]]

OVERRIDE: dict[str, Any] = {
    "labels": {"team": "rl"},
    "annotations": {"example.com/owner": "rl-team"},
    "serviceAccountName": "scalerl-runner",
    "imagePullSecrets": [{"name": "team-pull"}],
    "priorityClassName": "batch-low",
    "schedulerName": "volcano",
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["rl"]}]}]}}},
    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                   "whenUnsatisfiable": "ScheduleAnyway",
                                   "labelSelector": {"matchLabels": {"team": "rl"}}}],
    "env": [{"name": "HF_HOME", "value": "/models/hf"},
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
    "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}],
    "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True}],
}
LEARNER = {"runtimeClassName": "nvidia", "priorityClassName": "training-high",
           "env": [{"name": "NCCL_DEBUG", "value": "WARN"}],
           "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "100Gi"}}],
           "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}


def rljob(name: str, bootstrap: str = "kafka:9092", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "job": {"train": {"steps": 20, "prompts_per_step": 4}, "off_policy": {"k": 4}},
        "bus": {"bootstrap": bootstrap, "partitions": 2},
        "store": {"uri": f"s3://scalerl-tests/{name}", "endpoint": "http://minio.invalid:9000",
                  "credentialsSecret": {"name": "s3-creds"}},
    }
    body.update(spec)
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "RLJob", "metadata": {"name": name}, "spec": body}


def _path(ns: str, name: str = "") -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}" + (f"/{name}" if name else "")


@pytest.fixture
def create(k8s_call: Call, namespace: str, rljob_crd: dict[str, Any]) -> Call:
    def create(obj: dict[str, Any]) -> tuple[int, Any]:
        return k8s_call("POST", _path(namespace), obj, query={"fieldValidation": "Strict"})
    return create


def test_a_full_override_is_accepted_and_its_children_pass_a_strict_dry_run(
        k8s_call: Call, create: Call, namespace: str) -> None:
    status, stored = create(rljob("pods", podTemplate=OVERRIDE, roles={"learner": {"podTemplate": LEARNER}}))
    assert status == 201, stored
    assert stored["spec"]["podTemplate"] == OVERRIDE  # kept as given: nothing pruned, nothing defaulted in
    spec = parse_rljob(stored).spec  # what the operator reads back
    images = ImageDefaults(OPERATOR_IMAGE, "IfNotPresent", ("chart-pull",))
    for child in render("pods", namespace, spec, desired_replicas(spec, live={}, remembered={}), images):
        path = kube_path(child["apiVersion"], child["kind"], namespace, child["metadata"]["name"])
        query = {"fieldManager": "scalerl-operator", "fieldValidation": "Strict", "force": "true"}
        status, dry = k8s_call("PATCH", path, child, content_type="application/apply-patch+yaml",
                               query={**query, "dryRun": "All"})
        assert status in (200, 201), f"{child['kind']}/{child['metadata']['name']}: {dry}"
        if child["kind"] == "StatefulSet":  # applied for real: stored as rendered
            status, sts = k8s_call("PATCH", path, child, content_type="application/apply-patch+yaml", query=query)
            assert status in (200, 201), sts
            pod = sts["spec"]["template"]["spec"]
            assert (pod["runtimeClassName"], pod["priorityClassName"], pod["schedulerName"],
                    pod["serviceAccountName"]) == ("nvidia", "training-high", "volcano", "scalerl-runner")
            assert pod["imagePullSecrets"] == [{"name": "chart-pull"}, {"name": "team-pull"}]
            assert pod["affinity"] == OVERRIDE["affinity"]
            assert [v["name"] for v in pod["volumes"]][-2:] == ["models", "scratch"]
            c = pod["containers"][0]
            assert c["image"] == OPERATOR_IMAGE
            assert [e["name"] for e in c["env"]][-3:] == ["HF_HOME", "HF_TOKEN", "NCCL_DEBUG"]
            assert {m["mountPath"] for m in c["volumeMounts"]} >= {"/models", "/scratch"}
            assert sts["spec"]["template"]["metadata"]["labels"]["team"] == "rl"
            assert sts["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == "learner"


BAD = [
    ("operator env", {"env": [{"name": "POD_NAME", "value": "x"}]}, ["podTemplate.env", "POD_NAME"]),
    ("operator label", {"labels": {"app.kubernetes.io/instance": "x"}}, ["podTemplate.labels", "set by the operator"]),
    ("scalerl label", {"labels": {"scalerl.dev/job": "other"}}, ["podTemplate.labels", "scalerl.dev/*"]),
    ("operator annotation", {"annotations": {"scalerl.dev/spec-hash": "0"}}, ["podTemplate.annotations"]),
    ("operator volume", {"volumes": [{"name": "work", "emptyDir": {}}]}, ["podTemplate.volumes", "work"]),
    ("operator mount path", {"volumeMounts": [{"name": "m", "mountPath": "/tmp"}]}, ["podTemplate.volumeMounts"]),
    ("env value and valueFrom", {"env": [{"name": "A", "value": "1", "valueFrom": {
        "fieldRef": {"fieldPath": "metadata.name"}}}]}, ["podTemplate.env", "exclusive"]),
    ("env valueFrom two sources", {"env": [{"name": "A", "valueFrom": {
        "fieldRef": {"fieldPath": "metadata.name"}, "secretKeyRef": {"name": "s", "key": "k"}}}]},
     ["podTemplate.env", "exactly one"]),
    ("duplicate env", {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]},
     ["podTemplate.env[1]", "Duplicate value"]),
    ("bad spread enum", {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone",
                                                        "whenUnsatisfiable": "Maybe"}]},
     ["podTemplate.topologySpreadConstraints[0].whenUnsatisfiable", "Unsupported value"]),
    ("bad service account", {"serviceAccountName": "Not_A_Name"}, ["podTemplate.serviceAccountName"]),
    ("not in the subset", {"containers": [{"name": "x"}]}, ['unknown field', "podTemplate.containers"]),
    ("unknown affinity kind", {"affinity": {"nodeAffinty": {}}}, ['unknown field', "podTemplate.affinity.nodeAffinty"]),
]


@pytest.mark.parametrize(("case", "override", "fragments"), BAD, ids=[b[0] for b in BAD])
@pytest.mark.parametrize("where", ["job-wide", "learner"])
def test_bad_overrides_are_refused_by_the_api_server_and_the_operator(
        create: Call, case: str, override: dict[str, Any], fragments: list[str], where: str) -> None:
    spec: dict[str, Any] = ({"podTemplate": copy.deepcopy(override)} if where == "job-wide"
                            else {"roles": {"learner": {"podTemplate": copy.deepcopy(override)}}})
    obj = rljob("bad", **spec)
    status, body = create(obj)
    assert status in (400, 422), f"{case}: accepted: {body}"
    prefix = "spec." if where == "job-wide" else "spec.roles.learner."
    for fragment in fragments:
        want = prefix + fragment if fragment.startswith("podTemplate") else fragment
        assert want in body["message"], f"{want!r} not in {body['message']!r}"
    with pytest.raises(SpecError) as err:
        parse_spec(obj["spec"])
    assert str(err.value).startswith(f"{prefix}podTemplate"), str(err.value)


def test_a_volume_the_api_server_refuses_fails_the_job_naming_it(
        k8s_env: dict[str, str], create: Call, namespace: str) -> None:
    boot = kafka_bootstrap(k8s_env)
    name = unique_job()
    # schema-valid (a volume's source is the Kubernetes type, kept as given) but two sources in one volume
    volume = {"name": "two", "emptyDir": {}, "configMap": {"name": "cm"}}
    status, stored = create(rljob(name, boot, podTemplate={"volumes": [volume]}))
    assert status == 201, stored
    kube = Kube(load_client(k8s_env["KUBECONFIG"]))
    runtime = Runtime(kube=kube, config=OperatorConfig(kafka_timeout_s=10.0))
    out = reconcile(kube, stored, learner=LearnerStatus(), ensure_topics=runtime.ensure_topics)
    assert out.phase == cond.PHASE_FAILED and out.error is not None
    # the first workload applied is the curriculum's: volumes job-spec, work, tmp, rpc-tls, then the override's
    assert "spec.template.spec.volumes[4]" in out.error, out.error
    assert "may not specify more than 1 volume type" in out.error, out.error
    job = kube.get(f"{GROUP}/{VERSION}", "RLJob", namespace, name)
    assert job is not None
    failed = cond.get_condition(job["status"]["conditions"], cond.FAILED)
    assert failed is not None and failed["reason"] == cond.REASON_CHILD_APPLY_FAILED


def test_no_image_anywhere_fails_the_job_naming_spec_image(
        k8s_env: dict[str, str], create: Call, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SCALERL_DEFAULT_IMAGE")  # an operator started without the chart's image
    name = unique_job()
    status, stored = create(rljob(name))
    assert status == 201, stored
    kube = Kube(load_client(k8s_env["KUBECONFIG"]))
    out = reconcile(kube, stored, learner=LearnerStatus(), ensure_topics=Runtime(
        kube=kube, config=OperatorConfig()).ensure_topics)
    assert out.phase == cond.PHASE_FAILED and out.error is not None and out.error.startswith("spec.image: no image")
    assert kube.get("apps/v1", "StatefulSet", namespace, f"{name}-learner") is None  # nothing was applied
    job = kube.get(f"{GROUP}/{VERSION}", "RLJob", namespace, name)
    failed = cond.get_condition((job or {})["status"]["conditions"], cond.FAILED)
    assert failed is not None and failed["reason"] == cond.REASON_INVALID_SPEC
