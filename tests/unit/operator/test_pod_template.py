"""Pod-template overrides (scalerl_operator.api.podtemplate), the operator's image defaults and the spec
hash (scalerl_operator.render): pure rendering, checked field by field and against the Kubernetes 1.34
schemas (kubernetes-validate, strict)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from pydantic import Field

from scalerl.config import JobSpec, SpecError, TrainConfig
from scalerl_operator.api import podtemplate as pt
from scalerl_operator.api.spec import RLJobSpec, parse_spec
from scalerl_operator.render.children import SPEC_HASH_ANNOTATION, desired_replicas, full_job_spec, render, spec_hash
from scalerl_operator.render.images import (
    IMAGE_DEFAULTS_ANNOTATION,
    ImageDefaults,
    image_defaults,
    image_problem,
    pinned_image_defaults,
)

REPO = Path(__file__).resolve().parents[3]
BASE: dict[str, Any] = {
    "job": {"train": {"steps": 5, "prompts_per_step": 4}, "off_policy": {"k": 4}},
    "bus": {"bootstrap": "kafka:9092"},
    "store": {"uri": "s3://bucket/runs", "endpoint": "http://minio:9000", "credentialsSecret": {"name": "s3"}},
    "telemetry": {"otlpEndpoint": "http://otel:4317"},
}
JOB_WIDE: dict[str, Any] = {
    "labels": {"team": "rl", "cost-center": "42"},
    "annotations": {"example.com/owner": "rl-team"},
    "serviceAccountName": "scalerl-runner",
    "imagePullSecrets": [{"name": "team-pull"}],
    "priorityClassName": "batch-low",
    "schedulerName": "volcano",
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["rl"]}]}]}}},
    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                   "whenUnsatisfiable": "ScheduleAnyway",
                                   "labelSelector": {"matchLabels": {"scalerl.dev/job": "j1"}}}],
    "env": [{"name": "HF_HOME", "value": "/models/hf"}, {"name": "LOG_FORMAT", "value": "json"}],
    "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}],
    "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True}],
}
LEARNER: dict[str, Any] = {
    "labels": {"team": "rl-learner"},
    "priorityClassName": "training-high",
    "runtimeClassName": "nvidia",
    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "labelSelector": {
            "matchLabels": {"app.kubernetes.io/component": "learner"}}}}]}},
    "env": [{"name": "LOG_FORMAT", "value": "text"},
            {"name": "NCCL_SOCKET_IFNAME", "valueFrom": {"configMapKeyRef": {"name": "nccl", "key": "ifname"}}}],
    "volumes": [{"name": "ckpt-cache", "emptyDir": {"sizeLimit": "100Gi"}}],
    "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": False},
                     {"name": "ckpt-cache", "mountPath": "/home/scalerl/.cache/ckpt"}],
}


def spec_with(job_wide: dict[str, Any] | None = None, **roles: dict[str, Any]) -> RLJobSpec:
    tree: dict[str, Any] = {**BASE, "roles": {r: {"podTemplate": t} for r, t in roles.items()}}
    if job_wide is not None:
        tree["podTemplate"] = job_wide
    return parse_spec(tree)


def pods(spec: RLJobSpec, images: ImageDefaults | None = None) -> dict[str, dict[str, Any]]:
    objs = render("j1", "ns", spec, desired_replicas(spec, live={}, remembered={}), images)
    return {o["metadata"]["labels"]["app.kubernetes.io/component"]: o for o in objs
            if o["kind"] in ("Deployment", "StatefulSet")}


def test_merge_job_wide_then_role_by_merge_key() -> None:
    spec = spec_with(JOB_WIDE, learner=LEARNER)
    merged = spec.pod_template_of("learner", ("chart-pull",))
    assert merged["labels"] == {"team": "rl-learner", "cost-center": "42"}  # key by key, the role wins
    assert merged["priorityClassName"] == "training-high" and merged["runtimeClassName"] == "nvidia"
    assert merged["serviceAccountName"] == "scalerl-runner" and merged["schedulerName"] == "volcano"
    # the operator's pull secrets first, then the job-wide ones (merged by name)
    assert merged["imagePullSecrets"] == [{"name": "chart-pull"}, {"name": "team-pull"}]
    # env by name: the role's LOG_FORMAT replaces the job-wide one in its place; new names are appended
    assert merged["env"] == [{"name": "HF_HOME", "value": "/models/hf"}, {"name": "LOG_FORMAT", "value": "text"},
                             LEARNER["env"][1]]
    assert [v["name"] for v in merged["volumes"]] == ["models", "ckpt-cache"]
    assert merged["volumeMounts"] == LEARNER["volumeMounts"]  # by mountPath: /models replaced in place
    assert set(merged["affinity"]) == {"nodeAffinity", "podAntiAffinity"}  # per kind
    # a role without an override gets the job-wide one as is
    gen = spec.pod_template_of("generator")
    assert gen["labels"] == JOB_WIDE["labels"] and gen["env"] == JOB_WIDE["env"]
    assert "runtimeClassName" not in gen and set(gen["affinity"]) == {"nodeAffinity"}
    # nothing set: nothing rendered
    assert spec_with().pod_template_of("verifier") == {}


def test_every_pod_template_carries_the_override_and_keeps_the_operators_parts() -> None:
    spec = spec_with(JOB_WIDE, learner=LEARNER)
    plain = pods(spec_with())
    for role, obj in pods(spec, ImageDefaults("reg/scalerl:1", pull_secrets=("chart-pull",))).items():
        kubernetes_validate.validate(obj, "1.34", strict=True)
        want = spec.pod_template_of(role, ("chart-pull",))
        tmpl, base = obj["spec"]["template"], plain[role]["spec"]["template"]
        pod, c, base_c = tmpl["spec"], tmpl["spec"]["containers"][0], base["spec"]["containers"][0]
        assert tmpl["metadata"]["labels"] == {**want["labels"], **base["metadata"]["labels"]}
        assert tmpl["metadata"]["annotations"] == {**want["annotations"], **base["metadata"]["annotations"]}
        for key in ("serviceAccountName", "imagePullSecrets", "affinity", "topologySpreadConstraints",
                    "priorityClassName", "runtimeClassName", "schedulerName"):
            assert pod.get(key) == want.get(key), f"{role}: {key}"
        # the operator's env, volumes and mounts first and unchanged, the override's after them
        assert c["env"] == base_c["env"] + want["env"]
        assert c["volumeMounts"] == base_c["volumeMounts"] + want["volumeMounts"]
        assert pod["volumes"] == base["spec"]["volumes"] + want["volumes"]
        assert {k: v for k, v in c.items() if k not in ("env", "volumeMounts", "image")} == \
            {k: v for k, v in base_c.items() if k not in ("env", "volumeMounts", "image")}
    assert pods(spec)["learner"]["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"


@pytest.mark.parametrize(("override", "field", "fragment"), [
    ({"labels": {"app.kubernetes.io/component": "x"}}, "spec.podTemplate.labels", "set by the operator"),
    ({"labels": {"scalerl.dev/job": "other"}}, "spec.podTemplate.labels", "scalerl.dev/"),
    ({"annotations": {"scalerl.dev/spec-hash": "0"}}, "spec.podTemplate.annotations", "set by the operator"),
    ({"annotations": {"prometheus.io/port": "1"}}, "spec.podTemplate.annotations", "prometheus.io/port"),
    ({"env": [{"name": "S3_ENDPOINT", "value": "x"}]}, "spec.podTemplate.env", "S3_ENDPOINT"),
    ({"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}, "spec.podTemplate.env", "duplicate"),
    ({"env": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]},
     "spec.podTemplate.env.0", "exclusive"),
    ({"env": [{"name": "A", "valueFrom": {}}]}, "spec.podTemplate.env.0.valueFrom", "exactly one"),
    ({"volumes": [{"name": "tmp", "emptyDir": {}}]}, "spec.podTemplate.volumes", "tmp"),
    ({"volumeMounts": [{"name": "x", "mountPath": "/etc/scalerl"}]}, "spec.podTemplate.volumeMounts",
     "/etc/scalerl"),
    ({"volumeMounts": [{"name": "nope", "mountPath": "/data"}]}, "spec.roles.generator.podTemplate.volumeMounts",
     "nope: no such volume"),
    ({"serviceAccountName": "Not_A_Name"}, "spec.podTemplate.serviceAccountName", "pattern"),
    ({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "Maybe"}]},
     "spec.podTemplate.topologySpreadConstraints.0.whenUnsatisfiable", "DoNotSchedule"),
    ({"containers": [{"name": "x"}]}, "spec.podTemplate.containers", "unknown field"),
    ({"affinity": {"nodeAffinty": {}}}, "spec.podTemplate.affinity.nodeAffinty", "unknown field"),
])
def test_bad_overrides_are_refused_naming_the_field(override: dict[str, Any], field: str, fragment: str) -> None:
    with pytest.raises(SpecError) as err:
        spec_with(override)
    assert str(err.value).startswith(f"{field}: ") and fragment in str(err.value), str(err.value)
    if field.startswith("spec.podTemplate") and "volumeMounts" not in field:  # the same under a role
        with pytest.raises(SpecError, match=r"^spec\.roles\.learner\.podTemplate"):
            spec_with(learner=override)


def test_a_role_may_mount_a_job_wide_volume() -> None:
    spec = spec_with({"volumes": JOB_WIDE["volumes"]}, verifier={"volumeMounts": [{"name": "models",
                                                                                    "mountPath": "/m"}]})
    assert pods(spec)["verifier"]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][-1]["mountPath"] == "/m"


def test_reserved_names_cover_what_the_operator_renders() -> None:
    """Every env name, label, annotation, volume and mount path the operator renders (every role, every
    optional setting on) is refused in an override, so a user setting is never silently overridden."""
    spec = spec_with()
    for obj in pods(spec, ImageDefaults("reg/scalerl:1")).values():
        tmpl = obj["spec"]["template"]
        c = tmpl["spec"]["containers"][0]
        assert {e["name"] for e in c["env"]} <= set(pt.RESERVED_ENV)
        assert {m["mountPath"] for m in c["volumeMounts"]} <= set(pt.RESERVED_MOUNT_PATHS)
        assert {v["name"] for v in tmpl["spec"]["volumes"]} <= set(pt.RESERVED_VOLUMES)
        for key in tmpl["metadata"]["labels"]:
            assert key in pt.RESERVED_LABELS or key.startswith(pt.RESERVED_PREFIX), key
        for key in tmpl["metadata"]["annotations"]:
            assert key in pt.RESERVED_ANNOTATIONS or key.startswith(pt.RESERVED_PREFIX), key


# ---- image defaults --------------------------------------------------------------------------------

def test_image_defaults_from_the_environment() -> None:
    assert image_defaults({}) == ImageDefaults("", "IfNotPresent", ())
    env = {"SCALERL_DEFAULT_IMAGE": "ghcr.io/acme/scalerl:0.2.0", "SCALERL_DEFAULT_IMAGE_PULL_POLICY": "Always",
           "SCALERL_DEFAULT_IMAGE_PULL_SECRETS": "a, b,,"}
    assert image_defaults(env) == ImageDefaults("ghcr.io/acme/scalerl:0.2.0", "Always", ("a", "b"))
    with pytest.raises(ValueError, match=r"^SCALERL_DEFAULT_IMAGE_PULL_POLICY: must be one of Always"):
        image_defaults({"SCALERL_DEFAULT_IMAGE_PULL_POLICY": "Sometimes"})
    with pytest.raises(ValueError, match=r"^SCALERL_DEFAULT_IMAGE: must be an image reference"):
        image_defaults({"SCALERL_DEFAULT_IMAGE": "a b"})


def test_operator_exits_2_on_a_bad_default_before_any_work() -> None:
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'services'}:{REPO / 'operators'}",
           "SCALERL_DEFAULT_IMAGE_PULL_POLICY": "Sometimes"}
    out = subprocess.run([sys.executable, "-m", "scalerl_operator", "-A"], capture_output=True, text=True, env=env,
                         timeout=60, check=False)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("scalerl-operator: error: SCALERL_DEFAULT_IMAGE_PULL_POLICY")


def test_children_keep_the_image_defaults_they_were_created_with() -> None:
    spec = spec_with()
    v1, v2 = ImageDefaults("reg/scalerl:1", "IfNotPresent", ("p",)), ImageDefaults("reg/scalerl:2", "Always")
    first = pods(spec, v1)
    assert first["learner"]["metadata"]["annotations"][IMAGE_DEFAULTS_ANNOTATION] == v1.annotation()
    assert pinned_image_defaults(first, v2) == v1  # an upgraded operator keeps the job's image
    assert pinned_image_defaults({"learner": None}, v2) == v2  # a new job takes the current default
    broken = {"learner": {"metadata": {"annotations": {IMAGE_DEFAULTS_ANNOTATION: "{"}}}}
    assert pinned_image_defaults(broken, v2) == v2
    assert pods(spec, pinned_image_defaults(first, v2)) == first


def test_a_job_without_any_image_is_refused_naming_spec_image() -> None:
    spec = spec_with()
    problem = image_problem(spec, ImageDefaults())
    assert problem is not None and problem.startswith("spec.image: no image for generator, verifier, curriculum")
    assert image_problem(spec, ImageDefaults("reg/scalerl:1")) is None
    assert image_problem(parse_spec({**BASE, "image": "reg/scalerl:1"}), ImageDefaults()) is None


# ---- spec hash: what the user set, not every default -------------------------------------------------

class TrainNext(TrainConfig):
    warmup_ratio: float = Field(0.0, ge=0.0, le=1.0)  # a field a later operator adds, with its default


class JobSpecNext(JobSpec):
    train: TrainNext = Field(default_factory=TrainNext)
    new_knob: int = 7


def _next(spec: RLJobSpec, **job: Any) -> JobSpecNext:
    """The same RLJob as an upgraded operator parses it: the upgraded CRD filled the new defaults in."""
    tree = full_job_spec("j1", "ns", spec).model_dump(mode="json")
    tree["train"]["warmup_ratio"] = job.pop("warmup_ratio", 0.0)
    return JobSpecNext.model_validate({**tree, "new_knob": 7, **job})


def test_a_new_defaulted_jobspec_field_keeps_the_hash() -> None:
    spec = spec_with()
    old = spec_hash(full_job_spec("j1", "ns", spec))
    assert spec_hash(_next(spec)) == old
    assert spec_hash(_next(spec, warmup_ratio=0.1)) != old  # the user sets the new field: a change
    assert spec_hash(_next(spec, new_knob=8)) != old
    # a default written out equals the default left out; a user-visible change changes the hash
    explicit = parse_spec({**BASE, "job": {**BASE["job"], "seed": 0, "loss": {}}})
    assert spec_hash(full_job_spec("j1", "ns", explicit)) == old
    steps = parse_spec({**BASE, "job": {**BASE["job"], "train": {"steps": 6, "prompts_per_step": 4}}})
    assert spec_hash(full_job_spec("j1", "ns", steps)) != old
    # and it is what the pod templates carry
    for obj in pods(spec).values():
        assert obj["spec"]["template"]["metadata"]["annotations"][SPEC_HASH_ANNOTATION] == old
