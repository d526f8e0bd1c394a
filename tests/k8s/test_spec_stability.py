"""An operator upgrade that adds a JobSpec field does not restart a running job (real API server, real
Kafka): what `helm upgrade` does, step by step.

1. The current CRD and operator: an RLJob (no image of its own) is reconciled; the learner
   StatefulSet and the Deployments exist.
2. The "new build": the CRD is replaced by one generated from a JobSpec with two more defaulted
   fields (a top-level one and one inside `train`), so the API server now serves every stored RLJob
   with them filled in; the operator parses with that JobSpec and its default image is a new tag.
3. The new operator reconciles the same RLJob: the learner StatefulSet's generation, pod-template
   hash annotation and image are unchanged (no pod would roll), while job.yaml (the ConfigMap) does
   carry the new field, so the new model was in effect.
4. A user-visible change (spec.job.train.steps) then does roll: the hash and generation change.

The CRD is installed under a group of its own (`<random>.scalerl.test`), so this test never swaps
the schema of the RLJob CRD other tests on the same API server use; the operator's RLJob path is
pointed at that group for the test.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from operator_helpers import QUIET_KAFKA, kafka_bootstrap, unique_job
from pydantic import Field

import scalerl.config
from scalerl.config import JobSpec, TrainConfig
from scalerl_operator import crd as crd_mod
from scalerl_operator import kube as kube_mod
from scalerl_operator.kube import Kube, load_client
from scalerl_operator.operator import OperatorConfig, Runtime
from scalerl_operator.reconcile import reconcile
from scalerl_operator.render import IMAGE_ENV, SPEC_HASH_ANNOTATION, parse_job_yaml
from scalerl_operator.rlstatus import LearnerStatus
from scalerl_operator.spec import PLURAL, VERSION

pytestmark = [pytest.mark.infra, *QUIET_KAFKA]
Call = Callable[..., tuple[int, Any]]
ESTABLISHED_S = 30.0


class TrainNext(TrainConfig):
    warmup_ratio: float = Field(0.0, ge=0.0, le=1.0, description="A field the next operator adds.")


class JobSpecNext(JobSpec):
    train: TrainNext = Field(default_factory=TrainNext)
    new_knob: int = Field(7, ge=0, description="Another field the next operator adds.")


def _crd(group: str) -> dict[str, Any]:
    obj = crd_mod.crd()
    obj["metadata"]["name"] = f"{PLURAL}.{group}"
    obj["spec"]["group"] = group
    return obj


def _wait(what: str, check: Callable[[], Any], timeout_s: float = ESTABLISHED_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (out := check()) is not None:
            return out
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s:.0f}s: {what}")


@pytest.fixture
def group(k8s_call: Call) -> Iterator[str]:
    """A throw-away API group for the test's own copy of the RLJob CRD (deleted afterwards)."""
    group = f"u{uuid.uuid4().hex[:8]}.scalerl.test"
    try:
        yield group
    finally:
        k8s_call("DELETE", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{PLURAL}.{group}")


def _install_crd(k8s_call: Call, group: str) -> None:
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{PLURAL}.{group}"
    status, body = k8s_call("PATCH", path, _crd(group), content_type="application/apply-patch+yaml",
                            query={"fieldManager": "scalerl-tests", "force": "true"})
    assert status in (200, 201), body

    def established() -> bool | None:
        _, crd = k8s_call("GET", path)
        conds = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
        served, disc = k8s_call("GET", f"/apis/{group}/{VERSION}")
        ok = conds.get("Established") == "True" and served == 200 and any(
            r["name"] == PLURAL for r in disc.get("resources", []))
        return True if ok else None

    _wait(f"CRD {PLURAL}.{group} Established and served", established)


def test_an_operator_upgrade_adding_a_jobspec_field_does_not_restart_a_running_job(
        k8s_env: dict[str, str], k8s_call: Call, namespace: str, group: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    boot = kafka_bootstrap(k8s_env)
    api = f"{group}/{VERSION}"
    monkeypatch.setattr(kube_mod, "GROUP", group)  # the operator's RLJob paths, in the test's own group
    monkeypatch.setitem(kube_mod._COLLECTIONS, (api, "RLJob"), f"/apis/{api}/namespaces/{{ns}}/{PLURAL}")
    kube = Kube(load_client(k8s_env["KUBECONFIG"]))
    runtime = Runtime(kube=kube, config=OperatorConfig(kafka_timeout_s=10.0))
    name = unique_job()

    def run_operator() -> dict[str, Any]:
        obj = kube.get(api, "RLJob", namespace, name)
        assert obj is not None
        out = reconcile(kube, obj, learner=LearnerStatus(), ensure_topics=runtime.ensure_topics)
        assert out.error is None and out.phase == "Pending", out
        sts = kube.get("apps/v1", "StatefulSet", namespace, f"{name}-learner")
        assert sts is not None
        return sts

    def fingerprint(sts: dict[str, Any]) -> tuple[int, str, str]:
        tmpl = sts["spec"]["template"]
        return (sts["metadata"]["generation"], tmpl["metadata"]["annotations"][SPEC_HASH_ANNOTATION],
                tmpl["spec"]["containers"][0]["image"])

    # 1. today's CRD and operator
    _install_crd(k8s_call, group)
    monkeypatch.setenv(IMAGE_ENV, "registry.example/scalerl:0.1.0")
    job = {"apiVersion": api, "kind": "RLJob", "metadata": {"name": name}, "spec": {
        "job": {"train": {"steps": 20, "prompts_per_step": 4}, "off_policy": {"k": 4}},
        "bus": {"bootstrap": boot, "partitions": 2},
        "store": {"uri": f"s3://scalerl-tests/{name}", "endpoint": "http://minio.invalid:9000",
                  "credentialsSecret": {"name": "s3-creds"}}}}
    status, body = k8s_call("POST", f"/apis/{api}/namespaces/{namespace}/{PLURAL}", job,
                            query={"fieldValidation": "Strict"})
    assert status == 201, body
    before = run_operator()
    deployments = {r: kube.get("apps/v1", "Deployment", namespace, f"{name}-{r}")
                   for r in ("generator", "verifier", "curriculum")}
    assert fingerprint(run_operator()) == fingerprint(before)  # a second pass of the same operator: no-op

    # 2. helm upgrade: the new CRD (two new defaulted JobSpec fields), the new operator build and image
    monkeypatch.setattr(crd_mod, "JobSpec", JobSpecNext)
    monkeypatch.setattr(scalerl.config, "JobSpec", JobSpecNext)
    monkeypatch.setenv(IMAGE_ENV, "registry.example/scalerl:0.2.0")
    _install_crd(k8s_call, group)

    def served_with_new_defaults() -> dict[str, Any] | None:
        obj = kube.get(api, "RLJob", namespace, name)
        j = (obj or {}).get("spec", {}).get("job", {})
        return obj if j.get("new_knob") == 7 and j.get("train", {}).get("warmup_ratio") == 0.0 else None

    _wait("the stored RLJob served with the new CRD's defaults", served_with_new_defaults)

    # 3. the new operator reconciles the running job: nothing to roll
    after = run_operator()
    assert fingerprint(after) == fingerprint(before)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    for role, dep in deployments.items():
        now = kube.get("apps/v1", "Deployment", namespace, f"{name}-{role}")
        assert dep is not None and now is not None
        assert now["metadata"]["generation"] == dep["metadata"]["generation"], role
        assert now["spec"]["template"] == dep["spec"]["template"], role
    cm = kube.get("v1", "ConfigMap", namespace, f"{name}-spec")
    assert cm is not None
    rendered = parse_job_yaml(cm["data"]["job.yaml"])
    assert rendered["new_knob"] == 7 and rendered["train"]["warmup_ratio"] == 0.0  # the new model rendered it

    # 4. a change the user makes does roll the learner
    kube.request("PATCH", f"/apis/{api}/namespaces/{namespace}/{PLURAL}/{name}",
                 body={"spec": {"job": {"train": {"steps": 30}}}}, content_type="application/merge-patch+json")
    rolled = run_operator()
    gen, spec_hash, image = fingerprint(rolled)
    assert gen == fingerprint(before)[0] + 1 and spec_hash != fingerprint(before)[1]
    assert image == fingerprint(before)[2]  # still the image the job was created with
