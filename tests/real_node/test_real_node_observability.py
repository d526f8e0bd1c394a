"""Observability of an RLJob's Pods on the real node, as a cluster's Prometheus and Jaeger see them.

- The test Prometheus (scripts/infra/observability.sh, job `kubernetes-pods`) discovers the role Pods
  through the node's API server (kubernetes_sd_configs, role pod) by the prometheus.io/scrape and
  prometheus.io/port annotations the operator renders, and scrapes each at its Pod IP; its targets list
  every role Pod of the job (named by the API server, not by the job) up at <pod IP>:<metrics port>.
- EVERY `expr` of EVERY panel of the chart's dashboards, with $namespace and $rljob set to this job's,
  returns at least one finite series for this RLJob, and each metric the expr reads has series only from
  this job's Pods, scraped by that job (labels job, pod, instance).
- The roles export spans over OTLP/gRPC to Jaeger through Service jaeger.scalerl-infra
  (spec.telemetry.otlpEndpoint); one prompt's trace, read back from Jaeger's query API, holds a
  curriculum's, a generator's, a verifier's and the learner's span, each the child of the one before,
  each from a process whose k8s.pod.name is a Pod of that role in this namespace.

One RLJob serves every check; it is deleted once all are seen (its step count is only an upper bound).
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from rljob_helpers import JAEGER_OTLP_SVC, job_secrets, tiny_rljob, warm_start_config_map

pytestmark = [pytest.mark.infra]

DASHBOARDS = Path(__file__).resolve().parents[2] / "helm" / "scalerl" / "files" / "dashboards"
ROLES = ("curriculum", "generator", "verifier", "learner")
ROLE_SPANS = ("curriculum.issue", "generator.generate", "verifier.score", "learner.consume")
SD_JOB = "kubernetes-pods"
STEPS = 80  # an upper bound: the job is deleted once every check passed
DEADLINE_S = 180.0
METRICS_PORT = 9090  # spec.telemetry.metricsPort's default


def _get_json(url: str, timeout_s: float = 10.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return json.loads(r.read())


def _query(prometheus: str, expr: str) -> list[dict[str, Any]]:
    body = _get_json(f"{prometheus}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
    assert body["status"] == "success", body
    return [s for s in body["data"]["result"] if math.isfinite(float(s["value"][1]))]


def _panel_queries(ns: str, job: str) -> list[tuple[str, str]]:
    """(dashboard/panel title, expr with the variables set to this job's) for every target of every panel."""
    out = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel["targets"]:
                expr = target["expr"].replace("$namespace", ns).replace("$rljob", job)
                assert "$" not in expr, f"{path.name} {panel['title']!r}: a variable left in {expr}"
                out.append((f"{path.stem}/{panel['title']}", expr))
    return out


def _role_pods(core: Any, ns: str, job: str) -> dict[str, tuple[str, str]]:
    """Running role Pods of the job, from the API server: name -> (role, pod IP)."""
    pods = core.list_namespaced_pod(ns, label_selector=f"scalerl.dev/job={job}").items
    return {p.metadata.name: (p.metadata.labels["app.kubernetes.io/component"], p.status.pod_ip)
            for p in pods if p.status.phase == "Running" and p.status.pod_ip}


def _targets_problem(prometheus: str, ns: str, pods: dict[str, tuple[str, str]]) -> str | None:
    """None when every role Pod is an `up` target of the kubernetes SD job at <pod IP>:<metrics port>."""
    if {role for role, _ in pods.values()} != set(ROLES):
        return f"role Pods running: {sorted(pods.items())}"
    targets = [t for t in _get_json(f"{prometheus}/api/v1/targets?state=active")["data"]["activeTargets"]
               if t["labels"].get("job") == SD_JOB and t["labels"].get("namespace") == ns]
    seen = {t["labels"].get("pod"): t for t in targets}
    for name, (role, ip) in pods.items():
        t = seen.get(name)
        if t is None or t["health"] != "up":
            return f"pod {name}: target {t and {k: t[k] for k in ('health', 'lastError', 'scrapeUrl')}}"
        assert t["labels"]["instance"] == f"{ip}:{METRICS_PORT}", t
        assert t["labels"]["role"] == role and t["discoveredLabels"]["__meta_kubernetes_pod_name"] == name, t
    return None


def _panel_problem(prometheus: str, ns: str, job: str, title: str, expr: str,
                   pods: dict[str, tuple[str, str]]) -> str | None:
    """None when the panel's expr has data for this RLJob and every metric it reads comes from its Pods."""
    result = _query(prometheus, expr)
    if not result:
        return f"{title}: no data from {expr}"
    assert all(s["metric"].get("rljob") == job for s in result), (title, result)
    for metric in sorted(set(re.findall(r"\b(scalerl_\w+)\{", expr))):
        series = _query(prometheus, f'{metric}{{namespace="{ns}", rljob="{job}"}}')
        if not series:
            return f"{title}: no series of {metric}"
        for s in series:
            labels = s["metric"]
            pod = labels.get("pod", "")
            assert labels.get("job") == SD_JOB and pod in pods, (title, labels, sorted(pods))
            assert labels["instance"] == f"{pods[pod][1]}:{METRICS_PORT}" and labels["role"] == pods[pod][0], labels
    return None


def _prompt_chain(jaeger: str, ns: str, pods: dict[str, tuple[str, str]]) -> list[dict[str, Any]] | None:
    """The spans curriculum.issue -> generator.generate -> verifier.score -> learner.consume of one trace of
    this namespace, each the child of the one before, with the k8s.pod.name of the process that wrote it."""
    url = f"{jaeger}/api/traces?" + urllib.parse.urlencode({"service": "scalerl-learner", "lookback": "1h",
                                                             "limit": 500})
    for trace in _get_json(url)["data"]:
        tags = {pid: {t["key"]: t["value"] for t in p.get("tags", [])} for pid, p in trace["processes"].items()}
        spans = {s["spanID"]: {**s, "service": trace["processes"][s["processID"]]["serviceName"],
                               "pod": tags[s["processID"]].get("k8s.pod.name"),
                               "namespace": tags[s["processID"]].get("k8s.namespace.name")}
                 for s in trace["spans"]}
        for leaf in (s for s in spans.values() if s["operationName"] == ROLE_SPANS[-1] and s["namespace"] == ns):
            chain = [leaf]
            while len(chain) < len(ROLE_SPANS):
                parents = [r["spanID"] for r in chain[-1]["references"] if r["refType"] == "CHILD_OF"]
                if not parents or parents[0] not in spans:
                    break
                chain.append(spans[parents[0]])
            if [s["operationName"] for s in reversed(chain)] == list(ROLE_SPANS):
                return list(reversed(chain))
    return None


@pytest.mark.timeout(600)
def test_real_node_pods_scraped_through_kubernetes_sd_and_traced_into_jaeger(
        node_env, node_core, node_namespace, kubectl, chart, mixed_start) -> None:
    prometheus, jaeger = node_env["PROMETHEUS_URL"], node_env["JAEGER_QUERY_URL"]
    assert node_env.get("JAEGER_PODS_OTLP_GRPC"), "build/infra.env: Jaeger has no receiver for Pods"
    ns, name = node_namespace, "obs"
    job_secrets(kubectl, ns, node_env)
    warm_start_config_map(kubectl, ns, mixed_start)
    body = tiny_rljob(name, f"rn-obs-{ns[3:]}", node_env, steps=STEPS, telemetry={"otlpEndpoint": JAEGER_OTLP_SVC})
    # an eval after every step and a small bootstrap: the fit panels need 4 evals past step 0 (as in
    # tests/integration/test_observability.py)
    body["spec"]["job"]["eval"]["every_steps"] = 1
    body["spec"]["job"]["fit"].update({"bootstrap": 20, "min_compute_fraction": 0.0})
    t0 = time.monotonic()
    kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(body))

    queries = _panel_queries(ns, name)
    assert len(queries) > 30  # both dashboards, every target
    deadline = t0 + DEADLINE_S
    pods: dict[str, tuple[str, str]] = {}
    seen: dict[str, tuple[str, str]] = {}  # every role Pod that ran (a Pod replaced mid-run may have written a span)
    targets: str | None = "not looked at"
    empty = queries
    chain: list[dict[str, Any]] | None = None
    while targets or empty or chain is None:
        assert time.monotonic() < deadline, (
            f"after {DEADLINE_S:.0f} s: targets: {targets}; panels without data: {len(empty)}: "
            + "\n".join(f"  {q}" for q in empty[:12]) + f"; a prompt's trace across the 4 roles: {chain is not None}")
        time.sleep(2.0)
        pods = _role_pods(node_core, ns, name)
        seen.update(pods)
        targets = _targets_problem(prometheus, ns, pods)
        if targets:
            continue
        empty = [(t, e) for t, e in empty if _panel_problem(prometheus, ns, name, t, e, seen)]
        chain = chain or _prompt_chain(jaeger, ns, pods)
    print(f"\n{len(pods)} role Pods discovered and up, {len(queries)} panel queries with data and a prompt's "
          f"trace in Jaeger after {time.monotonic() - t0:.0f} s from kubectl apply")
    assert chain is not None
    for s in chain:
        print(f"  {s['service']:<20} {s['operationName']:<20} pod {s['pod']} span {s['spanID']}")
    assert [s["service"] for s in chain] == [f"scalerl-{r}" for r in ROLES]
    # each span written by a Pod of its role in this job: the process's k8s.namespace.name and k8s.pod.name (a
    # Pod may have been replaced before the loop above listed it: a Deployment's first ReplicaSet, say)
    where = [(s["namespace"], str(s["pod"]).startswith(f"{name}-{role}-"))
             for s, role in zip(chain, ROLES, strict=True)]
    assert where == [(ns, True)] * len(ROLES), ([(s["namespace"], s["pod"]) for s in chain], seen)
    assert len({s["traceID"] for s in chain}) == 1
    # the dashboards' variables offer this job (label_values(scalerl_learner_policy_version, namespace/rljob))
    for label, value in (("namespace", ns), ("rljob", name)):
        match = urllib.parse.urlencode({"match[]": f'scalerl_learner_policy_version{{namespace=~"{ns}"}}'})
        assert value in _get_json(f"{prometheus}/api/v1/label/{label}/values?{match}")["data"], label
    # the Pods stop gracefully (leaving their consumer groups) before the namespace goes with grace 0: else the
    # RLJob's finalizer waits out the groups' session timeouts (as in test_real_node_autoscale.py)
    kubectl("delete", "rljob", "-n", ns, name, "--timeout=90s", check=False, timeout_s=120.0)
