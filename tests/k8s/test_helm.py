"""The Helm chart against the real helm client and the real test kube-apiserver (scripts/infra).

- `helm lint --strict` passes with the defaults and with every optional component on;
- values.schema.json makes `helm template` reject bad values, naming the key;
- every object `helm template` renders passes a server-side dry run (dryRun=All, strict field
  validation) after the chart's CRD is applied for real, and `kubernetes-validate` for built-in kinds;
- the operator's RBAC has no wildcard and grants exactly what a SubjectAccessReview expects;
- examples/rljob.yaml is accepted by the API server's CRD schema (and a broken copy is not);
- the operator started with the Deployment's own command and arguments takes its Lease, answers the
  probe path, and stops on SIGTERM; the code of both `helm test` pods runs green against it;
- a real `helm install`, `helm upgrade` (the CRD changes) and `helm uninstall` (the CRD stays).

There is no kubelet here, so no pod runs: `helm test` itself cannot run, hence the pods' code is run
as local processes. The ServiceMonitor/PodMonitor CRDs the dry run needs are a test-local subset of
the Prometheus Operator's schema (only the fields the chart uses, strictly).
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from helm_helpers import CHART, REPO, OperatorProcess, free_port, operator_env, run_helm

import scalerl_operator.__main__ as operator_cli

pytestmark = pytest.mark.infra  # the helm client and the API server come from scripts/infra

ALL_ON = ["minio.enabled=true", "kafka.enabled=true", "otelCollector.enabled=true",
          "metrics.serviceMonitor.enabled=true", "metrics.podMonitor.enabled=true",
          "otelCollector.tracesEndpoint=tempo.monitoring:4317"]
K8S_MINOR = "1.34"
KUBE_VERSION = f"v{K8S_MINOR}.0"  # of the test API server; `helm template` assumes 1.20 without it
BUILT_IN_GROUPS = {"v1", "apps/v1", "rbac.authorization.k8s.io/v1", "apiextensions.k8s.io/v1"}


def render(release: str, namespace: str, values: list[str] | tuple[str, ...] = ()) -> str:
    """`helm template` of the chart (hooks and test pods included) with `--set` values."""
    proc = run_helm(["template", release, str(CHART), "--namespace", namespace, "--kube-version", KUBE_VERSION,
                     *[a for v in values for a in ("--set", v)]])
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def objects_of(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _monitor_crd(kind: str, endpoints_key: str) -> dict[str, Any]:
    """A CRD for the Prometheus Operator kind `kind`: the part of its upstream schema the chart uses
    (strict: an unknown or misspelt field fails the dry run), so the test server knows the kind."""
    string, strings = {"type": "string"}, {"type": "array", "items": {"type": "string"}}
    duration = {"type": "string", "pattern": "^(0|(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
    relabel = {"type": "object", "properties": {
        "sourceLabels": {"type": "array", "items": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}},
        "targetLabel": string, "regex": string, "replacement": string, "separator": string,
        "action": {"type": "string", "enum": ["replace", "keep", "drop", "labelmap", "labeldrop", "labelkeep"]}}}
    secret_key = {"type": "object", "required": ["key"], "properties": {"name": string, "key": string,
                                                                       "optional": {"type": "boolean"}}}
    endpoint = {"type": "object", "properties": {"port": string, "path": string, "interval": duration,
                                                 "scrapeTimeout": duration,
                                                 "scheme": {"type": "string", "enum": ["http", "https"]},
                                                 "tlsConfig": {"type": "object", "properties": {
                                                     "insecureSkipVerify": {"type": "boolean"},
                                                     "serverName": string}},
                                                 "authorization": {"type": "object", "properties": {
                                                     "type": string, "credentials": secret_key}},
                                                 "relabelings": {"type": "array", "items": relabel}}}
    selector = {"type": "object", "properties": {
        "matchLabels": {"type": "object", "additionalProperties": string},
        "matchExpressions": {"type": "array", "items": {"type": "object", "required": ["key", "operator"],
                                                        "properties": {"key": string, "operator": string,
                                                                       "values": strings}}}}}
    spec = {"type": "object", "required": ["selector"], "properties": {
        "selector": selector, endpoints_key: {"type": "array", "items": endpoint},
        "namespaceSelector": {"type": "object", "properties": {"any": {"type": "boolean"}, "matchNames": strings}}}}
    plural = kind.lower() + "s"
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.monitoring.coreos.com"},
            "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
                     "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()},
                     "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                         "type": "object", "required": ["spec"], "properties": {"spec": spec}}}}]}}


TEST_CRDS = [_monitor_crd("ServiceMonitor", "endpoints"), _monitor_crd("PodMonitor", "podMetricsEndpoints")]


# ---- lint and schema ---------------------------------------------------------------------------------

@pytest.mark.parametrize("values", [[], ALL_ON, ["operator.scope=namespace", "operator.watchNamespaces={a,b}",
                                                 "crds.install=false", "dashboards.enabled=false"]],
                         ids=["defaults", "all-optional-on", "namespace-scope"])
def test_helm_lint_strict(values: list[str]) -> None:
    args = ["lint", str(CHART), "--strict"] + [a for v in values for a in ("--set", v)]
    proc = run_helm(args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize(("value", "path", "why"), [
    ("operator.replicas=-1", "/operator/replicas", "minimum: got -1, want 0"),
    ("operator.scope=galaxy", "/operator/scope", "value must be one of 'cluster', 'namespace'"),
    ("kafka.clusterId=short", "/kafka/clusterId", "'short' does not match pattern"),
    ("minio.image.tag=latest", "/minio/image/tag", "'latest' does not match pattern"),
    ("image.tag=latest", "/image/tag", "'latest' does not match pattern"),
    ("operator.replica=2", "/operator", "additional properties 'replica' not allowed"),
    ("metrics.serviceMonitor.interval=soon", "/metrics/serviceMonitor/interval", "'soon' does not match pattern"),
])
def test_schema_rejects_bad_values(value: str, path: str, why: str) -> None:
    proc = run_helm(["template", "t", str(CHART), "--kube-version", KUBE_VERSION, "--set", value])
    assert proc.returncode != 0, f"--set {value} rendered"
    assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr
    assert f"- at '{path}': {why}" in proc.stderr, proc.stderr


def test_template_rejects_two_operators_without_leader_election() -> None:
    proc = run_helm(["template", "t", str(CHART), "--kube-version", KUBE_VERSION, "--set", "operator.replicas=2",
                     "--set", "operator.leaderElection.enabled=false"])
    assert proc.returncode != 0
    assert "operator.replicas: more than 1 needs operator.leaderElection.enabled=true" in proc.stderr


# ---- what the templates render -----------------------------------------------------------------------

def test_crd_is_the_generated_one_with_keep_and_behind_its_flag() -> None:
    objs = objects_of(render("t", "ns1"))
    crds = [o for o in objs if o["kind"] == "CustomResourceDefinition"]
    assert len(crds) == 1
    generated = yaml.safe_load((CHART / "files" / "rljob-crd.yaml").read_text())
    assert crds[0]["spec"] == generated["spec"]  # the schema survives the template untouched
    assert crds[0]["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    no_keep = objects_of(render("t", "ns1", ["crds.keep=false"]))
    assert "helm.sh/resource-policy" not in next(
        o for o in no_keep if o["kind"] == "CustomResourceDefinition")["metadata"].get("annotations", {})
    assert not [o for o in objects_of(render("t", "ns1", ["crds.install=false"]))
                if o["kind"] == "CustomResourceDefinition"]


def _digits_only_hash_suffix(text: str) -> str:
    """A YAML comment that makes sha256(text + comment) start with 16 decimal digits (one try in ~1,900)."""
    for n in range(1_000_000):
        comment = f"# {n}\n"
        if hashlib.sha256((text + comment).encode()).hexdigest()[:16].isdigit():
            return comment
    raise AssertionError("no such suffix in 10^6 tries")


def test_a_checksum_annotation_stays_a_string_when_the_hash_looks_like_a_number(tmp_path: Path) -> None:
    """A pod-template annotation is a string; an unquoted hash prefix of digits (or digits, `e`, digits) is a
    YAML number, and the API server refuses the Deployment (CI of 2026-12-07: `cannot unmarshal number`)."""
    chart = tmp_path / "scalerl"
    shutil.copytree(CHART, chart)
    crd = chart / "files" / "rljob-crd.yaml"
    text = crd.read_text()
    crd.write_text(text + _digits_only_hash_suffix(text))
    proc = run_helm(["template", "t", str(chart), "--kube-version", KUBE_VERSION])
    assert proc.returncode == 0, proc.stderr
    objs = objects_of(proc.stdout)
    for obj in objs:
        for key, value in ((obj.get("spec") or {}).get("template", {}).get("metadata", {}).get("annotations")
                           or {}).items():
            assert isinstance(value, str), f"{obj['kind']} {obj['metadata']['name']}: {key}: {value!r}"
    (dep,) = [o for o in objs if o["kind"] == "Deployment" and "checksum/crd" in
              o["spec"]["template"]["metadata"].get("annotations", {})]
    assert dep["spec"]["template"]["metadata"]["annotations"]["checksum/crd"] == hashlib.sha256(
        crd.read_bytes()).hexdigest()[:16]


def test_operator_deployment_is_hardened_and_watches_its_scope() -> None:
    objs = objects_of(render("rel", "ops", ["operator.scope=namespace", "operator.watchNamespaces={team-a,team-b}"]))
    dep = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "rel-scalerl-operator")
    pod = dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["tini", "-g", "--", "python", "-m", "scalerl_operator"]
    assert "--namespace=team-a" in container["args"] and "--namespace=team-b" in container["args"]
    assert "--all-namespaces" not in container["args"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["resources"]["limits"]["memory"] == "512Mi"
    # namespace scope: a Role + RoleBinding per watched namespace, nothing cluster-wide but the CRD
    roles = sorted(o["metadata"]["namespace"] for o in objs if o["kind"] == "Role"
                   and o["metadata"]["name"] == "rel-scalerl-operator")
    assert roles == ["team-a", "team-b"]
    assert not [o for o in objs if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    cluster = objects_of(render("rel", "ops"))
    args = next(o for o in cluster if o["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--all-namespaces" in args
    # the operator's own command line accepts what the chart passes, with the values' meaning
    for argv, namespaces in ((container["args"], ["team-a", "team-b"]), (args, [])):
        parsed = operator_cli.build_parser().parse_args(argv)
        assert operator_cli._problem(parsed) is None
        assert parsed.namespace == namespaces and parsed.all_namespaces == (not namespaces)
        assert parsed.leader_election and parsed.lease_name == "rel-scalerl-operator-leader"
        assert parsed.lease_namespace == "ops" and parsed.lease_duration_seconds == 15
        assert parsed.liveness == "http://0.0.0.0:8080/healthz" and parsed.metrics_port == 9090


def test_the_chart_image_is_the_rljobs_default() -> None:
    """The operator Deployment passes image repository:tag, pullPolicy and the pull secrets' names to
    the operator, which reads them as the default of every RLJob role that names no image."""
    from scalerl_operator.render.images import ImageDefaults, image_defaults

    def operator_env(values: list[str]) -> dict[str, str]:
        objs = objects_of(render("rel", "ops", values))
        dep = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "rel-scalerl-operator")
        (container,) = dep["spec"]["template"]["spec"]["containers"]
        return {e["name"]: e["value"] for e in container["env"] if "value" in e}

    env = operator_env(["image.repository=ghcr.io/acme/scalerl", "image.tag=0.2.0-cuda", "image.pullPolicy=Always",
                        "imagePullSecrets[0].name=acme-pull", "imagePullSecrets[1].name=mirror-pull"])
    assert image_defaults(env) == ImageDefaults("ghcr.io/acme/scalerl:0.2.0-cuda", "Always",
                                                ("acme-pull", "mirror-pull"))
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    default = image_defaults(operator_env([]))  # the placeholder that says it must be set, at the appVersion
    assert default == ImageDefaults(f"registry.invalid/set-image-repository/scalerl:{chart['appVersion']}",
                                    "IfNotPresent", ())
    proc = run_helm(["lint", str(CHART), "--strict", "--set", "image.repository=Not A Repo"])
    assert proc.returncode != 0 and "/image/repository" in proc.stdout + proc.stderr


def test_the_scrape_token_reaches_the_operator_and_the_monitors_never_the_roles() -> None:
    """The chart's scrape token (a random Secret, or the user's): mounted into the operator, which hashes it
    into the roles' Secrets (SCALERL_SCRAPE_TOKEN_FILE), and presented by both monitors over HTTPS."""
    for values, secret in (([], "rel-scalerl-scrape-token"),
                           (["metrics.scrapeToken.existingSecret=my-token"], "my-token")):
        objs = objects_of(render("rel", "ops", [*values, "metrics.serviceMonitor.enabled=true"]))
        made = [o for o in objs if o["kind"] == "Secret" and o["metadata"]["name"].endswith("scrape-token")]
        if values:
            assert made == []  # the user's Secret: the chart makes none
        else:
            (token,) = made
            assert len(base64.b64decode(token["data"]["token"])) == 48
        dep = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "rel-scalerl-operator")
        pod = dep["spec"]["template"]["spec"]
        (vol,) = [v for v in pod["volumes"] if v["name"] == "scrape-token"]
        assert vol["secret"]["secretName"] == secret
        (container,) = pod["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "scrape-token"]
        assert env["SCALERL_SCRAPE_TOKEN_FILE"] == f"{mount['mountPath']}/token" and mount["readOnly"] is True
        for with_pods in (False, True):
            objs = objects_of(render("rel", "ops", [*values, "metrics.serviceMonitor.enabled=true",
                                                    f"metrics.podMonitor.enabled={str(with_pods).lower()}"]))
            (monitor,) = [o for o in objs if o["kind"] in ("ServiceMonitor", "PodMonitor")
                          and o["metadata"]["name"] == "rel-scalerl-rljobs"]
            (endpoint,) = monitor["spec"]["podMetricsEndpoints" if with_pods else "endpoints"]
            assert endpoint["scheme"] == "https" and endpoint["authorization"] == {
                "type": "Bearer", "credentials": {"name": secret, "key": "token"}}


def test_rbac_has_no_wildcards() -> None:
    for values in ([], ["operator.scope=namespace"]):
        for obj in objects_of(render("t", "ns1", values + ALL_ON)):
            for rule in obj.get("rules", []) if obj["kind"] in ("Role", "ClusterRole") else []:
                for field in ("verbs", "resources", "apiGroups", "resourceNames"):
                    assert "*" not in rule.get(field, []), (obj["metadata"]["name"], rule)
                assert "nonResourceURLs" not in rule


def test_dashboards_configmaps_carry_the_files_and_the_sidecar_label() -> None:
    objs = objects_of(render("t", "ns1", ["dashboards.namespace=grafana"]))
    maps = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert sorted(o["metadata"]["name"] for o in maps) == ["t-scalerl-dashboard-scaling",
                                                           "t-scalerl-dashboard-training"]
    for cm in maps:
        assert cm["metadata"]["namespace"] == "grafana"
        ((key, text),) = cm["data"].items()
        assert json.loads(text) == json.loads((CHART / "files" / "dashboards" / key).read_text())
    monitors = [o for o in objects_of(render("t", "ns1", ALL_ON)) if o["kind"] in ("ServiceMonitor", "PodMonitor")]
    # ServiceMonitors for the operator and the OTel collector; the RLJob roles by ONE monitor: the PodMonitor
    # (with the role ServiceMonitor too, every generator and verifier would be scraped, and summed, twice)
    assert sorted((o["kind"], o["metadata"]["name"]) for o in monitors) == [
        ("PodMonitor", "t-scalerl-rljobs"), ("ServiceMonitor", "t-scalerl-operator"),
        ("ServiceMonitor", "t-scalerl-otel-collector")]
    services_only = [o for o in objects_of(render("t", "ns1", ["metrics.serviceMonitor.enabled=true"]))
                     if o["kind"] in ("ServiceMonitor", "PodMonitor")]
    assert sorted(o["metadata"]["name"] for o in services_only) == ["t-scalerl-operator", "t-scalerl-rljobs"]
    for objs in (monitors, services_only):
        relabels = [r["targetLabel"] for o in objs for e in o["spec"].get("endpoints", o["spec"].get(
            "podMetricsEndpoints", [])) for r in e.get("relabelings", [])]
        assert relabels.count("rljob") == 1  # the label every dashboard query filters on, from one monitor


def test_example_rljob_is_the_quickstart_wired_to_the_bundled_services() -> None:
    example = yaml.safe_load((REPO / "examples" / "rljob.yaml").read_text())
    quickstart = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    del quickstart["name"]  # metadata.name in an RLJob
    assert example["spec"]["job"] == quickstart
    # the endpoints it names are the ones the chart creates for release `scalerl` in namespace `scalerl`
    objs = objects_of(render("scalerl", "scalerl", ["kafka.enabled=true", "minio.enabled=true",
                                                     "otelCollector.enabled=true"]))
    ports = {o["metadata"]["name"]: {p["name"]: p["port"] for p in o["spec"]["ports"]}
             for o in objs if o["kind"] == "Service"}
    spec = example["spec"]
    assert spec["bus"]["bootstrap"] == f"scalerl-kafka.scalerl.svc:{ports['scalerl-kafka']['kafka']}"
    assert spec["store"]["endpoint"] == f"http://scalerl-minio.scalerl.svc:{ports['scalerl-minio']['s3']}"
    assert spec["telemetry"]["otlpEndpoint"] == (
        f"http://scalerl-otel-collector.scalerl.svc:{ports['scalerl-otel-collector']['otlp-grpc']}")
    secret = next(o for o in objs if o["kind"] == "Secret")
    creds = spec["store"]["credentialsSecret"]
    assert creds["name"] == secret["metadata"]["name"]
    assert {creds["accessKeyKey"], creds["secretKeyKey"]} == set(secret["data"])
    assert spec["store"]["uri"].startswith("s3://scalerl/")  # minio.bucket


# ---- the real API server -----------------------------------------------------------------------------

Call = Callable[..., tuple[int, Any]]  # conftest's k8s_call: (method, path, body=None, **kw) -> (status, JSON)
APPLY = "application/apply-patch+yaml"


class Paths:
    """REST paths of kinds, read from the API server's discovery documents."""

    def __init__(self, call: Call) -> None:
        self.call = call
        self.cache: dict[str, dict[str, tuple[str, bool]]] = {}

    def collection(self, api_version: str, kind: str, namespace: str) -> str:
        base = f"/api/{api_version}" if api_version == "v1" else f"/apis/{api_version}"
        if api_version not in self.cache:
            status, body = self.call("GET", base)
            assert status == 200, f"discovery of {api_version}: HTTP {status} {body}"
            self.cache[api_version] = {r["kind"]: (r["name"], r["namespaced"]) for r in body["resources"]
                                       if "/" not in r["name"]}
        plural, namespaced = self.cache[api_version][kind]
        return f"{base}/namespaces/{namespace}/{plural}" if namespaced else f"{base}/{plural}"


def _apply_crd(call: Call, crd: dict[str, Any], timeout_s: float = 30.0) -> None:
    """Server-side apply of a CRD, then wait until it is Established."""
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"
    status, body = call("PATCH", path, crd, content_type=APPLY,
                        query={"fieldManager": "scalerl-test-helm", "force": "true"})
    assert status in (200, 201), f"applying {crd['metadata']['name']}: HTTP {status} {body}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status, body = call("GET", path)
        if any(c["type"] == "Established" and c["status"] == "True"
               for c in (body.get("status") or {}).get("conditions") or []):
            return
        time.sleep(0.2)
    raise AssertionError(f"CRD {crd['metadata']['name']} not Established after {timeout_s} s")


@pytest.fixture(scope="module")
def paths(k8s_call: Call) -> Iterator[Paths]:
    """REST paths, after the chart's CRD and the test's ServiceMonitor/PodMonitor CRDs are applied."""
    chart_crd = next(o for o in objects_of(render("crd", "default")) if o["kind"] == "CustomResourceDefinition")
    for crd in [chart_crd, *TEST_CRDS]:
        _apply_crd(k8s_call, crd)
    yield Paths(k8s_call)
    for crd in TEST_CRDS:
        k8s_call("DELETE", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}")


def _dry_run_create(paths: Paths, obj: dict[str, Any], namespace: str) -> tuple[int, Any]:
    return paths.call("POST", paths.collection(obj["apiVersion"], obj["kind"], namespace), obj,
                      query={"dryRun": "All", "fieldValidation": "Strict"})


@pytest.mark.parametrize("values", [ALL_ON, ["operator.scope=namespace", *ALL_ON]], ids=["cluster", "namespace"])
def test_every_rendered_object_passes_server_side_dry_run(paths: Paths, namespace: str, values: list[str]) -> None:
    release = f"t{uuid.uuid4().hex[:6]}"
    objs = objects_of(render(release, namespace, values))
    kinds = {"ConfigMap", "CustomResourceDefinition", "Deployment", "NetworkPolicy", "Pod", "PodMonitor", "Role",
             "RoleBinding", "Secret", "Service", "ServiceAccount", "ServiceMonitor", "StatefulSet"}
    if "operator.scope=namespace" not in values:
        kinds |= {"ClusterRole", "ClusterRoleBinding"}
    assert {o["kind"] for o in objs} == kinds
    failures = []
    for obj in objs:
        what = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["apiVersion"] in BUILT_IN_GROUPS:
            try:
                kubernetes_validate.validate(obj, K8S_MINOR, strict=True)
            except kubernetes_validate.ValidationError as exc:
                failures.append(f"{what}: kubernetes-validate: {exc.message}")
        if obj["kind"] == "CustomResourceDefinition":
            continue  # applied for real by the fixture
        status, body = _dry_run_create(paths, obj, namespace)
        if status != 201:
            failures.append(f"{what}: HTTP {status} {body.get('message') if isinstance(body, dict) else body}")
        else:
            assert body["metadata"]["name"] == obj["metadata"]["name"]
    assert not failures, "\n".join(failures)
    # a dry run persists nothing
    status, body = paths.call("GET", f"/apis/apps/v1/namespaces/{namespace}/deployments")
    assert status == 200 and body["items"] == []


def test_example_rljob_is_accepted_by_the_crd_and_a_broken_one_is_not(paths: Paths, namespace: str) -> None:
    example = yaml.safe_load((REPO / "examples" / "rljob.yaml").read_text())
    status, echoed = _dry_run_create(paths, example, namespace)
    assert status == 201, echoed
    roles = echoed["spec"]["roles"]
    assert roles["verifier"]["autoscaling"]["maxReplicas"] == 8
    assert roles["generator"]["resources"]["limits"]["nvidia.com/gpu"] == 1
    # defaults the API server filled in from the schema (the defaults of scalerl_operator.api.spec)
    assert roles["verifier"]["autoscaling"]["tolerance"] == 0.1
    assert roles["generator"]["autoscaling"]["fallbackReplicas"] == 1
    assert echoed["spec"]["job"]["loss"]["cispo_eps_max"] == 5.0  # a JobSpec default (ScaleRL's CISPO cap)
    broken = copy.deepcopy(example)
    broken["spec"]["roles"]["verifier"]["replicas"] = -1
    status, body = _dry_run_create(paths, broken, namespace)
    assert status == 422 and "spec.roles.verifier.replicas" in body["message"], body


def test_helm_test_hooks_pass_against_a_running_operator(paths: Paths, k8s_env: dict[str, str], namespace: str,
                                                         tmp_path: Path) -> None:
    """The operator started with the chart's own command and arguments (namespace scope, leader election)
    takes its Lease and answers its probe path; then the code of both `helm test` pods runs green."""
    release, health = f"h{uuid.uuid4().hex[:6]}", free_port()
    objs = objects_of(render(release, namespace, ["operator.scope=namespace", f"operator.healthPort={health}",
                                                  f"operator.metricsPort={free_port()}"]))
    (container,) = next(o for o in objs if o["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"]
    pod_name = f"{release}-operator-0"
    env = operator_env(container, pod_name=pod_name, namespace=namespace, kubeconfig=k8s_env["KUBECONFIG"],
                       mounts=tmp_path / "mounts")
    assert Path(env["SCALERL_SCRAPE_TOKEN_FILE"]).is_file()  # the chart's scrape token, as the Pod mounts it
    operator = OperatorProcess(container, env, tmp_path / "operator.log")
    try:
        operator.wait_leader()
        status, lease = paths.call("GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/"
                                          f"{release}-scalerl-operator-leader")
        assert status == 200 and lease["spec"]["holderIdentity"] == pod_name, lease
        service = f"http://{release}-scalerl-operator.{namespace}.svc:{health}"
        for pod in (o for o in objs if o["kind"] == "Pod"):
            script = pod["spec"]["containers"][0]["args"][0].replace(service, f"http://127.0.0.1:{health}")
            proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                                  timeout=120, check=False)
            assert proc.returncode == 0, f"{pod['metadata']['name']}: {proc.stdout}{proc.stderr}"
            assert ("HTTP 200" in proc.stdout) or ("passes the CRD schema" in proc.stdout), proc.stdout
    finally:
        code = operator.stop()
    assert code == 0, f"the operator did not exit 0 within 30 s of SIGTERM (exit {code})"


def _allowed(call: Call, sa: str, namespace: str, verb: str, group: str, resource: str, subresource: str = "",
             name: str = "") -> bool:
    attributes = {"namespace": namespace, "verb": verb, "group": group, "resource": resource}
    attributes |= {k: v for k, v in (("subresource", subresource), ("name", name)) if v}
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {
        "user": f"system:serviceaccount:{namespace}:{sa}",
        "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"],
        "resourceAttributes": attributes}}
    status, body = call("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
    assert status == 201, body
    return bool(body["status"].get("allowed"))


def test_namespaced_rbac_grants_exactly_what_the_operator_needs(k8s_call: Call, namespace: str) -> None:
    release = f"r{uuid.uuid4().hex[:6]}"
    for obj in objects_of(render(release, namespace, ["operator.scope=namespace"])):
        hook = "helm.sh/hook" in obj["metadata"].get("annotations", {})
        if obj["kind"] in ("Role", "RoleBinding") and not hook:
            plural = "roles" if obj["kind"] == "Role" else "rolebindings"
            status, body = k8s_call("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/{plural}", obj)
            assert status == 201, body
    sa = f"{release}-scalerl"
    allowed = [("watch", "scalerl.dev", "rljobs", ""), ("patch", "scalerl.dev", "rljobs", "status"),
               ("update", "scalerl.dev", "rljobs", "finalizers"), ("create", "apps", "deployments", ""),
               ("update", "apps", "deployments", "scale"), ("patch", "apps", "statefulsets", "scale"),
               ("delete", "apps", "statefulsets", ""),
               ("create", "", "services", ""), ("patch", "", "configmaps", ""), ("get", "", "secrets", ""),
               ("create", "", "secrets", ""), ("patch", "", "secrets", ""),
               ("list", "", "pods", ""), ("watch", "", "pods", ""), ("delete", "", "pods", ""),
               ("create", "policy", "poddisruptionbudgets", ""), ("create", "", "events", ""),
               ("create", "coordination.k8s.io", "leases", ""), ("create", "kueue.x-k8s.io", "workloads", ""),
               ("watch", "kueue.x-k8s.io", "workloads", ""), ("patch", "kueue.x-k8s.io", "workloads", "status")]
    denied = [("list", "", "secrets", ""), ("watch", "", "secrets", ""), ("delete", "", "secrets", ""),
              ("create", "", "pods", ""),
              ("delete", "scalerl.dev", "rljobs", ""), ("create", "rbac.authorization.k8s.io", "roles", ""),
              ("create", "apps", "daemonsets", ""), ("delete", "coordination.k8s.io", "leases", "")]
    assert [a for a in allowed if not _allowed(k8s_call, sa, namespace, *a)] == []
    assert [d for d in denied if _allowed(k8s_call, sa, namespace, *d)] == []
    # the leader-election Lease: only the chart's own one may be renewed
    lease = f"{release}-scalerl-operator-leader"
    assert _allowed(k8s_call, sa, namespace, "update", "coordination.k8s.io", "leases", name=lease)
    assert not _allowed(k8s_call, sa, namespace, "update", "coordination.k8s.io", "leases", name="kube-scheduler")


def test_helm_install_upgrade_uninstall_keeps_the_crd(k8s_call: Call, k8s_env: dict[str, str], namespace: str,
                                                      tmp_path: Path) -> None:
    release = f"i{uuid.uuid4().hex[:6]}"
    crd_path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/rljobs.scalerl.dev"
    operator_path = f"/apis/apps/v1/namespaces/{namespace}/deployments/{release}-scalerl-operator"
    # a CRD applied earlier (by another test) is adopted by this release, the way Helm documents
    status, body = k8s_call("PATCH", crd_path, {"metadata": {
        "labels": {"app.kubernetes.io/managed-by": "Helm"},
        "annotations": {"meta.helm.sh/release-name": release, "meta.helm.sh/release-namespace": namespace}}},
        content_type="application/merge-patch+json")
    assert status in (200, 404), body
    base = ["--kubeconfig", k8s_env["KUBECONFIG"], "-n", namespace]
    proc = run_helm(["install", release, str(CHART), *base])
    assert proc.returncode == 0, proc.stderr
    assert f"kubectl get rlj -n {namespace} -w" in proc.stdout  # NOTES.txt
    status, dep = k8s_call("GET", operator_path)
    assert status == 200 and dep["spec"]["replicas"] == 1
    status, live = k8s_call("GET", crd_path)
    assert live["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    # an upgrade updates the CRD: a copy of the chart whose CRD has one more category
    chart_copy = tmp_path / "scalerl"
    shutil.copytree(CHART, chart_copy)
    crd_file = chart_copy / "files" / "rljob-crd.yaml"
    changed = yaml.safe_load(crd_file.read_text())
    changed["spec"]["names"]["categories"].append("scalerl-upgrade-test")
    crd_file.write_text(yaml.safe_dump(changed, sort_keys=False))
    proc = run_helm(["upgrade", release, str(chart_copy), *base])
    assert proc.returncode == 0, proc.stderr
    assert k8s_call("GET", crd_path)[1]["spec"]["names"]["categories"] == ["scalerl", "scalerl-upgrade-test"]
    proc = run_helm(["upgrade", release, str(CHART), *base])
    assert proc.returncode == 0, proc.stderr
    assert k8s_call("GET", crd_path)[1]["spec"]["names"]["categories"] == ["scalerl"]
    # uninstall removes the operator but keeps the CRD (and so every RLJob)
    proc = run_helm(["uninstall", release, *base])
    assert proc.returncode == 0, proc.stderr
    assert "kept due to the resource policy" in proc.stdout + proc.stderr
    assert k8s_call("GET", crd_path)[0] == 200
    assert k8s_call("GET", operator_path)[0] == 404
