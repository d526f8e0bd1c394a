"""The RLJob CRD stays in sync with the pydantic models it is generated from.

The checks walk the pydantic classes (`model_fields` and their annotated-types constraints), not the
JSON Schema that `crd.py` converts, so a converter bug shows up as a mismatch. Defaults are checked
by applying the CRD's defaults the way the API server does (`crd.defaulted`: top-down, a defaulted
object defaulted in turn) and comparing with pydantic's own defaulted dump; tests/k8s/test_crd.py
checks the same against the real API server's defaulting.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import types
import typing
from typing import Any

import annotated_types as at
import pytest
from pydantic import BaseModel

from scalerl.config import JobSpec, SpecError
from scalerl_operator.api import crd as crd_mod
from scalerl_operator.api.spec import RLJobSpec, RLJobStatus, parse_rljob, parse_spec

MINIMAL = {"bus": {"bootstrap": "kafka:9092"}, "store": {"uri": "s3://scalerl-test/jobs"}}


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return crd_mod.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _walk(node: Any, path: str = "") -> typing.Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        yield path, node
        for key, sub in (node.get("properties") or {}).items():
            yield from _walk(sub, f"{path}.{key}")
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                yield from _walk(node[key], f"{path}[{key}]")


def test_schema_is_structural(schema: dict[str, Any]) -> None:
    for path, node in _walk(schema):
        assert "$ref" not in node and "title" not in node and "$defs" not in node, path
        assert "prefixItems" not in node and "const" not in node and "propertyNames" not in node, path
        assert node.get("additionalProperties") is not False, path
        if "anyOf" in node:  # only resource quantities: int-or-string
            assert node.get("x-kubernetes-int-or-string") is True, path
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
        else:
            assert node.get("type") in {"object", "array", "string", "integer", "number", "boolean"}, path
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            assert node.get(bound, True) is True, f"{path}: {bound} must be an OpenAPI 3.0 boolean"
        if node.get("type") == "array":
            assert "items" in node, path


def _unwrap(annotation: Any) -> tuple[Any, bool, list[Any]]:
    """(inner type, nullable, annotated metadata) of a field annotation."""
    meta: list[Any] = []
    nullable = False
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation, *extra = typing.get_args(annotation)
            meta.extend(extra)
        elif origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(annotation):
            rest = [a for a in typing.get_args(annotation) if a is not type(None)]
            nullable = True
            annotation = rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]  # noqa: UP007
        else:
            return annotation, nullable, meta


_SCALARS = {int: "integer", float: "number", bool: "boolean", str: "string"}


def _check_constraints(path: str, prop: dict[str, Any], meta: list[Any], kind: str) -> None:
    length_key = {"string": "Length", "array": "Items", "object": "Properties"}.get(kind, "Length")
    for m in meta:
        if isinstance(m, at.Ge):
            assert prop["minimum"] == m.ge and "exclusiveMinimum" not in prop, path
        elif isinstance(m, at.Gt):
            assert prop["minimum"] == m.gt and prop["exclusiveMinimum"] is True, path
        elif isinstance(m, at.Le):
            assert prop["maximum"] == m.le and "exclusiveMaximum" not in prop, path
        elif isinstance(m, at.Lt):
            assert prop["maximum"] == m.lt and prop["exclusiveMaximum"] is True, path
        elif isinstance(m, at.MaxLen):
            assert prop[f"max{length_key}"] == m.max_length, path
        elif isinstance(m, at.MinLen):
            assert prop[f"min{length_key}"] == m.min_length, path
        for attr, key in (("pattern", "pattern"), ("max_length", f"max{length_key}"),
                          ("min_length", f"min{length_key}")):
            value = getattr(m, attr, None)
            if value is not None and not isinstance(m, at.MaxLen | at.MinLen):
                assert prop[key] == value, f"{path}: {key}"


def _check_type(path: str, annotation: Any, prop: dict[str, Any], meta: list[Any]) -> None:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        _check_model(path, annotation, prop)
    elif origin is typing.Literal:
        assert prop["enum"] == list(args) and prop["type"] == "string", path
    elif annotation in _SCALARS:
        assert prop["type"] == _SCALARS[annotation], path
        _check_constraints(path, prop, meta, prop["type"])
    elif origin is tuple:  # fixed-length array of one type
        assert prop["type"] == "array" and prop["minItems"] == prop["maxItems"] == len(args), path
        _check_type(f"{path}[]", args[0], prop["items"], [])
    elif origin is list:
        assert prop["type"] == "array", path
        _check_constraints(path, prop, meta, "array")
        item, _, item_meta = _unwrap(args[0])
        _check_type(f"{path}[]", item, prop["items"], item_meta)
    elif origin is dict:
        assert prop["type"] == "object", path
        _check_constraints(path, prop, meta, "object")
        value, _, value_meta = _unwrap(args[1])
        if value is Any:
            assert prop.get("x-kubernetes-preserve-unknown-fields") is True, path
        else:
            _check_type(f"{path}{{}}", value, prop["additionalProperties"], value_meta)
    elif origin in (typing.Union, types.UnionType) and set(args) == {int, str}:
        assert prop["x-kubernetes-int-or-string"] is True and "pattern" in prop, path
    elif annotation.__name__ == "datetime":
        assert prop == {**prop, "type": "string", "format": "date-time"}, path
    else:
        raise AssertionError(f"{path}: no check for {annotation!r}")


def _check_model(path: str, model: type[BaseModel], node: dict[str, Any], skip: tuple[str, ...] = ()) -> None:
    fields = {f.alias or name: (name, f) for name, f in model.model_fields.items() if name not in skip}
    assert node["type"] == "object", path
    if path != ".spec.job" or model is not JobSpec:
        assert set(node["properties"]) == set(fields), f"{path}: properties differ from {model.__name__}"
    for key, (_, field) in fields.items():
        prop = node["properties"][key]
        where = f"{path}.{key}"
        inner, nullable, meta = _unwrap(field.annotation)
        assert bool(prop.get("nullable")) == nullable, f"{where}: nullable"
        _check_type(where, inner, prop, [*meta, *field.metadata])
        if field.description:
            assert prop["description"] == field.description, where
        required = field.is_required()
        assert (key in node.get("required", ())) == required, f"{where}: required"


def test_every_jobspec_field_is_in_the_crd_with_its_constraints(schema: dict[str, Any]) -> None:
    job = schema["properties"]["spec"]["properties"]["job"]
    assert set(job["properties"]) == set(JobSpec.model_fields) - set(crd_mod.JOB_EXCLUDED_FIELDS)
    _check_model(".spec.job", JobSpec, job, skip=crd_mod.JOB_EXCLUDED_FIELDS)


def test_rljob_spec_and_status_fields_are_in_the_crd(schema: dict[str, Any]) -> None:
    spec = copy.deepcopy(schema["properties"]["spec"])
    spec["properties"]["job"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                                 "description": RLJobSpec.model_fields["job"].description}
    _check_model(".spec", RLJobSpec, spec)
    _check_model(".status", RLJobStatus, schema["properties"]["status"])
    conditions = schema["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map" and conditions["x-kubernetes-list-map-keys"] == ["type"]


def _drop_empty(obj: Any) -> Any:
    """Empty maps and lists removed: absent and empty mean the same for nodeSelector, limits, ..."""
    if isinstance(obj, dict):
        kept = {k: _drop_empty(v) for k, v in obj.items()}
        return {k: v for k, v in kept.items() if v not in ({}, [])}
    return obj


def test_crd_defaults_equal_the_pydantic_defaults(schema: dict[str, Any]) -> None:
    # crd.defaulted: missing properties get their default, defaulted in turn, as the API server does
    defaulted = crd_mod.defaulted(schema["properties"]["spec"], MINIMAL)
    expected = RLJobSpec.model_validate(MINIMAL).model_dump(by_alias=True, mode="json", exclude_none=True)
    expected_job = JobSpec(name="x").model_dump(mode="json", exclude_none=True)
    for key in crd_mod.JOB_EXCLUDED_FIELDS:  # name, runtime and stop_policy come from elsewhere
        del expected_job[key]
    assert defaulted.pop("job") == expected_job
    assert expected.pop("job") == {}
    assert _drop_empty(defaulted) == _drop_empty(expected)
    # scale-up and scale-down keep their own HPA defaults (0 s / 300 s windows, Pods / Percent)
    behavior = defaulted["roles"]["verifier"]["autoscaling"]["behavior"]
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 300
    assert behavior["scaleDown"]["policies"] == [{"type": "Percent", "value": 100, "periodSeconds": 15}]
    # and the defaulted object is a valid RLJob spec whose job is the ScaleRL recipe
    assert parse_spec(defaulted | {"job": expected_job}).job_spec("x") == JobSpec(name="x")


def test_status_has_no_server_defaults(schema: dict[str, Any]) -> None:
    assert [p for p, n in _walk(schema["properties"]["status"]) if "default" in n] == []


def test_cel_rules_sit_on_existing_fields(schema: dict[str, Any]) -> None:
    for rule in crd_mod.CEL_RULES:
        node = schema
        for key in rule.path:
            node = node["properties"][key]
        assert rule.entry() in node["x-kubernetes-validations"]
        if rule.field_path:  # fieldPath must name a property below the rule's node
            target = node
            for key in rule.field_path.strip(".").split("."):
                target = target["properties"][key]
    transition = [r for r in crd_mod.CEL_RULES if "oldSelf" in r.rule]
    assert len(transition) == 1 and transition[0].path == ("spec",)


def test_printer_columns_point_at_status_fields_and_read_conditions_by_type(schema: dict[str, Any]) -> None:
    columns = crd_mod.crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    names = [c["name"] for c in columns]
    assert names == ["Phase", "Ready", "Policy", "Step", "Gen", "Ver", "Lag", "Staleness", "PassRate", "A",
                     "Reason", "Age"]
    for col in columns:
        path = col["jsonPath"]
        if "conditions[" in path:
            assert path.startswith('.status.conditions[?(@.type=="Ready")]'), path
            continue
        node = schema
        for key in path.strip(".").split("."):
            node = node["properties"][key] if key != "metadata" else {"properties": {"creationTimestamp": {}}}


def test_rljob_has_status_and_no_scale_subresource() -> None:
    version = crd_mod.crd()["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}


def test_spec_errors_name_the_field() -> None:
    cases = {
        "spec.job.off_policy.k": {"job": {"off_policy": {"k": 0}}},
        "spec.job.name": {"job": {"name": "x"}},
        "spec.job.runtime": {"job": {"runtime": {}}},
        "spec.job.generation": {"job": {"generation": {"thinking_budget_tokens": 100}}},
        "spec.roles.verifier.autoscaling": {"roles": {"verifier": {"autoscaling": {"minReplicas": 9}}}},
        "spec.roles.generator.replicas": {"roles": {"generator": {"replicas": -1}}},
        "spec.store.uri": {"store": {"uri": "http://bucket/x"}},
        "spec.imagePullPolicy": {"imagePullPolicy": "Sometimes"},
        "spec.roles.learner.resources.limits.cpu": {"roles": {"learner": {"resources": {"limits": {"cpu": "2x"}}}}},
        "spec.roles.learner.gpus": {"roles": {"learner": {"gpus": 1}}},
    }
    for field, patch in cases.items():
        spec = copy.deepcopy(MINIMAL)
        for key, value in patch.items():
            spec[key] = {**spec.get(key, {}), **value} if isinstance(value, dict) else value
        with pytest.raises(SpecError) as err:
            parse_spec(spec)
        assert str(err.value).startswith(f"{field}: "), (field, str(err.value))
        assert "\n" not in str(err.value)
    with pytest.raises(SpecError, match=r"^metadata\.name: must be a DNS label of at most 40"):
        parse_rljob({"apiVersion": "scalerl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "a" * 41},
                     "spec": MINIMAL})


def test_partitions_and_images_default_from_the_roles() -> None:
    spec = parse_spec(MINIMAL)
    assert spec.topic_partitions() == 8  # max(verifier maxReplicas 8, generator maxReplicas 4)
    spec = parse_spec({**MINIMAL, "bus": {"bootstrap": "k:9092", "partitions": 3},
                       "roles": {"learner": {"image": "scalerl:gpu"}}})
    assert spec.topic_partitions() == 3
    assert (spec.image_of("learner"), spec.image_of("verifier")) == ("scalerl:gpu", "")
    assert spec.image_of("verifier", "reg/scalerl:1") == "reg/scalerl:1"  # the operator's default
    spec = parse_spec({**MINIMAL, "image": "reg/scalerl:2", "roles": {"learner": {"image": "scalerl:gpu"}}})
    assert (spec.image_of("learner", "x"), spec.image_of("verifier", "x")) == ("scalerl:gpu", "reg/scalerl:2")


def test_job_spec_joins_name_and_runtime() -> None:
    from scalerl.config import RuntimeConfig

    spec = parse_spec({**MINIMAL, "job": {"train": {"steps": 7}}})
    full = spec.job_spec("demo", RuntimeConfig(bus="kafka://kafka:9092", store="s3://scalerl-test/jobs/demo"))
    assert (full.name, full.train.steps, full.runtime.bus) == ("demo", 7, "kafka://kafka:9092")
    assert full.off_policy.k == 8  # the recipe default where spec.job says nothing


def test_cli_rejects_arguments() -> None:
    out = subprocess.run([sys.executable, "-m", "scalerl_operator.api.crd", "--bogus"], capture_output=True, text=True)
    assert out.returncode == 2 and "unexpected arguments: --bogus" in out.stderr
