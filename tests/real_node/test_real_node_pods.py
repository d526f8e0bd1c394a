"""The real node runs Pods of the project's image as a cluster would (scripts/infra/node.sh): under the
restricted Pod Security Standard with a read-only root, a ConfigMap read from a mounted volume, an
emptyDir written, Service names resolved by the cluster DNS, the API server reached from a Pod, fake GPUs
scheduled, a crashed container restarted by the kubelet and a memory limit enforced by the kernel.

Each expected value is computed outside the Pod (a random token, the API server's own /version, the
package version in pyproject.toml) and read back from the Pod's log.
"""

from __future__ import annotations

import json
import time
import tomllib
import uuid
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.infra]

REPO = Path(__file__).resolve().parents[2]
POD_TIMEOUT_S = 180.0
RESTRICTED = {"runAsNonRoot": True, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
              "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


def pod(name: str, image: str, script: str, *, restart: str = "Never", resources: dict[str, Any] | None = None,
        volumes: list[dict[str, Any]] | None = None, mounts: list[dict[str, Any]] | None = None,
        ports: list[int] = (), labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Pod running `python -c script` in the project's image under tini, restricted, /scratch an emptyDir."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"app": name}},
        "spec": {
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 2,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "main", "image": image, "imagePullPolicy": "Never",
                "command": ["tini", "-g", "--", "python", "-c", script],
                "securityContext": RESTRICTED,
                "resources": resources or {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}},
                "ports": [{"containerPort": p} for p in ports],
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}, *(mounts or [])],
            }],
            "volumes": [{"name": "scratch", "emptyDir": {}}, *(volumes or [])],
        },
    }


def wait_pod(core: Any, ns: str, name: str, done: Any, what: str, timeout_s: float = POD_TIMEOUT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    p = None
    while time.monotonic() < deadline:
        p = core.read_namespaced_pod(name, ns)
        if done(p):
            return p
        time.sleep(0.5)
    events = core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
    raise AssertionError(f"pod {name}: not {what} after {timeout_s:.0f}s; status {p.status if p else None}; "
                         f"events {[(e.reason, e.message) for e in events]}")


def succeeded(core: Any, ns: str, name: str) -> str:
    """Waits for the Pod to finish; its log (it must have succeeded)."""
    p = wait_pod(core, ns, name, lambda p: p.status.phase in ("Succeeded", "Failed"), "finished")
    log = core.read_namespaced_pod_log(name, ns)
    assert p.status.phase == "Succeeded", f"pod {name} failed: {p.status.container_statuses}; log:\n{log}"
    return str(log)


def test_real_node_runs_the_image_restricted_with_config_and_scratch(node_env, node_core, node_namespace) -> None:
    token = uuid.uuid4().hex
    node_core.create_namespaced_config_map(node_namespace, {
        "metadata": {"name": "job"}, "data": {"job.yaml": f"token: {token}\n"}})
    script = """
import json, os, pathlib, scalerl
job = pathlib.Path('/etc/scalerl/job.yaml').read_text()
pathlib.Path('/scratch/out').write_text(job)
try:
    pathlib.Path('/opt/scalerl/x').write_text('x'); root = 'writable'
except OSError as e:
    root = type(e).__name__
print(json.dumps({'job': pathlib.Path('/scratch/out').read_text(), 'uid': os.getuid(), 'root': root,
                  'version': scalerl.__version__, 'pid1': pathlib.Path('/proc/1/comm').read_text().strip()}))
"""
    node_core.create_namespaced_pod(node_namespace, pod(
        "image", node_env["NODE_IMAGE"], script,
        volumes=[{"name": "job", "configMap": {"name": "job"}}],
        mounts=[{"name": "job", "mountPath": "/etc/scalerl", "readOnly": True}]))
    out = json.loads(succeeded(node_core, node_namespace, "image").strip().splitlines()[-1])
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert out == {"job": f"token: {token}\n", "uid": 10001, "root": "OSError", "version": version, "pid1": "tini"}
    p = node_core.read_namespaced_pod("image", node_namespace)
    assert p.spec.node_name == node_env["NODE_NAME"]


def test_real_node_service_names_resolve_and_the_api_server_answers(node_env, node_api, node_core,
                                                                   node_namespace) -> None:
    from kubernetes import client

    token = uuid.uuid4().hex
    node_core.create_namespaced_config_map(node_namespace, {"metadata": {"name": "page"}, "data": {"token.txt": token}})
    node_core.create_namespaced_pod(node_namespace, pod(
        "web", node_env["NODE_IMAGE"],
        "import http.server, functools, os; os.chdir('/page'); "
        "http.server.ThreadingHTTPServer(('', 8080), http.server.SimpleHTTPRequestHandler).serve_forever()",
        restart="Always", ports=[8080], volumes=[{"name": "page", "configMap": {"name": "page"}}],
        mounts=[{"name": "page", "mountPath": "/page", "readOnly": True}]))
    node_core.create_namespaced_service(node_namespace, {
        "metadata": {"name": "web"}, "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}})
    wait_pod(node_core, node_namespace, "web", lambda p: any(c.ready for c in p.status.container_statuses or []),
             "ready")
    script = f"""
import json, socket, ssl, time, urllib.request
out = {{}}
for name in ('web', 'web.{node_namespace}.svc.cluster.local', 'kubernetes.default.svc'):
    out[name] = socket.gethostbyname(name)
for _ in range(60):  # the Service's endpoints reach kube-proxy a moment after the Pod is Ready
    try:
        out['page'] = urllib.request.urlopen('http://web/token.txt', timeout=2).read().decode(); break
    except OSError:
        time.sleep(0.5)
sa = '/var/run/secrets/kubernetes.io/serviceaccount'
req = urllib.request.Request('https://kubernetes.default.svc/version',
                             headers={{'Authorization': 'Bearer ' + open(sa + '/token').read()}})
ctx = ssl.create_default_context(cafile=sa + '/ca.crt')
out['api'] = json.load(urllib.request.urlopen(req, context=ctx, timeout=5))['gitVersion']
print(json.dumps(out))
"""
    node_core.create_namespaced_pod(node_namespace, pod("client", node_env["NODE_IMAGE"], script))
    out = json.loads(succeeded(node_core, node_namespace, "client").strip().splitlines()[-1])
    svc = node_core.read_namespaced_service("web", node_namespace)
    api_svc = node_core.read_namespaced_service("kubernetes", "default")
    assert out["web"] == svc.spec.cluster_ip
    assert out[f"web.{node_namespace}.svc.cluster.local"] == svc.spec.cluster_ip
    assert out["kubernetes.default.svc"] == api_svc.spec.cluster_ip
    assert out["page"] == token
    assert out["api"] == client.VersionApi(node_api).get_code().git_version


def test_real_node_schedules_fake_gpus_and_leaves_an_oversized_request_pending(node_env, node_core,
                                                                                node_namespace) -> None:
    gpus = int(node_env["NODE_GPUS"])
    node = node_core.read_node(node_env["NODE_NAME"])
    assert node.status.allocatable["nvidia.com/gpu"] == str(gpus)
    one = pod("gpu", node_env["NODE_IMAGE"], "print('ran')")
    one["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1"
    too_many = pod("too-many", node_env["NODE_IMAGE"], "print('ran')")
    too_many["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = str(gpus + 1)
    node_core.create_namespaced_pod(node_namespace, one)
    node_core.create_namespaced_pod(node_namespace, too_many)
    assert succeeded(node_core, node_namespace, "gpu").strip() == "ran"
    p = wait_pod(node_core, node_namespace, "too-many",
                 lambda p: any(c.type == "PodScheduled" and c.reason == "Unschedulable"
                               for c in p.status.conditions or []), "unschedulable")
    assert p.status.phase == "Pending" and not p.spec.node_name


def test_real_node_kubelet_restarts_a_crashed_container(node_env, node_core, node_namespace) -> None:
    script = """
import pathlib, sys, time
p = pathlib.Path('/scratch/runs')
n = int(p.read_text()) + 1 if p.exists() else 1
p.write_text(str(n))
print('run', n, flush=True)
if n == 1:
    sys.exit(3)
time.sleep(3600)
"""
    node_core.create_namespaced_pod(node_namespace, pod("crash", node_env["NODE_IMAGE"], script, restart="Always"))
    p = wait_pod(node_core, node_namespace, "crash",
                 lambda p: any(c.restart_count >= 1 and c.state.running for c in p.status.container_statuses or []),
                 "restarted and running")
    c = p.status.container_statuses[0]
    assert c.restart_count == 1 and c.last_state.terminated.exit_code == 3
    assert node_core.read_namespaced_pod_log("crash", node_namespace).strip() == "run 2"  # the emptyDir survived
    assert node_core.read_namespaced_pod_log("crash", node_namespace, previous=True).strip() == "run 1"


def test_real_node_enforces_a_memory_limit(node_env, node_core, node_namespace) -> None:
    touch_512_mib = "b = bytearray(512 * 2**20); b[::4096] = b'x' * len(b[::4096]); print('survived')"
    hog = pod("hog", node_env["NODE_IMAGE"], touch_512_mib,
              resources={"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "96Mi"}})
    node_core.create_namespaced_pod(node_namespace, hog)
    p = wait_pod(node_core, node_namespace, "hog", lambda p: p.status.phase in ("Succeeded", "Failed"), "finished")
    term = p.status.container_statuses[0].state.terminated
    assert p.status.phase == "Failed" and term.reason == "OOMKilled", p.status.container_statuses
