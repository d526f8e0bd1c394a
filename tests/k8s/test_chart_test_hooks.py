"""`helm test --logs` works (issue #26): helm reads the log of every `test` hook by the hook's name as a
Pod, after the hooks ran. So the test Pods are the only test hooks (their ServiceAccount, Role and
RoleBinding are plain chart objects: a hook of another kind failed it with `pods "<name>" not found`), and
a test Pod is deleted only before the next `helm test` (`before-hook-creation`), never when it succeeded.

Rendered with the helm client scripts/infra builds into the cache (HELM_BIN of the `k8s_env` session
fixture, which waits for `make test`'s background build of it). A plain client, no server."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "scalerl"
HOOK, POLICY = "helm.sh/hook", "helm.sh/hook-delete-policy"

pytestmark = [pytest.mark.infra]


@pytest.fixture(scope="module")
def rendered(k8s_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    home = tmp_path_factory.mktemp("helm")
    proc = subprocess.run([k8s_env["HELM_BIN"], "template", "rel", str(CHART), "--namespace", "ns"],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "HELM_CACHE_HOME": str(home / "cache"),
                               "HELM_CONFIG_HOME": str(home / "config"), "HELM_DATA_HOME": str(home / "data")})
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def _annotations(obj: dict[str, Any]) -> dict[str, str]:
    return dict(obj["metadata"].get("annotations") or {})


def test_only_the_test_pods_are_test_hooks(rendered: list[dict[str, Any]]) -> None:
    hooks = [o for o in rendered if _annotations(o).get(HOOK) == "test"]
    assert sorted(o["metadata"]["name"] for o in hooks) == ["rel-scalerl-test-operator-health",
                                                             "rel-scalerl-test-rljob-api"]
    assert {o["kind"] for o in hooks} == {"Pod"}


def test_a_test_pod_stays_until_the_next_helm_test(rendered: list[dict[str, Any]]) -> None:
    for pod in (o for o in rendered if _annotations(o).get(HOOK) == "test"):
        assert _annotations(pod)[POLICY] == "before-hook-creation", pod["metadata"]["name"]


def test_the_test_pods_identity_is_a_plain_chart_object(rendered: list[dict[str, Any]]) -> None:
    name = "rel-scalerl-test"
    ident = {o["kind"]: o for o in rendered if o["metadata"]["name"] == name}
    assert set(ident) == {"ServiceAccount", "Role", "RoleBinding"}
    assert all(HOOK not in _annotations(o) for o in ident.values())
    api_pod = next(o for o in rendered if o["metadata"]["name"] == "rel-scalerl-test-rljob-api")
    assert api_pod["spec"]["serviceAccountName"] == name
    assert ident["Role"]["rules"] == [{"apiGroups": ["scalerl.dev"], "resources": ["rljobs"],
                                       "verbs": ["list", "create"]}]
