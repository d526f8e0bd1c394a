"""Observability end to end: a short distributed run (curriculum, a generator, a verifier, a learner as
processes over the real Kafka and MinIO), scraped by a real Prometheus and traced into a real Jaeger v2.

- Prometheus scrapes every role's side port (a file_sd targets file written here, with the labels the
  chart's PodMonitor gives: rljob, namespace, role); then EVERY `expr` of EVERY panel of the chart's
  dashboards, with $namespace and $rljob set to this run's, is evaluated by Prometheus's query API and
  must return at least one series with a finite value (the list of panels and their series is printed).
  The dashboards' own variable queries must offer this run's namespace and RLJob.
- The roles export spans to Jaeger over OTLP (OTEL_EXPORTER_OTLP_ENDPOINT); a trace of one prompt,
  read back from Jaeger's query API, holds the curriculum's, a generator's, a verifier's and the
  learner's spans, each the child of the one before, in time order.

The run is cut short once both are seen (its step count is only an upper bound); every wait has a
deadline.
"""

from __future__ import annotations

import json
import math
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from scalerl.bus.kafka import KafkaBus
from scalerl.runtime.launcher import LocalCluster
from sideport_client import side_get

pytestmark = [pytest.mark.infra, pytest.mark.distributed]

DASHBOARDS = Path(__file__).resolve().parents[2] / "helm" / "scalerl" / "files" / "dashboards"
NAMESPACE = "scalerl-it"
# An evaluation after every step (the fit needs 4 points past step 0 and one above R0) on at most 200 steps:
# the run is stopped as soon as every panel has data, so the bound only has to outlast the panels' wait
# (with 40, a run whose steps trained nothing finished first). A smaller bootstrap keeps each refit short;
# 0 would leave A's interval (the forecast band) out.
RUN = {"steps": 200, "off_policy": {"mode": "pipeline", "k": 2}, "checkpoint_every": 200, "eval_every": 1,
       "partitions": 1}
ROLE_SPANS = ("curriculum.issue", "generator.generate", "verifier.score", "learner.consume")
PANELS_DEADLINE_S = 420.0
TRACE_DEADLINE_S = 120.0


@dataclass
class Run:
    job: str
    cluster: LocalCluster
    ports: dict[str, int]  # role id -> side port


def _get_json(url: str, timeout_s: float = 10.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return json.loads(r.read())


def _side_ports(cluster: LocalCluster, deadline: float) -> dict[str, int]:
    """Role id -> the side port it printed once its servers were up."""
    ports: dict[str, int] = {}
    while len(ports) < len(cluster.procs):
        for rid, proc in cluster.procs.items():
            assert proc.popen.poll() is None, f"{rid} exited ({proc.popen.returncode}):\n{cluster.tail(rid)}"
            for line in proc.log_path.read_text(errors="replace").splitlines():
                if line.startswith("{") and '"http"' in line:
                    ports[rid] = int(json.loads(line)["http"])
        if len(ports) < len(cluster.procs):
            assert time.monotonic() < deadline, f"side ports of {sorted(set(cluster.procs) - set(ports))} not up"
            time.sleep(0.5)
    return ports


@pytest.fixture(scope="module")
def run(infra: Any, observability: Any, tmp_path_factory: pytest.TempPathFactory,
        addition_run_spec: Any, mixed_start: str) -> Iterator[Run]:
    """The run, its roles exporting traces to Jaeger and listed in Prometheus's file_sd, until the module ends."""
    job = f"it-obs-{time.time_ns() % 10**10:010d}"
    spec = addition_run_spec(job, mixed_start, **RUN)
    spec = spec.model_copy(update={"fit": spec.fit.model_copy(update={"bootstrap": 20, "min_compute_fraction": 0.0})})
    env = {**infra.s3_env(), "OTEL_EXPORTER_OTLP_ENDPOINT": observability.jaeger_otlp_grpc,
           "OTEL_RESOURCE_ATTRIBUTES": f"scalerl.job={job}",
           # the side ports' /metrics ask for Prometheus's scrape token (HTTPS: the __scheme__ label below)
           "SCALERL_METRICS_TOKEN_FILE": str(observability.scrape_token_file)}
    cluster = LocalCluster(spec, tmp_path_factory.mktemp("obs") / "run", f"kafka://{infra.kafka_bootstrap}",
                           f"s3://{job}/job", generators=1, verifiers=1, env=env)
    targets = observability.file_sd / f"{job}.json"
    try:
        cluster.start_all()
        ports = _side_ports(cluster, time.monotonic() + 300)
        groups = [{"targets": [f"127.0.0.1:{port}"],
                   "labels": {"__scheme__": "https", "rljob": job, "namespace": NAMESPACE,
                              "role": cluster.procs[rid].role, "pod": rid}}
                  for rid, port in sorted(ports.items())]
        tmp = targets.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        tmp.rename(targets)  # atomically: Prometheus never reads half a file
        yield Run(job, cluster, ports)
    finally:
        targets.unlink(missing_ok=True)
        cluster.stop_all(timeout_s=30)
        bus = KafkaBus(infra.kafka_bootstrap)
        bus.delete_topics([f"{job}.{k}" for k in ("prompts", "rollouts", "scored", "policy", "metrics", "dlq")])
        bus.close()


def _panel_queries(job: str) -> list[tuple[str, str, str]]:
    """(dashboard, panel title, expr with the variables set to this run's) for every target of every panel."""
    out = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel["targets"]:
                expr = target["expr"].replace("$namespace", NAMESPACE).replace("$rljob", job)
                assert "$" not in expr, f"{path.name} {panel['title']!r}: a variable left in {expr}"
                out.append((path.stem, panel["title"], expr))
    return out


def _query(prometheus: str, expr: str) -> list[dict[str, Any]]:
    body = _get_json(f"{prometheus}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def _finite(series: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in series if math.isfinite(float(s["value"][1]))]


@pytest.mark.timeout(900)
def test_every_dashboard_panel_has_data(run: Run, observability: Any) -> None:
    queries = _panel_queries(run.job)
    assert len(queries) > 30  # both dashboards, every target
    deadline = time.monotonic() + PANELS_DEADLINE_S
    empty = queries
    while empty and time.monotonic() < deadline:
        learner = run.cluster.procs["learner-0"].popen
        assert learner.poll() is None, f"learner exited ({learner.returncode}):\n{run.cluster.tail('learner-0')}"
        time.sleep(2.0)
        empty = [q for q in empty if not _finite(_query(observability.prometheus_url, q[2]))]
    print(f"\n{len(queries)} panel queries of run {run.job}, evaluated by Prometheus:")
    results = {q: _query(observability.prometheus_url, q[2]) for q in queries}
    for (board, title, expr), series in results.items():
        shown = ", ".join(f"{{{', '.join(f'{k}={v}' for k, v in sorted(s['metric'].items()))}}} = {s['value'][1]}"
                          for s in series)
        print(f"  [{board}] {title}: {expr}\n      -> {len(series)} series: {shown or 'NONE'}")
    targets = _get_json(f"{observability.prometheus_url}/api/v1/targets")["data"]["activeTargets"]
    ours = [t for t in targets if t["labels"].get("rljob") == run.job]
    assert sorted(t["labels"]["role"] for t in ours) == ["curriculum", "generator", "learner", "verifier"]
    assert not empty, "panels without data after {:.0f} s: {}".format(
        PANELS_DEADLINE_S, "\n".join(f"[{b}] {t}: {e}" for b, t, e in empty))
    # the dashboards' variables offer this run (label_values(scalerl_learner_policy_version, namespace/rljob))
    for label, value in (("namespace", NAMESPACE), ("rljob", run.job)):
        match = urllib.parse.urlencode({"match[]": f'scalerl_learner_policy_version{{namespace=~"{NAMESPACE}"}}'})
        values = _get_json(f"{observability.prometheus_url}/api/v1/label/{label}/values?{match}")["data"]
        assert value in values, (label, values)


def _complete_chains(traces: list[dict[str, Any]], job: str) -> list[list[dict[str, Any]]]:
    """Per trace of this job: the spans curriculum.issue -> generator.generate -> verifier.score ->
    learner.consume where each is the child of the one before, with the service that wrote it."""
    chains = []
    for trace in traces:
        processes = trace["processes"]
        if not any(t["key"] == "scalerl.job" and t["value"] == job for p in processes.values()
                   for t in p.get("tags", [])):
            continue
        spans = {s["spanID"]: {**s, "service": processes[s["processID"]]["serviceName"]} for s in trace["spans"]}
        for leaf in (s for s in spans.values() if s["operationName"] == ROLE_SPANS[-1]):
            chain = [leaf]
            while len(chain) < len(ROLE_SPANS):
                parents = [r["spanID"] for r in chain[-1]["references"] if r["refType"] == "CHILD_OF"]
                parent = spans.get(parents[0]) if parents else None
                if parent is None:
                    break
                chain.append(parent)
            if [s["operationName"] for s in reversed(chain)] == list(ROLE_SPANS):
                chains.append(list(reversed(chain)))
    return chains


@pytest.mark.timeout(600)
def test_a_prompt_trace_in_jaeger_crosses_all_four_roles(run: Run, observability: Any) -> None:
    url = (f"{observability.jaeger_query_url}/api/traces?"
           + urllib.parse.urlencode({"service": "scalerl-learner", "lookback": "1h", "limit": 2000}))
    deadline = time.monotonic() + TRACE_DEADLINE_S
    chains: list[list[dict[str, Any]]] = []
    while not chains:
        assert time.monotonic() < deadline, f"no complete trace of {run.job} in Jaeger within {TRACE_DEADLINE_S:.0f} s"
        time.sleep(1.0)
        chains = _complete_chains(_get_json(url)["data"], run.job)
    chain = chains[0]
    print(f"\n{len(chains)} complete prompt traces of {run.job} in Jaeger; the first, trace {chain[0]['traceID']}:")
    for s in chain:
        print(f"  {s['service']:<20} {s['operationName']:<20} span {s['spanID']} start {s['startTime']} us")
    assert [s["service"] for s in chain] == ["scalerl-curriculum", "scalerl-generator", "scalerl-verifier",
                                             "scalerl-learner"]
    assert len({s["traceID"] for s in chain}) == 1
    starts = [s["startTime"] for s in chain]
    assert starts == sorted(starts), starts  # issued, then generated, then scored, then consumed


def _secrets(run: Run, infra: Any, observability: Any) -> dict[str, bytes]:
    """What must appear nowhere a user or a backend reads: the S3 secret key, the scrape token and every
    role's private key (the base64 body of each PEM, which any copy of the key contains)."""
    out = {"S3_SECRET_KEY": infra.s3_secret_key.encode(),
           "scrape token": observability.scrape_token_file.read_text().strip().encode()}
    for key in sorted((run.cluster.out / "tls").glob("*/tls.key")):
        body = b"".join(line for line in key.read_bytes().splitlines() if not line.startswith(b"-----"))
        out[f"{key.parent.name}'s private key"] = body[:48]
    assert len(out) == 2 + 5  # four roles and `client`
    return out


@pytest.mark.timeout(300)
def test_no_secret_in_any_output_log_metric_or_span(run: Run, observability: Any, infra: Any) -> None:
    """(Last in the module: the run has written its logs and outputs by now.)"""
    secrets = _secrets(run, infra, observability)
    found: list[str] = []
    keys = set((run.cluster.out / "tls").glob("*/tls.key"))
    files = [p for p in run.cluster.out.rglob("*") if p.is_file() and p not in keys]
    assert any(p.name.endswith(".log") for p in files) and any(p.name == "job.yaml" for p in files)
    for path in files:
        data = path.read_bytes()
        found += [f"{path.relative_to(run.cluster.out)}: {what}" for what, value in secrets.items() if value in data]
    token = observability.scrape_token_file.read_text().strip()
    for rid, port in run.ports.items():  # what Prometheus scrapes
        status, text = side_get(port, "/metrics", run.cluster.out / "tls" / run.cluster.procs[rid].role, token)
        assert status == 200, rid
        found += [f"{rid} /metrics: {what}" for what, value in secrets.items() if value in text]
    spans = 0
    for service in ("scalerl-curriculum", "scalerl-generator", "scalerl-verifier", "scalerl-learner"):
        url = (f"{observability.jaeger_query_url}/api/traces?"
               + urllib.parse.urlencode({"service": service, "lookback": "1h", "limit": 500}))
        with urllib.request.urlopen(url, timeout=30) as r:
            body = r.read()
        spans += body.count(b'"spanID"')
        found += [f"Jaeger spans of {service}: {what}" for what, value in secrets.items() if value in body]
    assert spans > 0
    assert found == [], found
