"""Fields only a newer CRD serves (scalerl_operator.api.newer_fields): an older operator build leaves such an
RLJob (as the API server serves it: parse_served_spec) alone instead of failing it; any other problem,
and any unknown field in a spec read from a file (parse_spec), is still a plain SpecError naming the field."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from scalerl.config import SpecError
from scalerl_operator.api.newer_fields import FieldsFromNewerCRD
from scalerl_operator.api.spec import parse_served_spec, parse_spec

BASE: dict[str, Any] = {
    "job": {"train": {"steps": 5, "prompts_per_step": 4}, "off_policy": {"k": 4}},
    "bus": {"bootstrap": "kafka:9092"},
    "store": {"uri": "s3://bucket/runs"},
    "roles": {"generator": {"replicas": 2, "podTemplate": {"volumes": [{"name": "data", "emptyDir": {}}]}}},
}


def with_(**paths: Any) -> dict[str, Any]:
    spec = copy.deepcopy(BASE)
    for dotted, value in paths.items():
        node = spec
        *parents, leaf = dotted.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return spec


def test_fields_of_a_newer_crd_are_named_and_the_rest_of_the_spec_is_kept() -> None:
    spec = with_(newTopLevel=1, job__new_knob=7, job__train__warmup_ratio=0.1, roles__generator__newRoleField="x")
    with pytest.raises(FieldsFromNewerCRD) as info:
        parse_served_spec(spec)
    assert sorted(info.value.fields) == sorted(["spec.newTopLevel", "spec.job.new_knob", "spec.job.train.warmup_ratio",
                                                "spec.roles.generator.newRoleField"])
    known = info.value.known  # what this build knows of it: enough to clean up, as parsed without the new fields
    assert known == parse_spec(BASE)
    assert known.roles.generator.replicas == 2 and known.bus.bootstrap == "kafka:9092"


def test_free_form_parts_are_not_unknown_fields() -> None:
    spec = with_(roles__generator__podTemplate={"volumes": [{"name": "d", "csi": {"driver": "x", "anything": 1}}]})
    assert parse_served_spec(spec).roles.generator.replicas == 2


def test_a_spec_read_from_a_file_still_calls_them_unknown_fields() -> None:
    with pytest.raises(SpecError, match=r"^spec.job.new_knob: unknown field; allowed: name, seed, model, ") as info:
        parse_spec(with_(job__new_knob=7))
    assert not isinstance(info.value, FieldsFromNewerCRD)


def test_an_unknown_field_beside_a_bad_value_is_a_plain_spec_error() -> None:
    spec = with_(job__new_knob=7, roles__generator__replicas=-1)
    with pytest.raises(SpecError) as info:
        parse_served_spec(spec)
    assert not isinstance(info.value, FieldsFromNewerCRD)
    assert "spec.roles.generator.replicas" in str(info.value) or "spec.job.new_knob" in str(info.value)
