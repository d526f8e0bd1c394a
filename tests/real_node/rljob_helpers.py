"""What the RLJob tests on the real node share: the test servers exposed to the cluster as Services (as
teams point at a managed Kafka and S3), the chart installed with `helm install`, and an RLJob of the
tiny model whose roles run as Pods of the project's image.

Services, in namespace `scalerl-infra`, selector-less with an EndpointSlice at the host's address:
`kafka` (9093: the broker's PODS listener, SASL_SSL with the test CA), `s3` (9000: MinIO) and `jaeger`
(4317: Jaeger's OTLP/gRPC receiver for Pods, when build/infra.env has JAEGER_PODS_OTLP_GRPC).
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
INFRA_NS = "scalerl-infra"
RELEASE = "scalerl"
SYSTEM_NS = "scalerl-system"
KAFKA_SVC = f"kafka.{INFRA_NS}.svc:9093"
S3_SVC = f"http://s3.{INFRA_NS}.svc:9000"
JAEGER_OTLP_SVC = f"http://jaeger.{INFRA_NS}.svc:4317"
RLJOB_API = ("scalerl.dev", "v1alpha1", "rljobs")

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def _port(hostport: str) -> int:
    return int(hostport.rsplit(":", 1)[1].rstrip("/"))


def expose_infra(kubectl: Kubectl, env: dict[str, str]) -> None:
    """The `kafka` and `s3` Services of `scalerl-infra`, pointing at the host's listeners (applied again
    each session: the ports may change when a server restarts)."""
    host = env["NODE_HOST_IP"]
    services = {"kafka": (9093, _port(env["KAFKA_PODS_BOOTSTRAP"])), "s3": (9000, _port(env["S3_PODS_ENDPOINT"]))}
    if env.get("JAEGER_PODS_OTLP_GRPC"):
        services["jaeger"] = (4317, _port(env["JAEGER_PODS_OTLP_GRPC"]))
    docs: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": INFRA_NS}}]
    for name, (port, target) in services.items():
        docs.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": INFRA_NS},
                     "spec": {"ports": [{"name": "tcp", "port": port, "targetPort": target, "protocol": "TCP"}]}})
        docs.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                     "metadata": {"name": f"{name}-host", "namespace": INFRA_NS,
                                  "labels": {"kubernetes.io/service-name": name}},
                     "addressType": "IPv4", "endpoints": [{"addresses": [host]}],
                     "ports": [{"name": "tcp", "port": target, "protocol": "TCP"}]})
    kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(d) for d in docs))


def job_secrets(kubectl: Kubectl, ns: str, env: dict[str, str]) -> None:
    """`kafka-auth` (SASL user, password, the test CA) and `s3-creds` in the job's namespace."""
    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    secrets = [
        {"name": "kafka-auth", "data": {"user": env["KAFKA_SASL_USERNAME"], "pass": env["KAFKA_SASL_PASSWORD"],
                                        "ca.crt": Path(env["KAFKA_SSL_CAFILE"]).read_text()}},
        {"name": "s3-creds", "data": {"accessKey": env["S3_ACCESS_KEY"], "secretKey": env["S3_SECRET_KEY"]}},
    ]
    docs = [{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": s["name"], "namespace": ns},
             "data": {k: b64(v) for k, v in s["data"].items()}} for s in secrets]
    kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(d) for d in docs))


WARM_START_MOUNT = "/models/warm"


def warm_start_config_map(kubectl: Kubectl, ns: str, folder: str) -> None:
    """The mixed-reward warm start (tests/warm_start.py, ~0.5 MB) as ConfigMap `warm-start` (binaryData),
    as a team mounts its own starting model."""
    files = {p.name: base64.b64encode(p.read_bytes()).decode() for p in sorted(Path(folder).iterdir()) if p.is_file()}
    kubectl("apply", "--server-side", "-n", ns, "-f", "-", input=json.dumps(  # (too big for a last-applied annotation)
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "warm-start"}, "binaryData": files}))


def tiny_rljob(name: str, bucket: str, env: dict[str, str], *, steps: int, k: int = 2, partitions: int = 2,
               **spec_over: Any) -> dict[str, Any]:
    """An RLJob of the tests' addition job (`warm_start.addition_spec`: a 64-wide tiny model built from a
    config, 1-digit sums), starting from the warm start of ConfigMap `warm-start` mounted in every Pod,
    `steps` learner steps, off-policy bound `k`, the test servers as its bus (`partitions` per data topic)
    and store through the Services above."""
    from scalerl_operator.api.crd import JOB_EXCLUDED_FIELDS
    from warm_start import addition_spec

    job = addition_spec(name, WARM_START_MOUNT, steps=steps, off_policy={"mode": "pipeline", "k": k},
                        checkpoint_every=6, eval_every=6).model_dump(mode="json", exclude=set(JOB_EXCLUDED_FIELDS))
    spec: dict[str, Any] = {
        "job": job,
        "image": env["NODE_IMAGE"],
        "imagePullPolicy": "Never",
        "podTemplate": {"volumes": [{"name": "warm-start", "configMap": {"name": "warm-start"}}],
                        "volumeMounts": [{"name": "warm-start", "mountPath": WARM_START_MOUNT, "readOnly": True}]},
        "bus": {"bootstrap": KAFKA_SVC, "partitions": partitions,
                "security": {"protocol": "SASL_SSL", "saslMechanism": env["KAFKA_SASL_MECHANISM"],
                             "secretRef": {"name": "kafka-auth", "usernameKey": "user", "passwordKey": "pass",
                                           "caKey": "ca.crt"}}},
        "store": {"uri": f"s3://{bucket}/{name}", "endpoint": S3_SVC, "region": "us-east-1",
                  "credentialsSecret": {"name": "s3-creds"}},
        "roles": {"generator": {"replicas": 1}, "verifier": {"replicas": 1}},
        "activeDeadlineSeconds": 1500,
    }
    spec.update(spec_over)
    return {"apiVersion": "scalerl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": name}, "spec": spec}


def wait_job(custom: Any, ns: str, name: str, done: Callable[[dict[str, Any]], bool], what: str,
             timeout_s: float) -> dict[str, Any]:
    """Polls the RLJob until `done(job)`; on timeout, fails with its status."""
    deadline = time.monotonic() + timeout_s
    job: dict[str, Any] = {}
    while time.monotonic() < deadline:
        job = custom.get_namespaced_custom_object(*RLJOB_API[:2], ns, RLJOB_API[2], name)
        if done(job):
            return job
        time.sleep(2.0)
    raise AssertionError(f"RLJob {ns}/{name}: not {what} after {timeout_s:.0f} s; status "
                         f"{json.dumps(job.get('status'), indent=1)[:4000]}")


def minio_client(env: dict[str, str]) -> Any:
    """MinIO as the tests see it (loopback), to list what the job's Pods wrote."""
    from minio import Minio

    return Minio(env["S3_ENDPOINT"].removeprefix("http://"), access_key=env["S3_ACCESS_KEY"],
                 secret_key=env["S3_SECRET_KEY"], secure=False, region="us-east-1")


def start_job(kubectl: Kubectl, ns: str, env: dict[str, str], warm_start: str, name: str, *, steps: int,
              **spec_over: Any) -> str:
    """Secrets, the warm start's ConfigMap and the RLJob `name` applied in `ns`; its bucket (new)."""
    import uuid

    bucket = f"rn-{uuid.uuid4().hex[:8]}"
    job_secrets(kubectl, ns, env)
    warm_start_config_map(kubectl, ns, warm_start)
    kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(tiny_rljob(name, bucket, env, steps=steps, **spec_over)))
    return bucket


def wait_logged(tag: str, what: str, probe: Callable[[], T | None], timeout_s: float, every_s: float = 0.5) -> T:
    """Polls `probe` until it returns something true (returned), printing `[tag] HH:MM:SS what` when it does;
    fails after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = probe()
        if got:
            print(f"\n[{tag}] {time.strftime('%H:%M:%S')} {what}", end="")
            return got
        time.sleep(every_s)
    raise AssertionError(f"not {what} after {timeout_s:.0f} s")
