"""Shared pieces of the tests that drive the chart with the real helm client (test_helm.py,
test_helm_upgrade.py): the helm binary scripts/infra builds, and the operator run as a local process
with the command, arguments and environment of the chart's operator Deployment (no kubelet runs on the
test API server, so no pod does)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "scalerl"
INFRA_ENV = REPO / "build" / "infra.env"
OPERATOR_COMMAND = ["tini", "-g", "--", "python", "-m", "scalerl_operator"]  # the chart's operator container command
STOP_TIMEOUT_S = 30.0  # the chart's terminationGracePeriodSeconds


def infra_value(key: str) -> str | None:
    """A setting of the test servers: the environment first, then build/infra.env (scripts/infra/up.sh)."""
    if os.environ.get(key):
        return os.environ[key]
    if INFRA_ENV.is_file():
        for line in INFRA_ENV.read_text().splitlines():
            name, sep, value = line.partition("=")
            if sep and name.strip() == key:
                return value.strip().strip('"')
    return None


def helm_bin() -> Path:
    """The helm client scripts/infra builds (HELM_BIN); missing fails in CI and skips elsewhere."""
    value = infra_value("HELM_BIN")
    if value and Path(value).is_file():
        return Path(value)
    why = f"no helm client: HELM_BIN={value!r} (run `make infra-up`, which builds it into the cache)"
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


def run_helm(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm_bin()), *args], capture_output=True, text=True, timeout=180, check=False,
                          env={**os.environ, "HELM_CACHE_HOME": str(REPO / "build" / "helm" / "cache"),
                               "HELM_CONFIG_HOME": str(REPO / "build" / "helm" / "config"),
                               "HELM_DATA_HOME": str(REPO / "build" / "helm" / "data")})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def container_env(container: dict[str, Any], *, pod_name: str, namespace: str) -> dict[str, str]:
    """The container's environment as the kubelet would set it (literal values, where the API server
    drops an empty one; the downward API's metadata.name and metadata.namespace of its pod); any other
    source fails the test."""
    fields = {"metadata.name": pod_name, "metadata.namespace": namespace}
    env = {}
    for item in container.get("env") or []:
        if "valueFrom" not in item:
            env[item["name"]] = str(item.get("value", ""))
        else:
            field = ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
            assert field in fields, f"env {item['name']}: a source this test cannot provide: {item}"
            env[item["name"]] = fields[field]
    return env


def operator_env(container: dict[str, Any], *, pod_name: str, namespace: str, kubeconfig: str,
                 mounts: Path) -> dict[str, str]:
    """What the operator process gets: exactly the container's environment, plus KUBECONFIG (in place of
    the ServiceAccount token a pod would have), PATH and this checkout's sources on PYTHONPATH. A variable
    naming a file under one of the container's volume mounts (the scrape token's Secret) names the same
    file under `mounts/<volume>/` instead, made with a test value when absent."""
    paths = [str(REPO / "services"), str(REPO / "operators")]
    env = container_env(container, pod_name=pod_name, namespace=namespace)
    for m in container.get("volumeMounts") or []:
        root = m["mountPath"].rstrip("/") + "/"
        for key, value in env.items():
            if value.startswith(root):
                local = mounts / m["name"] / value[len(root):]
                local.parent.mkdir(parents=True, exist_ok=True)
                if not local.exists():
                    local.write_text(f"test-{m['name']}-{local.name}\n")
                env[key] = str(local)
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": os.pathsep.join(paths),
            **env, "KUBECONFIG": kubeconfig}


def health_port(container: dict[str, Any]) -> int:
    return int(next(p["containerPort"] for p in container["ports"] if p["name"] == "health"))


class OperatorProcess:
    """`python -m scalerl_operator ARGS` of a container spec as a local process (`launcher`: another
    script run in its place with `launcher_args` before ARGS), its output in `log`."""

    def __init__(self, container: dict[str, Any], env: dict[str, str], log: Path,
                 launcher: list[str] | None = None) -> None:
        assert container["command"] == OPERATOR_COMMAND, container["command"]
        self.container, self.log = container, log
        head = [sys.executable, *(launcher or ["-m", "scalerl_operator"])]
        with log.open("w") as out:
            self.proc = subprocess.Popen([*head, *container["args"]], env=env, stdout=out, stderr=subprocess.STDOUT)

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text()[-chars:]

    def wait_leader(self, timeout_s: float = 90.0) -> None:
        """Until its health endpoint answers `leader` (the Lease taken and kopf started)."""
        url = f"http://127.0.0.1:{health_port(self.container)}/healthz"
        deadline, answer = time.monotonic() + timeout_s, ""
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(url, timeout=2) as reply:
                    answer = f"HTTP {reply.status} {reply.read().decode()}"  # 200 standby, then 200 leader
                    if answer == "HTTP 200 leader":
                        return
            except OSError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"the operator did not become leader within {timeout_s:.0f}s (last answer "
                             f"{answer!r}, exit {self.proc.poll()}):\n{self.tail()}")

    def stop(self) -> int | None:
        """SIGTERM, as the kubelet stops a pod; the exit code, None when it outlived the grace period."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None
