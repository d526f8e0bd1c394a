"""A user's first day, for real: `helm install` of our chart (the operator a Deployment of our image), the
test servers exposed to the cluster as Services, `kubectl apply` of an RLJob of the tiny model, and its
roles run as Pods on the real node (restricted Pod Security, SASL_SSL to Kafka, S3 through a Service name)
until the job is `Succeeded`, its status filled and its summary and report kept in the store, fetched
with the documented command (`scalerl fetch-run`).

The expected values come from elsewhere than the status under test: the job's own summary.json in the
store, the Pods' node and restart counts from the API server, the checkpoints listed in MinIO.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from rljob_helpers import RELEASE, SYSTEM_NS, minio_client, start_job, wait_job

pytestmark = [pytest.mark.infra]

STEPS = 24
TRAIN_TIMEOUT_S = 1200.0


def test_real_node_helm_install_then_rljob_trains_to_succeeded(node_env, node_api, node_core, node_namespace,
                                                               kubectl, chart, mixed_start, tmp_path) -> None:
    from kubernetes import client

    custom = client.CustomObjectsApi(node_api)
    # the operator runs as a Pod of our image on the real node, and the chart's `helm test` passes
    op = node_core.list_namespaced_pod(SYSTEM_NS, label_selector="app.kubernetes.io/component=operator").items
    assert op and all(p.spec.node_name == node_env["NODE_NAME"] and p.status.phase == "Running" for p in op)
    test = subprocess.run([*chart["helm"], "test", RELEASE, "--logs", "--timeout", "120s"], capture_output=True,
                          text=True, timeout=180)
    assert test.returncode == 0, f"helm test failed: {test.stdout}\n{test.stderr}"
    assert re.search(r"Phase:\s+Succeeded", test.stdout) and not re.search(r"Phase:\s+Failed", test.stdout)

    name = "tiny"
    t0 = time.monotonic()
    bucket = start_job(kubectl, node_namespace, node_env, mixed_start, name, steps=STEPS)
    job = wait_job(custom, node_namespace, name, lambda j: j.get("status", {}).get("phase") in ("Succeeded", "Failed"),
                   "finished", TRAIN_TIMEOUT_S)
    train_s = time.monotonic() - t0
    status = job["status"]
    assert status["phase"] == "Succeeded", json.dumps(status, indent=1)
    print(f"\nhelm install --wait: {chart['install_s']:.1f} s; kubectl apply -> Succeeded: {train_s:.0f} s "
          f"({STEPS} steps)")

    # every role ran as a Pod of the real node, and the finished learner was not restarted
    pods = node_core.list_namespaced_pod(node_namespace).items
    roles = {p.metadata.labels.get("app.kubernetes.io/component") for p in pods}
    assert all(p.spec.node_name == node_env["NODE_NAME"] for p in pods)
    assert status["restarts"] == 0
    assert status["learnerStep"] == STEPS and status["policyVersion"] >= STEPS

    # what the learner left in the store: checkpoints, and the run's files under run/, fetched as a user would
    objects = [o.object_name for o in minio_client(node_env).list_objects(bucket, prefix=f"{name}/", recursive=True)]
    assert any("/checkpoints/" in o for o in objects), objects
    report = status["report"]
    out = tmp_path / "run"
    s3 = {"S3_ENDPOINT": node_env["S3_ENDPOINT"], "S3_ACCESS_KEY": node_env["S3_ACCESS_KEY"],
          "S3_SECRET_KEY": node_env["S3_SECRET_KEY"], "S3_REGION": "us-east-1"}
    fetched = subprocess.run([sys.executable, "-m", "scalerl.cli", "fetch-run", report["uri"], "--out", str(out)],
                             capture_output=True, text=True, timeout=120, env={**os.environ, **s3})
    assert fetched.returncode == 0, fetched.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert (out / "report.html").read_text().lstrip().lower().startswith("<!doctype html")
    # the status says what the run's own summary says
    assert status["passRate"] == pytest.approx(_final_pass_rate(summary), abs=1e-6)
    assert status["staleness"]["bound"] == 2 and 0 <= status["staleness"]["current"] <= 2
    if summary.get("fit"):
        assert status["fit"]["A"] == pytest.approx(summary["fit"]["A"])
    else:  # a fit the learner refused is absent from the status too, never made up
        assert status.get("fit") is None
    assert roles >= {"learner", "generator", "verifier", "curriculum"}

    # the roles' endpoints were mutual TLS with the operator's certificates, behind the job's NetworkPolicy,
    # and no secret reached the run's files
    for identity in ("ca", "learner", "generator", "verifier", "curriculum", "client"):
        assert node_core.read_namespaced_secret(f"{name}-rpc-{identity}", node_namespace).data, identity
    # the side port: probes over HTTPS, and each role's Secret holds the scrape token's hash, never the token
    token = Path(node_env["PROMETHEUS_SCRAPE_TOKEN_FILE"]).read_text().strip()
    for role in ("learner", "generator", "verifier", "curriculum"):
        data = node_core.read_namespaced_secret(f"{name}-rpc-{role}", node_namespace).data
        digest = base64.b64decode(data["metrics-token.sha256"]).decode().strip()
        assert digest == hashlib.sha256(token.encode()).hexdigest() and token not in str(data), role
    policy = client.NetworkingV1Api(node_api).read_namespaced_network_policy(f"{name}-roles", node_namespace)
    assert policy.spec.policy_types == ["Ingress"]
    secrets = {**{k: node_env[k] for k in ("S3_SECRET_KEY", "KAFKA_SASL_PASSWORD")}, "scrape token": token}
    leaks = [f"{p.name}: {k}" for p in out.iterdir() if p.is_file() for k, v in secrets.items()
             if v and v.encode() in p.read_bytes()]
    assert sorted(p.name for p in out.iterdir()) and leaks == []


def _final_pass_rate(summary: dict[str, Any]) -> float:
    for key in ("final_pass_rate", "pass_rate"):
        if isinstance(summary.get(key), int | float):
            return float(summary[key])
    evals = summary.get("evals") or summary.get("eval") or []
    assert evals, f"summary.json has no pass rate: {sorted(summary)}"
    return float(evals[-1]["pass_rate"])
