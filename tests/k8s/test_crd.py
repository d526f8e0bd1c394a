"""The RLJob CRD on the real kube-apiserver: install, defaulting, CEL rules, printer columns, subresources.

Every CEL rule has an accepted and a rejected case, and each case is also run through the pydantic
model (`parse_spec`), so the API server and the operator accept and reject the same specs.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from scalerl.config import JobSpec, SpecError, spec_from_dict
from scalerl_operator.api import conditions as cond
from scalerl_operator.api.crd import JOB_EXCLUDED_FIELDS, PRINTER_COLUMNS
from scalerl_operator.api.spec import GROUP, PLURAL, VERSION, RLJobStatus, parse_rljob, parse_spec

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "rljob.yaml"
# Used when examples/rljob.yaml is absent: the smallest valid RLJob.
MINIMAL = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "RLJob", "metadata": {"name": "minimal"},
           "spec": {"bus": {"bootstrap": "kafka:9092"}, "store": {"uri": "s3://scalerl-test/jobs"}}}
TABLE = "application/json;as=Table;g=meta.k8s.io;v=v1"

pytestmark = pytest.mark.infra
Call = Callable[..., tuple[int, Any]]


def _path(ns: str, name: str = "", sub: str = "") -> str:
    return "/".join(p for p in (f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}", name, sub) if p)


def _rljob(name: str, **spec_patch: Any) -> dict[str, Any]:
    obj = copy.deepcopy(MINIMAL)
    obj["metadata"]["name"] = name
    _merge(obj["spec"], spec_patch)
    return obj


def _merge(base: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


@pytest.fixture
def create(k8s_call: Call, namespace: str, rljob_crd: dict[str, Any]) -> Call:
    def create(obj: dict[str, Any]) -> tuple[int, Any]:
        return k8s_call("POST", _path(namespace), obj, query={"fieldValidation": "Strict"})
    return create


def _rejected(result: tuple[int, Any], *fragments: str) -> str:
    status, body = result
    assert status == 422 or status == 400, f"expected a rejection, got HTTP {status}: {body}"
    message = body["message"]
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return str(message)


# ---- install and defaulting ------------------------------------------------------------------------

def test_crd_is_established_with_status_subresource_and_short_name(k8s_call: Call, rljob_crd: dict[str, Any]) -> None:
    assert rljob_crd["status"]["acceptedNames"]["shortNames"] == ["rlj"]
    status, discovery = k8s_call("GET", f"/apis/{GROUP}/{VERSION}")
    assert status == 200
    resources = {r["name"]: r for r in discovery["resources"]}
    assert set(resources) == {"rljobs", "rljobs/status"}  # no /scale: each pool is a Deployment with its own
    assert resources["rljobs"]["namespaced"] is True and resources["rljobs"]["shortNames"] == ["rlj"]


def test_example_rljob_is_accepted_and_defaulted_like_the_pydantic_model(
        create: Call) -> None:
    example = yaml.safe_load(EXAMPLE.read_text()) if EXAMPLE.exists() else copy.deepcopy(MINIMAL)
    status, stored = create(example)
    assert status == 201, stored
    name = example["metadata"]["name"]
    # the server filled every default: its spec.job is the full JobSpec pydantic makes of the example's
    expected_job = spec_from_dict({**example["spec"].get("job", {}), "name": name}).model_dump(
        mode="json", exclude_none=True)
    for key in JOB_EXCLUDED_FIELDS:  # name, runtime and stop_policy are set outside spec.job
        del expected_job[key]
    assert stored["spec"]["job"] == expected_job
    # and the rest of the spec carries pydantic's defaults (minus empty maps and lists)
    parsed = parse_rljob(stored)
    assert parsed.spec.job_spec(name) == spec_from_dict({**example["spec"].get("job", {}), "name": name})
    assert parsed.spec.roles.verifier.autoscaling.behavior.scale_down.stabilization_window_seconds == \
        stored["spec"]["roles"]["verifier"]["autoscaling"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"]
    roundtrip = parsed.spec.model_dump(by_alias=True, mode="json", exclude_none=True)
    assert _drop_empty(roundtrip) == _drop_empty(stored["spec"])
    assert stored["metadata"]["generation"] == 1


def _drop_empty(obj: Any) -> Any:
    if isinstance(obj, dict):
        kept = {k: _drop_empty(v) for k, v in obj.items()}
        return {k: v for k, v in kept.items() if v not in ({}, [])}
    return obj


# ---- CEL rules: an accepted and a rejected case each, agreeing with pydantic ---------------------------

CEL_CASES = [
    # (rule id, accepted spec patch, rejected spec patch, fragments of the rejection message)
    ("generator min<=max",
     {"roles": {"generator": {"autoscaling": {"minReplicas": 3, "maxReplicas": 3}}}},
     {"roles": {"generator": {"autoscaling": {"minReplicas": 4, "maxReplicas": 3}}}},
     ["spec.roles.generator.autoscaling.minReplicas", "must be <= maxReplicas"]),
    ("verifier min<=max",
     {"roles": {"verifier": {"autoscaling": {"minReplicas": 0, "maxReplicas": 1}}}},
     {"roles": {"verifier": {"autoscaling": {"minReplicas": 9}}}},  # > the default maxReplicas 8
     ["spec.roles.verifier.autoscaling.minReplicas", "must be <= maxReplicas"]),
    ("off_policy.k >= 1",
     {"job": {"off_policy": {"k": 1}}},
     {"job": {"off_policy": {"k": 0}}},
     ["spec.job.off_policy.k"]),
    ("interruption window inside the thinking budget",
     {"job": {"generation": {"thinking_budget_tokens": 200, "interruption": {"window_tokens": [100, 200]}}}},
     {"job": {"generation": {"thinking_budget_tokens": 200, "interruption": {"window_tokens": [100, 201]}}}},
     ["spec.job.generation.interruption.window_tokens", "1 <= lo <= hi <= thinking_budget_tokens"]),
    ("interruption window ordered",
     {"job": {"generation": {"interruption": {"window_tokens": [5, 5]}}}},
     {"job": {"generation": {"interruption": {"window_tokens": [6, 5]}}}},
     ["spec.job.generation.interruption.window_tokens"]),
    ("tiny model heads divide the width",
     {"job": {"model": {"tiny": {"hidden_size": 96, "num_heads": 3}}}},
     {"job": {"model": {"tiny": {"hidden_size": 100, "num_heads": 3}}}},
     ["spec.job.model.tiny.hidden_size", "divisible by num_heads"]),
    ("jsonl needs train_path",
     {"job": {"task": {"kind": "jsonl", "train_path": "/data/train.jsonl"}}},
     {"job": {"task": {"kind": "jsonl"}}},
     ["spec.job.task.train_path", "required when task.kind is jsonl"]),
    ("cispo takes no PPO clips",
     {"job": {"loss": {"type": "grpo", "ppo_clip_low": 0.2}}},
     {"job": {"loss": {"type": "cispo", "ppo_clip_low": 0.2}}},
     ["spec.job.loss", "do not apply to loss cispo"]),
    ("S3 URI form",
     {"store": {"uri": "s3://my-bucket.v2/runs/a"}},
     {"store": {"uri": "s3://B/runs"}},
     ["spec.store.uri", "must be s3://bucket[/prefix]"]),
    ("store retention delete needs a prefix",
     {"store": {"uri": "s3://abc/job-7", "retention": "delete"}},
     {"store": {"uri": "s3://abc/", "retention": "delete"}},
     ["spec.store.retention", "needs a prefix"]),
    ("S3 URI scheme",
     {"store": {"uri": "s3://abc"}},
     {"store": {"uri": "http://minio:9000/bucket"}},
     ["spec.store.uri"]),
]


@pytest.mark.parametrize(("rule", "good", "bad", "fragments"), CEL_CASES, ids=[c[0] for c in CEL_CASES])
def test_cel_rule_accepts_and_rejects(create: Call, rule: str, good: dict[str, Any],
                                      bad: dict[str, Any], fragments: list[str]) -> None:
    ok = _rljob("good", **copy.deepcopy(good))
    status, body = create(ok)
    assert status == 201, f"{rule}: the valid case was rejected: {body}"
    parse_spec(ok["spec"])  # pydantic agrees
    wrong = _rljob("bad", **copy.deepcopy(bad))
    _rejected(create(wrong), *fragments)
    with pytest.raises(SpecError):
        parse_spec(wrong["spec"])


# ---- invalid RLJobs -------------------------------------------------------------------------------

INVALID = [
    ("bad enum", {"imagePullPolicy": "Sometimes"},
     ["spec.imagePullPolicy", "Unsupported value", '"Always"', '"IfNotPresent"', '"Never"']),
    ("bad job enum", {"job": {"loss": {"type": "ppo"}}}, ["spec.job.loss.type", "Unsupported value", '"cispo"']),
    ("negative replicas", {"roles": {"verifier": {"replicas": -1}}},
     ["spec.roles.verifier.replicas", "should be greater than or equal to 0"]),
    ("min > max", {"roles": {"verifier": {"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}}},
     ["spec.roles.verifier.autoscaling.minReplicas"]),
    ("unknown field", {"roles": {"learner": {"gpus": 1}}}, ['unknown field "spec.roles.learner.gpus"']),
    ("bad quantity", {"roles": {"learner": {"resources": {"limits": {"memory": "16 GB"}}}}},
     ["spec.roles.learner.resources.limits.memory"]),
    ("too many tolerations", {"roles": {"generator": {"tolerations": [{"key": f"k{i}"} for i in range(33)]}}},
     ["spec.roles.generator.tolerations", "must have at most 32 items"]),
]


@pytest.mark.parametrize(("case", "patch", "fragments"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_rljob_is_rejected_naming_the_field(create: Call, case: str,
                                                    patch: dict[str, Any], fragments: list[str]) -> None:
    obj = _rljob("invalid", **copy.deepcopy(patch))
    _rejected(create(obj), *fragments)
    with pytest.raises(SpecError):
        parse_spec(obj["spec"])


def test_name_longer_than_children_allow_is_rejected(create: Call) -> None:
    _rejected(create(_rljob("a" * 41)), "metadata.name", "40")
    status, _ = create(_rljob("a" * 40))
    assert status == 201


# ---- learner topology: immutable while running, mutable while suspended (transition rule) -------------

def test_learner_topology_changes_only_while_suspended(k8s_call: Call, namespace: str,
                                                       create: Call) -> None:
    status, body = create(_rljob("topo", roles={"learner": {"nodes": 2, "devicesPerNode": 4}}))
    assert status == 201, body
    path = _path(namespace, "topo")

    def patch(spec: dict[str, Any]) -> tuple[int, Any]:
        return k8s_call("PATCH", path, {"spec": spec}, content_type="application/merge-patch+json")

    msg = _rejected(patch({"roles": {"learner": {"nodes": 3}}}), "spec.roles.learner", "immutable while the job runs")
    assert "suspend" in msg
    _rejected(patch({"roles": {"learner": {"devicesPerNode": 8}}}), "spec.roles.learner")
    # suspending and resizing in one update is refused too: the old object still runs
    _rejected(patch({"suspend": True, "roles": {"learner": {"nodes": 3}}}), "spec.roles.learner")
    # other fields change freely while running
    status, body = patch({"roles": {"verifier": {"replicas": 3}}})
    assert status == 200 and body["spec"]["roles"]["verifier"]["replicas"] == 3
    status, body = patch({"suspend": True})
    assert status == 200
    status, body = patch({"roles": {"learner": {"nodes": 3, "devicesPerNode": 8}}})
    assert status == 200, body
    # resuming with a new size in the same update is allowed (the old object was suspended)
    status, body = patch({"suspend": False, "roles": {"learner": {"nodes": 4}}})
    assert status == 200, body
    assert (body["spec"]["roles"]["learner"]["nodes"], body["spec"]["roles"]["learner"]["devicesPerNode"],
            body["spec"]["suspend"]) == (4, 8, False)
    _rejected(patch({"roles": {"learner": {"nodes": 1}}}), "spec.roles.learner")


# ---- printer columns from a status written through /status -------------------------------------------

def test_printer_columns_show_the_status_in_a_table(k8s_call: Call, namespace: str,
                                                    create: Call) -> None:
    status, body = create(_rljob("table"))
    assert status == 201, body
    now = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
    conditions = cond.set_condition([], cond.PROGRESSING, "False", cond.REASON_RECONCILED, "", 1, now)
    conditions = cond.set_condition(conditions, cond.DEGRADED, "False", cond.REASON_ALL_ROLES_READY, "", 1, now)
    conditions = cond.set_condition(conditions, cond.READY, "True", cond.REASON_ALL_ROLES_READY, "all ready", 1,
                                    now)
    new_status = RLJobStatus.model_validate({
        "observedGeneration": 1, "phase": "Running", "conditions": conditions, "policyVersion": 12,
        "learnerStep": 345, "lag": {"table.rollouts": 40, "table.scored": 2},
        "staleness": {"current": 3, "bound": 8}, "passRate": 0.625,
        "fit": {"A": 0.71, "B": 1.5, "Cmid": 120.0, "computeAtFit": 40.0},
        "roles": {"generator": {"ready": 2, "desired": 3}, "verifier": {"ready": 1, "desired": 8}},
    }).model_dump(by_alias=True, mode="json", exclude_none=True)
    status, body = k8s_call("PATCH", _path(namespace, "table", "status"), {"status": new_status},
                               content_type="application/merge-patch+json")
    assert status == 200, body
    assert body["status"]["lagTotal"] == 42 and body["status"]["roles"]["generator"]["summary"] == "2/3"
    assert cond.is_ready(body)

    status, table = k8s_call("GET", _path(namespace, "table"), accept=TABLE)
    assert status == 200 and table["kind"] == "Table", table
    names = [c["name"] for c in table["columnDefinitions"]]
    assert names == ["Name", *(c["name"] for c in PRINTER_COLUMNS)]
    row = dict(zip(names, table["rows"][0]["cells"], strict=True))
    # Ready is the third condition in the list: read by type, not position
    assert {k: v for k, v in row.items() if k not in ("Age",)} == {
        "Name": "table", "Phase": "Running", "Ready": "True", "Policy": 12, "Step": 345, "Gen": "2/3",
        "Ver": "1/8", "Lag": 42, "Staleness": "3/8", "PassRate": 0.625, "A": 0.71, "Reason": "AllRolesReady"}
    assert row["Age"].endswith(("s", "m"))  # a kubectl age such as "3s"


# ---- status and spec are written through their own endpoints --------------------------------------------

def test_status_subresource_and_main_resource_ignore_each_others_fields(
        k8s_call: Call, namespace: str, create: Call) -> None:
    status, body = create(_rljob("split"))
    assert status == 201, body
    path = _path(namespace, "split")
    merge = "application/merge-patch+json"
    # /status ignores spec changes
    status, body = k8s_call("PATCH", f"{path}/status",
                               {"spec": {"suspend": True}, "status": {"phase": "Running", "learnerStep": 5}},
                               content_type=merge)
    assert status == 200, body
    assert body["spec"]["suspend"] is False and body["status"]["learnerStep"] == 5
    assert body["metadata"]["generation"] == 1  # status writes never bump the generation
    # the main resource ignores status changes, and a spec change bumps the generation
    status, body = k8s_call("PATCH", path, {"spec": {"suspend": True}, "status": {"learnerStep": 999}},
                               content_type=merge)
    assert status == 200, body
    assert body["spec"]["suspend"] is True and body["status"]["learnerStep"] == 5
    assert body["metadata"]["generation"] == 2
    # a status the pydantic model rejects is rejected by the server too
    _rejected(k8s_call("PATCH", f"{path}/status", {"status": {"phase": "Exploded"}}, content_type=merge),
              "status.phase", "Unsupported value")
    status, body = k8s_call("GET", path)
    assert body["spec"]["job"]["off_policy"]["k"] == JobSpec().off_policy.k  # untouched by status writes
