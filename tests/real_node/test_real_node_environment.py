"""The environment service on the real node: an RLJob with tools, whose verifier Pods execute tool calls over
gRPC (mutual TLS under the job's CA), scaled by the operator on how busy their execution slots are.

A burst of python calls (each sleeps 1.5 s in the Pod's sandbox) is sent to the Ready verifier Pods as the
`client` identity of the job (its Secret `J-rpc-client`, made by the operator) through `RemoteToolbox`, the
generators' own client. The verifiers publish their load on the job's metrics topic; the operator scales the
pool up (reason EnvironmentBusy, in the RLJob's status and Events) and, once the burst has stopped and the
replicas' busy windows have emptied, back down to one. Every call comes back with what its program printed.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from rljob_helpers import RLJOB_API, job_secrets, tiny_rljob, wait_logged

pytestmark = [pytest.mark.infra]

T = TypeVar("T")
NAME = "tools"
DOWN_WINDOW_S = 10
TIMEOUT_S = 180.0


def _wait(what: str, probe: Callable[[], T | None], timeout_s: float = TIMEOUT_S, every_s: float = 1.0) -> T:
    return wait_logged("environment", what, probe, timeout_s, every_s)


def _manifest(env: dict[str, str], bucket: str) -> dict[str, Any]:
    verifier = {"replicas": 1, "autoscaling": {
        "enabled": True, "minReplicas": 1, "maxReplicas": 3, "targetLagPerReplica": 100000, "targetBusyFraction": 0.5,
        "behavior": {"scaleUp": {"stabilizationWindowSeconds": 0,
                                 "policies": [{"type": "Pods", "value": 2, "periodSeconds": 1}]},
                     "scaleDown": {"stabilizationWindowSeconds": DOWN_WINDOW_S,
                                   "policies": [{"type": "Percent", "value": 100, "periodSeconds": 1}]}}}}
    manifest = tiny_rljob(NAME, bucket, env, steps=2000, roles={"generator": {"replicas": 1}, "verifier": verifier})
    spec = manifest["spec"]
    del spec["podTemplate"]  # no warm start: the learner's own short SFT (a model with room for the instructions)
    job = spec["job"]
    job["model"]["init_checkpoint"] = None
    job["model"]["tiny"]["max_positions"] = 384
    job["sft"]["steps"] = 10
    job["environment"] = {"tools": ["python"], "max_turns": 2, "max_observation_tokens": 64}
    return manifest


def _client_tls(core: Any, ns: str, folder: Path) -> Path:
    """The job's `client` certificate (Secret J-rpc-client) as a TLS folder this process can use."""
    import base64

    secret = _wait("the client certificate", lambda: _read_secret(core, ns, f"{NAME}-rpc-client"), timeout_s=60)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    for key in ("tls.crt", "tls.key", "ca.crt"):
        path = folder / key
        path.write_bytes(base64.b64decode(secret.data[key]))
        os.chmod(path, 0o600)
    return folder


def _read_secret(core: Any, ns: str, name: str) -> Any:
    from kubernetes.client.rest import ApiException

    try:
        return core.read_namespaced_secret(name, ns)
    except ApiException:
        return None


def _ready_ips(core: Any, ns: str) -> list[str]:
    pods = core.list_namespaced_pod(ns, label_selector="app.kubernetes.io/component=verifier").items
    return sorted(p.status.pod_ip for p in pods if p.metadata.deletion_timestamp is None and p.status.pod_ip and any(
        c.type == "Ready" and c.status == "True" for c in p.status.conditions or []))


class Burst:
    """Python calls to every Ready verifier Pod, 16 at a time, until stopped; each checks its output."""

    def __init__(self, core: Any, ns: str, tls: Path) -> None:
        self.core, self.ns, self.tls = core, ns, tls
        self.stop = threading.Event()
        self.answered = 0
        self.wrong: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from scalerl.environment.remote import RemoteToolbox
        from scalerl.environment.tools import ToolCall, tool_limits
        from scalerl.rpc.security import RpcSecurity

        security = RpcSecurity(str(self.tls))
        while not self.stop.is_set():
            ips = _ready_ips(self.core, self.ns)
            target = "ipv4:" + ",".join(f"{ip}:50051" for ip in ips)
            with RemoteToolbox(("python",), target, security=security, limits=tool_limits(5.0, 256), attempts=8,
                               workers=16) as tools:
                calls = [ToolCall("python", f"import time\ntime.sleep(1.5)\nprint({i} + {i})") for i in range(32)]
                out = tools.run_many(calls)
            self.wrong += [o for i, o in enumerate(out) if o != str(2 * i)]
            self.answered += len(out)


def test_real_node_verifiers_execute_tool_calls_and_scale_on_their_busy_slots(
        node_env, node_api, node_core, node_namespace, kubectl, chart, tmp_path) -> None:
    import json
    import uuid

    from kubernetes import client

    apps, custom = client.AppsV1Api(node_api), client.CustomObjectsApi(node_api)
    ns = node_namespace

    def replicas() -> int:
        return int(apps.read_namespaced_deployment_scale(f"{NAME}-verifier", ns).spec.replicas or 0)

    def scaling() -> dict[str, Any]:
        job = custom.get_namespaced_custom_object(*RLJOB_API[:2], ns, RLJOB_API[2], NAME)
        return dict(((job.get("status") or {}).get("scaling") or {}).get("verifier") or {})

    job_secrets(kubectl, ns, node_env)
    kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(_manifest(node_env, f"rn-{uuid.uuid4().hex[:8]}")))
    burst = None
    try:
        tls = _client_tls(node_core, ns, tmp_path / "client-tls")
        _wait("a Ready verifier Pod", lambda: _ready_ips(node_core, ns))
        burst = Burst(node_core, ns, tls)
        t0 = time.monotonic()
        burst.thread.start()
        up = _wait("the verifiers scaled on busy slots", lambda: (s := scaling()) and s.get("reason") ==
                   "EnvironmentBusy" and s.get("desiredReplicas", 0) >= 2 and s)
        up_s = time.monotonic() - t0
        assert "execution slots busy" in up["message"], up
        _wait("2+ verifier Pods Ready", lambda: len(_ready_ips(node_core, ns)) >= 2)
        peak = replicas()
        assert peak >= 2
        _wait("calls answered by the new Pods too", lambda: burst.answered >= 64, timeout_s=60)
        burst.stop.set()
        burst.thread.join(timeout=120)
        stopped_at = time.monotonic()
        assert not burst.thread.is_alive() and burst.answered >= 64 and not burst.wrong, burst.wrong[:3]
        _wait("1 verifier", lambda: replicas() == 1, timeout_s=150)
        down_s = time.monotonic() - stopped_at
        events = client.CoreV1Api(node_api).list_namespaced_event(ns, field_selector=f"involvedObject.name={NAME}")
        scaled = [e.message for e in events.items if e.reason == "Scaled" and (e.message or "").startswith("verifier:")]
        assert any("EnvironmentBusy" in m for m in scaled), scaled
    finally:
        if burst is not None:
            burst.stop.set()
        kubectl("delete", "rljob", "-n", ns, NAME, "--timeout=90s", check=False, timeout_s=120.0)
    print(f"\n[environment] verifiers 1 -> {peak} {up_s:.0f} s into the burst ({burst.answered} calls answered); "
          f"back to 1 {down_s:.0f} s after it stopped (busy window 30 s, scale-down window {DOWN_WINDOW_S} s)")
