"""RLJob → the desired child objects, as plain dicts. Pure: no API calls, no clock.

For an RLJob named J (labels `app.kubernetes.io/{name,instance,component,managed-by}` and
`scalerl.dev/job: J` on every object and pod):
- ConfigMap `J-spec`: `job.yaml`, the full JobSpec (spec.job + name + runtime.bus/store/partitions/weight_sync/
  pool_file), and `pool.json`, the devices the job holds with these replicas (scalerl_operator.render.devices);
  it is not part of the spec hash, so a scale change rewrites it without rolling any pod;
- Deployments `J-generator`, `J-verifier`, `J-curriculum`: `scalerl serve <role>` with gRPC on 50051
  and the side port (/healthz, /readyz, /metrics) on `telemetry.metricsPort`. Readiness is /readyz:
  a generator answers ready only once it has loaded the current policy version, so it receives no
  work before. Scale-down drains: preStop waits `PRESTOP_S` (endpoints drop the pod first), then
  SIGTERM makes the role finish or hand back its in-flight rollouts within the grace period;
- StatefulSet `J-learner` + headless Service `J-learner`: `nodes` pods under torchrun. One node:
  `torchrun --standalone` (a local rendezvous: no name to resolve, so no cluster DNS is needed). More:
  node rank = the pod ordinal (label `apps.kubernetes.io/pod-index`), master rank 0's pod FQDN
  `J-learner-0.J-learner.<namespace>.svc` (the StatefulSet's serviceName is the headless Service, which
  publishes not-ready addresses, so rank 0's name resolves before it is ready). The learner runs with
  `--when-finished wait`: after its last step it stays up (Ready, status `finished`) until the operator
  scales it down, so finishing never reads as a container restart;
- Services `J-generator`, `J-verifier` (grpc 50051, metrics) and the headless `J-environment` (the Ready
  verifier Pods, grpc): with `environment.tools`, `environment.service` points at it when the spec names no
  other, so the generators send their tool calls to the verifiers (scalerl.environment.service);
- in every role's Pods, its certificate Secret `J-rpc-<role>` (made by scalerl_operator.control.rpc_tls)
  at RPC_TLS_MOUNT, read-only, group-readable by the Pod's fsGroup: the gRPC port is mutual TLS, the side
  port HTTPS (probes with scheme HTTPS; /metrics behind the scrape token whose hash the Secret holds);
- PodDisruptionBudget `J-learner` (minAvailable = nodes; the StatefulSet updates OnDelete: the
  operator restarts and updates the torchrun group as one, scalerl_operator.control.gang).
Every container runs under `tini -g --` (`INIT`): PID 1 of a container ignores a signal it has no
handler for, so a role or torchrun as PID 1 would sit out SIGTERM until its grace period ended (torchrun
installs its handler only once its workers run). tini, PID 1 instead, forwards SIGTERM to the child's
process group, where the default action applies, and reaps zombies. Images must carry tini on PATH (the
project's image does: Debian's `tini` package, /usr/bin/tini); `command` replaces the image's ENTRYPOINT.
A pod template carries `scalerl.dev/spec-hash` (`spec_hash`): a change of spec.job rolls the pods,
which read job.yaml only at start. The hash covers only the JobSpec fields whose value differs from
the field's default (canonical JSON of `model_dump(exclude_defaults=True)`), so an operator upgrade
that adds a defaulted JobSpec field (which the upgraded CRD then fills into every stored RLJob)
renders the same hash and restarts nothing. Owner references are added by the reconciler (kopf.adopt).

Images: a role's image is roles.<role>.image, else spec.image, else the operator's default, pinned
on the children when first created (scalerl_operator.render.images). Names, labels, selectors and
topics: scalerl_operator.render.names.
Pod-template overrides (spec.podTemplate, roles.<role>.podTemplate; scalerl_operator.api.podtemplate)
are merged into every pod template: labels, annotations, scheduling fields, volumes, env, mounts.
With spec.queueName, Kueue's queue label goes on the job's Workload only (scalerl_operator.control.kueue), never on
these children: Kueue's own pod/deployment/statefulset integrations would queue each of them again.

Replica counts are an input (`replicas`), computed by `desired_replicas` from the spec and what the
cluster runs now: an autoscaled pool keeps the size the autoscaler gave it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import yaml

from scalerl.config import JobSpec, RuntimeConfig, dump_spec
from scalerl.scaling.devices import POOL_FILE
from scalerl_operator.api.infra import GRPC_PORT, TORCH_PORT
from scalerl_operator.api.spec import PodPlacement, RLJobSpec
from scalerl_operator.api.spec import RoleName as Role
from scalerl_operator.render.devices import device_pool, pool_json
from scalerl_operator.render.images import IMAGE_DEFAULTS_ANNOTATION, ImageDefaults
from scalerl_operator.render.names import (
    ROLES,
    RPC_CLIENT,
    RPC_TLS_MOUNT,
    bus_prefix,
    child_name,
    labels,
    partitions,
    rpc_secret,
    selector,
)
from scalerl_operator.render.secure import add_secure_volumes, secure_env

CONFIG_DIR = "/etc/scalerl"
JOB_FILE = f"{CONFIG_DIR}/job.yaml"
POOL_PATH = f"{CONFIG_DIR}/{POOL_FILE}"  # the job's device pool; kubelet refreshes it in the pods
WORK_DIR = "/home/scalerl"  # the image's WORKDIR and HOME (runs/<job>, caches); an emptyDir
UID = 10001  # the image's non-root user
PRESTOP_S = 5
GRACE_S = {"generator": 120, "verifier": 60, "curriculum": 60, "learner": 300}
SPEC_HASH_ANNOTATION = "scalerl.dev/spec-hash"
INIT = ["tini", "-g", "--"]  # PID 1 of every container: forwards SIGTERM, reaps zombies (module docstring)


def full_job_spec(name: str, namespace: str, spec: RLJobSpec) -> JobSpec:
    """The JobSpec the role processes run: spec.job + name + the runtime the cluster provides."""
    runtime = RuntimeConfig(bus=f"kafka://{spec.bus.bootstrap}", store=spec.store.uri, partitions=partitions(spec),
                            bus_prefix=bus_prefix(name, namespace), pool_file=POOL_PATH,
                            weight_sync=spec.weight_sync.to_config(master_addr(name, namespace)))
    job = spec.job_spec(name, runtime)
    env = job.environment
    if env.tools and not env.service:  # the verifiers serve the tool calls, found by the headless Service
        env = env.model_copy(update={"service": environment_target(name, namespace)})
        job = job.model_copy(update={"environment": env})
    return job


def environment_target(job: str, namespace: str) -> str:
    """The gRPC target of the job's environment service: every verifier Pod, by the headless Service
    `J-environment` (`dns:///`: the generators' channel spreads calls over all of them and re-resolves as
    replicas come and go)."""
    return f"dns:///{child_name(job, 'environment')}.{namespace}.svc:{GRPC_PORT}"


def job_yaml(name: str, namespace: str, spec: RLJobSpec) -> str:
    """job.yaml, the JobSpec the role processes read (every field, defaults included)."""
    return dump_spec(full_job_spec(name, namespace, spec))


def spec_hash(job: JobSpec) -> str:
    """16 hex digits of sha256 over the fields of `job` that differ from their defaults (canonical JSON:
    sorted keys). A new field at its default, or an explicitly written default, leaves it unchanged."""
    tree = job.model_dump(mode="json", exclude_defaults=True)
    return hashlib.sha256(json.dumps(tree, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]



def _clamp(n: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, n))


def desired_replicas(spec: RLJobSpec, *, live: dict[str, int | None],
                     remembered: dict[str, int | None], applied: dict[str, int | None] | None = None) -> dict[str, int]:
    """Replicas to apply per role. Suspended: all 0. A pool without autoscaling: spec replicas when
    the workload is new, or (`applied`: the spec replicas last set, status.scaling.<role>.specReplicas,
    None after a suspension) when spec.replicas changed since; else what runs now (`live`), so a
    `kubectl scale` or an external HPA/KEDA is not fought; with `autoscaling.external` a spec change
    is not applied either. An autoscaled pool: what it runs now, clamped to [min, max]; when it does
    not exist yet or comes back from suspension (0 with minReplicas > 0): the last autoscaler size
    (`remembered`, status.scaling.<role>.lastReplicas), else spec replicas, clamped."""
    if spec.suspend:
        return dict.fromkeys(ROLES, 0)
    out = {"curriculum": 1, "learner": spec.roles.learner.nodes}
    for role in ("generator", "verifier"):
        r = getattr(spec.roles, role)
        a = r.autoscaling
        if not a.enabled:
            now, last = live.get(role), (applied or {}).get(role)
            out[role] = r.replicas if now is None or last is None or (not a.external and last != r.replicas) else now
            continue
        now = live.get(role)
        if now is None or (now == 0 and a.min_replicas > 0):
            now = remembered.get(role) or r.replicas
        out[role] = _clamp(now, a.min_replicas, a.max_replicas)
    return out


def _meta(job: str, namespace: str, name: str, component: str) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": labels(job, component)}


def _workload_meta(job: str, ns: str, role: str, images: ImageDefaults) -> dict[str, Any]:
    meta = _meta(job, ns, child_name(job, role), role)
    return {**meta, "annotations": {IMAGE_DEFAULTS_ANNOTATION: images.annotation()}}


def _env(job: str, role: str, spec: RLJobSpec) -> list[dict[str, Any]]:
    def field_ref(name: str, path: str) -> dict[str, Any]:
        return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}

    env = [field_ref("POD_NAME", "metadata.name"), field_ref("POD_NAMESPACE", "metadata.namespace"),
           {"name": "HOME", "value": WORK_DIR}, {"name": "SCALERL_CACHE", "value": f"{WORK_DIR}/.cache/scalerl"},
           {"name": "PYTHONUNBUFFERED", "value": "1"}]
    if spec.store.endpoint:
        env.append({"name": "S3_ENDPOINT", "value": spec.store.endpoint})
    if (sec := spec.store.credentials_secret) is not None:
        env += [{"name": "S3_ACCESS_KEY", "valueFrom": {"secretKeyRef": {"name": sec.name, "key": sec.access_key_key}}},
                {"name": "S3_SECRET_KEY", "valueFrom": {"secretKeyRef": {"name": sec.name, "key": sec.secret_key_key}}}]
    env += secure_env(spec)
    # the role's gRPC port: mutual TLS with its certificate Secret (scalerl_operator.control.rpc_tls)
    env += [{"name": "SCALERL_RPC_TLS_DIR", "value": RPC_TLS_MOUNT},
            {"name": "SCALERL_RPC_CLIENTS", "value": ",".join([RPC_CLIENT, *spec.rpc.clients])}]
    if spec.telemetry.otlp_endpoint:
        env.append({"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": spec.telemetry.otlp_endpoint})
    env += [{"name": "OTEL_SERVICE_NAME", "value": f"scalerl-{role}"},
            {"name": "OTEL_RESOURCE_ATTRIBUTES",
             "value": f"scalerl.job={job},k8s.namespace.name=$(POD_NAMESPACE),k8s.pod.name=$(POD_NAME)"}]
    return env


def serve_args(role: str, spec: RLJobSpec) -> list[str]:
    """`scalerl serve` arguments of a role (after the `scalerl` entrypoint or `-m scalerl.cli`)."""
    return ["serve", role, "--job", JOB_FILE, "--bus", f"kafka://{spec.bus.bootstrap}", "--store", spec.store.uri,
            "--id", "$(POD_NAME)", "--grpc-port", str(GRPC_PORT), "--http-port", str(spec.telemetry.metrics_port)]


def _tolerations(r: PodPlacement) -> list[dict[str, Any]]:
    return [{k: v for k, v in t.model_dump(by_alias=True).items() if v not in ("", None)} for t in r.tolerations]


def _resources(r: PodPlacement) -> dict[str, Any]:
    return {k: v for k, v in r.resources.model_dump(by_alias=True).items() if v}


def _container(job: str, role: Role, spec: RLJobSpec, images: ImageDefaults) -> dict[str, Any]:
    metrics = spec.telemetry.metrics_port
    ports = [{"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
             {"name": "metrics", "containerPort": metrics, "protocol": "TCP"}]
    r: PodPlacement = getattr(spec.roles, role)
    return {
        "name": role, "image": spec.image_of(role, images.image),
        "imagePullPolicy": spec.image_pull_policy or images.pull_policy,
        "command": [*INIT, "scalerl"], "args": serve_args(role, spec), "env": _env(job, role, spec), "ports": ports,
        "resources": _resources(r),
        # /healthz: the process is alive; /readyz: it serves (a generator: the current policy is loaded)
        # HTTPS: the side port serves the role's certificate (scalerl.rpc.sidetls); the kubelet verifies none
        "startupProbe": {"httpGet": {"path": "/healthz", "port": "metrics", "scheme": "HTTPS"}, "periodSeconds": 5,
                         "failureThreshold": 120},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "metrics", "scheme": "HTTPS"}, "periodSeconds": 10,
                          "timeoutSeconds": 5, "failureThreshold": 6},
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics", "scheme": "HTTPS"}, "periodSeconds": 5,
                           "timeoutSeconds": 3, "failureThreshold": 3},
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_S}}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "job-spec", "mountPath": CONFIG_DIR, "readOnly": True},
                         {"name": "work", "mountPath": WORK_DIR}, {"name": "tmp", "mountPath": "/tmp"}],
    }


def _pod_template(job: str, role: Role, spec: RLJobSpec, images: ImageDefaults, hashed: str,
                  container: dict[str, Any]) -> dict[str, Any]:
    r: PodPlacement = getattr(spec.roles, role)
    over = spec.pod_template_of(role, images.pull_secrets)
    volumes: list[dict[str, Any]] = [
        {"name": "job-spec", "configMap": {"name": child_name(job, "spec"), "items": [
            {"key": "job.yaml", "path": "job.yaml"}, {"key": POOL_FILE, "path": POOL_FILE}]}},
        {"name": "work", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}]
    add_secure_volumes(spec, volumes, container)
    volumes.append({"name": "rpc-tls", "secret": {"secretName": rpc_secret(job, role), "defaultMode": 0o440}})
    container["volumeMounts"].append({"name": "rpc-tls", "mountPath": RPC_TLS_MOUNT, "readOnly": True})
    if role == "learner":  # NCCL / torch.distributed use shared memory between the ranks of a pod
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
        container["volumeMounts"].append({"name": "dshm", "mountPath": "/dev/shm"})
    container["env"] += over.get("env", [])
    container["volumeMounts"] += over.get("volumeMounts", [])
    volumes += over.get("volumes", [])
    pod: dict[str, Any] = {
        "terminationGracePeriodSeconds": GRACE_S[role], "enableServiceLinks": False,
        "automountServiceAccountToken": False,  # no role talks to the API server: no token in its Pods
        "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID, "fsGroup": UID,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container], "volumes": volumes}
    if r.node_selector:
        pod["nodeSelector"] = dict(r.node_selector)
    if r.tolerations:
        pod["tolerations"] = _tolerations(r)
    for key in ("serviceAccountName", "imagePullSecrets", "affinity", "topologySpreadConstraints",
                "priorityClassName", "runtimeClassName", "schedulerName"):
        if key in over:
            pod[key] = over[key]
    # the override cannot name the operator's labels and annotations (podtemplate.RESERVED_*)
    return {"metadata": {"labels": {**over.get("labels", {}), **labels(job, role)},
                         "annotations": {**over.get("annotations", {}), SPEC_HASH_ANNOTATION: hashed,
                                         "prometheus.io/scrape": "true",
                                         "prometheus.io/port": str(spec.telemetry.metrics_port),
                                         "prometheus.io/scheme": "https"}},
            "spec": pod}


def _deployment(job: str, ns: str, role: Role, spec: RLJobSpec, replicas: int, hashed: str,
                images: ImageDefaults) -> dict[str, Any]:
    # generators hold GPUs: replace in place (no surge pod that may not fit); the curriculum owns the
    # prompt pool, so never two at once; verifiers are CPU pods and may surge
    strategy: dict[str, Any] = {"type": "Recreate"} if role == "curriculum" else {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1} if role == "generator"
        else {"maxSurge": 1, "maxUnavailable": 0}}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _workload_meta(job, ns, role, images),
            "spec": {"replicas": replicas, "selector": {"matchLabels": selector(job, role)}, "strategy": strategy,
                     "template": _pod_template(job, role, spec, images, hashed,
                                               _container(job, role, spec, images))}}


def master_addr(job: str, namespace: str) -> str:
    """Rank 0's pod FQDN through the headless Service (the StatefulSet's serviceName): it resolves from any
    pod with the cluster's DNS search path, and before rank 0 is Ready (publishNotReadyAddresses)."""
    name = child_name(job, "learner")
    return f"{name}-0.{name}.{namespace}.svc"


def learner_command(job: str, namespace: str, spec: RLJobSpec) -> list[str]:
    """torchrun under tini: one node `--standalone` (nothing to resolve); several, rank from the pod ordinal
    and rank 0's FQDN as master. The learner waits after its last step (`--when-finished wait`)."""
    lr = spec.roles.learner
    where = ["--standalone", "--nnodes", "1"] if lr.nodes == 1 else [
        "--nnodes", str(lr.nodes), "--node_rank", "$(NODE_RANK)", "--master_addr", master_addr(job, namespace),
        "--master_port", str(TORCH_PORT)]
    return [*INIT, "torchrun", *where, "--nproc_per_node", str(lr.devices_per_node), "-m", "scalerl.cli",
            *serve_args("learner", spec), "--when-finished", "wait"]


def _learner(job: str, ns: str, spec: RLJobSpec, replicas: int, hashed: str, images: ImageDefaults) -> dict[str, Any]:
    c = _container(job, "learner", spec, images)
    c["command"] = learner_command(job, ns, spec)
    del c["args"]
    c["env"].insert(0, {"name": "NODE_RANK", "valueFrom": {
        "fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}}})
    c["ports"].append({"name": "torch", "containerPort": TORCH_PORT, "protocol": "TCP"})
    if spec.weight_sync.broadcast.enabled:  # the weights' rendezvous (scalerl.weightsync.broadcast)
        c["ports"].append({"name": "weights", "containerPort": spec.weight_sync.broadcast.port, "protocol": "TCP"})
    name = child_name(job, "learner")
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": _workload_meta(job, ns, "learner", images),
            "spec": {"replicas": replicas, "serviceName": name, "podManagementPolicy": "Parallel",
                     "updateStrategy": {"type": "OnDelete"},  # the operator recreates the group (control/gang.py)
                     "selector": {"matchLabels": selector(job, "learner")},
                     "template": _pod_template(job, "learner", spec, images, hashed, c)}}


def _service(job: str, ns: str, role: str, spec: RLJobSpec, *, headless: bool = False) -> dict[str, Any]:
    ports = [{"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc", "protocol": "TCP"},
             {"name": "metrics", "port": spec.telemetry.metrics_port, "targetPort": "metrics", "protocol": "TCP"}]
    svc: dict[str, Any] = {"selector": selector(job, role), "ports": ports}
    if headless:
        ports.append({"name": "torch", "port": TORCH_PORT, "targetPort": "torch", "protocol": "TCP"})
        svc.update(clusterIP="None", publishNotReadyAddresses=True)
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(job, ns, child_name(job, role), role),
            "spec": svc}


def render(name: str, namespace: str, spec: RLJobSpec, replicas: dict[str, int],
           images: ImageDefaults | None = None) -> list[dict[str, Any]]:
    """Every child of the RLJob, in apply order (the ConfigMap first: the pods mount it). `images`: the
    operator's image defaults for this job (`pinned_image_defaults`); None = ImageDefaults()."""
    images = images or ImageDefaults()
    job = full_job_spec(name, namespace, spec)
    hashed = spec_hash(job)
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(name, namespace, child_name(name, "spec"), "spec"),
          "data": {"job.yaml": dump_spec(job), POOL_FILE: pool_json(device_pool(spec, replicas))}}
    roles: tuple[Role, ...] = ("curriculum", "generator", "verifier")
    return [cm,
            *(_deployment(name, namespace, role, spec, replicas[role], hashed, images) for role in roles),
            _service(name, namespace, "learner", spec, headless=True),
            _learner(name, namespace, spec, replicas["learner"], hashed, images),
            _service(name, namespace, "generator", spec), _service(name, namespace, "verifier", spec),
            environment_service(name, namespace),
            learner_pdb(name, namespace, spec)]


def environment_service(job: str, ns: str) -> dict[str, Any]:
    """Headless Service `J-environment`: the verifier Pods that are Ready, by address (one DNS record each),
    for the generators' tool calls (`environment_target`)."""
    meta = _meta(job, ns, child_name(job, "environment"), "environment")
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta,
            "spec": {"selector": selector(job, "verifier"), "clusterIP": "None",
                     "ports": [{"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc", "protocol": "TCP"}]}}


def learner_pdb(job: str, ns: str, spec: RLJobSpec) -> dict[str, Any]:
    """PodDisruptionBudget `J-learner`: no voluntary eviction of any rank (one would cost the whole torchrun
    group); not-ready ranks may still be evicted (unhealthyPodEvictionPolicy AlwaysAllow)."""
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": _meta(job, ns, child_name(job, "learner"), "learner"),
            "spec": {"minAvailable": spec.roles.learner.nodes, "selector": {"matchLabels": selector(job, "learner")},
                     "unhealthyPodEvictionPolicy": "AlwaysAllow"}}


def parse_job_yaml(text: str) -> dict[str, Any]:
    """The mapping in a rendered job.yaml (tests and the reconciler read it back)."""
    out = yaml.safe_load(text)
    if not isinstance(out, dict):
        raise ValueError("job.yaml: the top level must be a mapping")
    return out
