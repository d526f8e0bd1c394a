"""`helm upgrade` of the operator to a build that adds JobSpec fields does not restart a running job
(the real helm client, the real API server, real Kafka).

1. `helm install` of the chart (namespace scope) whose CRD is the one the chart ships, under an API
   group of the test's own (upgrade_build.py: other tests keep the shared RLJob CRD). The operator
   runs as a local process with exactly the arguments and environment of the operator Deployment
   read back from the API server (no kubelet runs there); an RLJob naming no image is reconciled.
2. `helm upgrade` to the "new build": a chart whose CRD is generated from a JobSpec with two more
   defaulted fields and whose appVersion (so image tag) is the next one. The CRD on the API server
   changes (the stored RLJob is served with the new fields), the operator Deployment's template
   changes (new image: it rolls); the old operator is stopped (SIGTERM) and the new build starts with
   the upgraded Deployment's arguments and environment. Before it stops, the old operator passes once
   more against the upgraded CRD, as it may until the Recreate strategy stops its pod: the fields it
   does not know come from a newer CRD (the API server prunes any other), so it leaves the job alone
   (no status write, no Failed/InvalidSpec) and says so in its log.
3. Its first pass leaves the learner StatefulSet (generation, pod-template hash, image, resourceVersion)
   and the Deployments (generation, template) as they were, while job.yaml (the ConfigMap) carries
   the new fields: the new model is in effect. A spec change by the user then rolls each workload
   exactly once, to the hash the current build computes for it, still on the image the job was
   created with (scalerl.dev/image-defaults).

The operator runs with the test's admin kubeconfig, so the chart's RBAC (which names scalerl.dev)
plays no part here; test_helm.py checks it by SubjectAccessReview.
"""

from __future__ import annotations

import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_helpers import CHART, OperatorProcess, free_port, operator_env, run_helm
from operator_helpers import QUIET_KAFKA, kafka_bootstrap, rljob, unique_job, wait_for
from upgrade_build import chart_crd

from scalerl_operator.api.spec import PLURAL, VERSION, parse_spec
from scalerl_operator.render.children import SPEC_HASH_ANNOTATION, full_job_spec, spec_hash
from scalerl_operator.render.images import IMAGE_DEFAULTS_ANNOTATION

pytestmark = [pytest.mark.infra, *QUIET_KAFKA]
Call = Callable[..., tuple[int, Any]]
MERGE = "application/merge-patch+json"
REPOSITORY = "registry.example/scalerl"
LAUNCHER = str(Path(__file__).with_name("upgrade_build.py"))
HANDLED = "scalerl.dev/last-handled-configuration"  # the operator's kopf diff base (operator.startup)
TOUCHED = "scalerl.test/touched"
WORKLOADS = [("StatefulSet", "learner"), ("Deployment", "generator"), ("Deployment", "verifier"),
             ("Deployment", "curriculum")]


@pytest.fixture
def group(k8s_call: Call) -> Iterator[str]:
    """A throw-away API group for the chart's CRD; the CRD (kept by `helm uninstall`) is deleted after."""
    group = f"u{uuid.uuid4().hex[:8]}.scalerl.test"
    try:
        yield group
    finally:
        # no operator runs any more to remove its finalizer: drop it, or the CRD's deletion waits on it
        status, body = k8s_call("GET", f"/apis/{group}/{VERSION}/{PLURAL}")
        for item in body.get("items", []) if status == 200 else []:
            m = item["metadata"]
            k8s_call("PATCH", f"/apis/{group}/{VERSION}/namespaces/{m['namespace']}/{PLURAL}/{m['name']}",
                     {"metadata": {"finalizers": None}}, content_type=MERGE)
        k8s_call("DELETE", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{PLURAL}.{group}")


def _chart(dest: Path, group: str, build: str, app_version: str) -> Path:
    """A copy of helm/scalerl with `build`'s CRD under `group`, as chart version and appVersion `app_version`."""
    shutil.copytree(CHART, dest)
    (dest / "files" / "rljob-crd.yaml").write_text(chart_crd(group, build))
    meta = dest / "Chart.yaml"
    text = re.sub(r"(?m)^version: .*$", f"version: {app_version}", meta.read_text())
    meta.write_text(re.sub(r"(?m)^appVersion: .*$", f'appVersion: "{app_version}"', text))
    return dest


def _next_version(version: str) -> str:
    major, minor, _ = (int(p) for p in version.split("."))
    return f"{major}.{minor + 1}.0"


def _get(call: Call, path: str) -> dict[str, Any] | None:
    status, body = call("GET", path)
    assert status in (200, 404), f"GET {path}: HTTP {status} {body}"
    return body if status == 200 else None


def _container(dep: dict[str, Any]) -> dict[str, Any]:
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    return dict(container)


def _env_of(dep: dict[str, Any], name: str) -> str:
    return str(next(e["value"] for e in _container(dep)["env"] if e["name"] == name))


def test_helm_upgrade_to_a_build_adding_jobspec_fields_does_not_restart_a_running_job(
        k8s_env: dict[str, str], k8s_call: Call, namespace: str, group: str, tmp_path: Path) -> None:
    boot = kafka_bootstrap(k8s_env)
    api, release, name = f"{group}/{VERSION}", f"u{uuid.uuid4().hex[:6]}", unique_job()
    job_path = f"/apis/{api}/namespaces/{namespace}/{PLURAL}/{name}"
    crd_path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{PLURAL}.{group}"
    operator_path = f"/apis/apps/v1/namespaces/{namespace}/deployments/{release}-scalerl-operator"

    def child(kind: str, suffix: str) -> dict[str, Any] | None:
        plural = {"StatefulSet": "statefulsets", "Deployment": "deployments"}[kind]
        return _get(k8s_call, f"/apis/apps/v1/namespaces/{namespace}/{plural}/{name}-{suffix}")

    def job_yaml() -> dict[str, Any] | None:
        cm = _get(k8s_call, f"/api/v1/namespaces/{namespace}/configmaps/{name}-spec")
        return yaml.safe_load(cm["data"]["job.yaml"]) if cm else None

    def start(dep: dict[str, Any], build: str) -> OperatorProcess:
        """The Deployment's container as a process of `build`, once it is the leader."""
        env = operator_env(_container(dep), pod_name=f"{release}-scalerl-operator-{build}", namespace=namespace,
                           kubeconfig=k8s_env["KUBECONFIG"], mounts=tmp_path / f"mounts-{build}")
        proc = OperatorProcess(_container(dep), env, tmp_path / f"operator-{build}.log",
                               launcher=[LAUNCHER, group, build])
        try:
            proc.wait_leader()
        except BaseException:
            proc.stop()
            raise
        return proc

    v1_version = str(yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"])
    v2_version = _next_version(v1_version)
    v1_image, v2_image = f"{REPOSITORY}:{v1_version}", f"{REPOSITORY}:{v2_version}"
    helm_args = ["--kubeconfig", k8s_env["KUBECONFIG"], "-n", namespace, "--set", "operator.scope=namespace",
                 "--set", f"image.repository={REPOSITORY}", "--set", f"operator.healthPort={free_port()}",
                 "--set", f"operator.metricsPort={free_port()}"]

    # 1. helm install; the operator of the installed Deployment reconciles an RLJob
    proc = run_helm(["install", release, str(_chart(tmp_path / "v1", group, "current", v1_version)), *helm_args])
    assert proc.returncode == 0, proc.stderr

    def served() -> bool:
        crd = _get(k8s_call, crd_path) or {}
        established = any(c["type"] == "Established" and c["status"] == "True"
                          for c in (crd.get("status") or {}).get("conditions") or [])
        disc = _get(k8s_call, f"/apis/{api}") or {}
        return established and any(r["name"] == PLURAL for r in disc.get("resources", []))

    wait_for(f"the chart's CRD {PLURAL}.{group} Established and served", served, timeout_s=30)
    dep_v1 = _get(k8s_call, operator_path)
    assert dep_v1 is not None and _container(dep_v1)["image"] == v1_image
    assert _env_of(dep_v1, "SCALERL_DEFAULT_IMAGE") == v1_image
    job = {**rljob(name, boot), "apiVersion": api}
    want_before = spec_hash(full_job_spec(name, namespace, parse_spec(job["spec"])))  # the current build's hash
    v1 = start(dep_v1, "current")
    try:
        status, body = k8s_call("POST", f"/apis/{api}/namespaces/{namespace}/{PLURAL}", job,
                                query={"fieldValidation": "Strict"})
        assert status == 201, body
        wait_for("the RLJob reconciled by the installed operator (status Pending, every workload there)",
                 lambda: ((_get(k8s_call, job_path) or {}).get("status") or {}).get("phase") == "Pending"
                 and all(child(kind, suffix) for kind, suffix in WORKLOADS), timeout_s=60)
        before = {suffix: child(kind, suffix) for kind, suffix in WORKLOADS}
        for suffix, obj in before.items():
            assert obj is not None
            tmpl = obj["spec"]["template"]
            assert tmpl["metadata"]["annotations"][SPEC_HASH_ANNOTATION] == want_before, suffix
            assert tmpl["spec"]["containers"][0]["image"] == v1_image, suffix  # the chart's image, by default
            assert v1_image in obj["metadata"]["annotations"][IMAGE_DEFAULTS_ANNOTATION], suffix

        # 2. helm upgrade to the next build: the CRD and the operator Deployment change on the API server
        proc = run_helm(["upgrade", release, str(_chart(tmp_path / "v2", group, "next", v2_version)), *helm_args])
        assert proc.returncode == 0, proc.stderr
        crd = _get(k8s_call, crd_path)
        assert crd is not None and crd["metadata"]["labels"]["app.kubernetes.io/version"] == v2_version
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["job"]
        assert schema["properties"]["new_knob"]["default"] == 7
        assert schema["properties"]["train"]["properties"]["warmup_ratio"]["default"] == 0.0

        def served_with_new_defaults() -> bool:
            j = ((_get(k8s_call, job_path) or {}).get("spec") or {}).get("job") or {}
            return j.get("new_knob") == 7 and j.get("train", {}).get("warmup_ratio") == 0.0

        wait_for("the stored RLJob served with the upgraded CRD's defaults", served_with_new_defaults, timeout_s=30)
        # the old operator runs on until the Recreate strategy stops it: a pass of it now, against the
        # upgraded CRD (an annotation change makes one), touches no workload either
        k8s_call("PATCH", job_path, {"metadata": {"annotations": {TOUCHED: "1"}}}, content_type=MERGE)
        wait_for("the old operator's pass after the CRD's upgrade (kopf's record of what it handled)",
                 lambda: TOUCHED in ((_get(k8s_call, job_path) or {}).get("metadata", {}).get("annotations", {})
                                     .get(HANDLED, "")), timeout_s=30)
        wait_for("the old operator's word on the fields it does not know",
                 lambda: "not known to this operator build" in v1.log.read_text(), timeout_s=30)
        mid = (_get(k8s_call, job_path) or {}).get("status") or {}
        failed_mid = next(c for c in mid["conditions"] if c["type"] == "Failed")
        assert mid["phase"] != "Failed" and failed_mid["status"] == "False", mid  # the job is not failed by it
        dep_v2 = _get(k8s_call, operator_path)
        assert dep_v2 is not None
        assert dep_v2["metadata"]["generation"] > dep_v1["metadata"]["generation"]  # the operator rolls
        assert _container(dep_v2)["image"] == v2_image and _env_of(dep_v2, "SCALERL_DEFAULT_IMAGE") == v2_image
        annotations = [d["spec"]["template"]["metadata"]["annotations"]["checksum/crd"] for d in (dep_v1, dep_v2)]
        assert annotations[0] != annotations[1]
    finally:
        code = v1.stop()  # what the Deployment's Recreate strategy does to the old pod
    assert code == 0, f"the old operator did not exit 0 on SIGTERM (exit {code}):\n{v1.tail()}"

    # 3. the new build takes over. Only it writes status from now on: the test drops status.roles, so
    # that their return marks the end of its first pass (reconcile writes the status after the children)
    status, body = k8s_call("PATCH", f"{job_path}/status", {"status": {"roles": None}}, content_type=MERGE)
    assert status == 200 and "roles" not in body["status"], body
    v2 = start(dep_v2, "next")
    try:
        wait_for("the new operator's first pass (status.roles written again)",
                 lambda: "roles" in ((_get(k8s_call, job_path) or {}).get("status") or {}), timeout_s=60)
        rendered = job_yaml() or {}
        assert rendered["new_knob"] == 7 and rendered["train"]["warmup_ratio"] == 0.0  # the new model rendered it
        assert rendered["train"]["steps"] == 20
        for kind, suffix in WORKLOADS:
            now, was = child(kind, suffix), before[suffix]
            assert now is not None and was is not None
            assert now["metadata"]["generation"] == was["metadata"]["generation"], suffix
            assert now["spec"]["template"] == was["spec"]["template"], suffix  # same hash, same image
        learner = child("StatefulSet", "learner")
        assert learner is not None and learner["metadata"]["resourceVersion"] == \
            before["learner"]["metadata"]["resourceVersion"]  # type: ignore[index]
        status_now = (_get(k8s_call, job_path) or {}).get("status") or {}
        failed = next(c for c in status_now["conditions"] if c["type"] == "Failed")
        assert status_now["phase"] == "Pending" and failed["status"] == "False", status_now

        # a change the user makes rolls every workload once, to the hash the current build gives it
        job["spec"]["job"]["train"]["steps"] = 30
        want_after = spec_hash(full_job_spec(name, namespace, parse_spec(job["spec"])))
        assert want_after != want_before
        status, body = k8s_call("PATCH", job_path, {"spec": {"job": {"train": {"steps": 30}}}}, content_type=MERGE)
        assert status == 200, body
        for kind, suffix in WORKLOADS:
            obj = wait_for(f"{kind} {name}-{suffix} at the new spec's hash", lambda k=kind, s=suffix: (
                o if (o := child(k, s)) and o["spec"]["template"]["metadata"]["annotations"][SPEC_HASH_ANNOTATION]
                == want_after else None), timeout_s=30)
            was = before[suffix]
            assert was is not None and obj["metadata"]["generation"] == was["metadata"]["generation"] + 1, suffix
            assert obj["spec"]["template"]["spec"]["containers"][0]["image"] == v1_image, suffix
    finally:
        code = v2.stop()
    assert code == 0, f"the new operator did not exit 0 on SIGTERM (exit {code}):\n{v2.tail()}"
