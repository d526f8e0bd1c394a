"""The RLJob CustomResourceDefinition, generated from the pydantic models of `scalerl_operator.api.spec`.

`python -m scalerl_operator.api.crd > crd.yaml` prints it. The OpenAPI v3 schema is *structural*, as
apiextensions.k8s.io/v1 requires: every node has a type, `$ref`s are inlined, `X | None` becomes
`nullable: true`, tuples become fixed-length arrays, JSON-Schema-2020 exclusive bounds become OpenAPI
3.0 booleans, and the only `anyOf` left is the int-or-string of resource quantities. Defaults, enums,
ranges, `maxItems`/`maxLength`/`maxProperties` come from the pydantic Field constraints; an optional
sub-object whose fields all have defaults gets `default: {}`, so the API server stores the full,
defaulted spec (a job keeps the recipe it was created with even when the operator is upgraded).

Cross-field rules are CEL `x-kubernetes-validations` (`CEL_RULES`); each mirrors a pydantic validator,
so the operator and the API server reject the same specs. String and list bounds keep the API
server's CEL cost estimate inside its budget (an unbounded string in `matches()` is rejected).

Scale subresource: none on the RLJob. A CRD has one `/scale`, but an RLJob has two independently
scaled pools; each is a Deployment (`J-generator`, `J-verifier`) with its own `/scale`, so `kubectl
scale deployment/J-verifier`, HPA or KEDA work on a pool directly.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass
from typing import Any

import yaml

from scalerl.config import JobSpec
from scalerl_operator.api import podtemplate as pt
from scalerl_operator.api.infra import S3_URI_PATTERN
from scalerl_operator.api.spec import (
    GROUP,
    KIND,
    NAME_MAX_LENGTH,
    NAME_PATTERN,
    PLURAL,
    SHORT_NAME,
    SINGULAR,
    VERSION,
    RLJobSpec,
    RLJobStatus,
)

CRD_NAME = f"{PLURAL}.{GROUP}"
# JobSpec fields an RLJob does not carry under spec.job (metadata.name and the operator's runtime).
JOB_EXCLUDED_FIELDS = ("name", "runtime", "stop_policy")
# Keys of pydantic's JSON Schema that a Kubernetes structural schema does not take.
_DROPPED_KEYS = {"title", "propertyNames", "$defs", "discriminator", "examples"}


@dataclass(frozen=True)
class CelRule:
    """One `x-kubernetes-validations` entry placed at `path` (keys from the CRD's root)."""

    path: tuple[str, ...]
    rule: str
    message: str
    field_path: str = ""
    reason: str = "FieldValueInvalid"

    def entry(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rule": self.rule, "message": self.message}
        if self.field_path:
            out["fieldPath"] = self.field_path
        if self.reason != "FieldValueInvalid":
            out["reason"] = self.reason
        return out


_JOB = ("spec", "job")
_MIN_LE_MAX = "self.minReplicas <= self.maxReplicas"
CEL_RULES: tuple[CelRule, ...] = (
    CelRule(("spec", "roles", "generator", "autoscaling"), _MIN_LE_MAX,
            "spec.roles.generator.autoscaling.minReplicas must be <= maxReplicas", ".minReplicas"),
    CelRule(("spec", "roles", "verifier", "autoscaling"), _MIN_LE_MAX,
            "spec.roles.verifier.autoscaling.minReplicas must be <= maxReplicas", ".minReplicas"),
    CelRule((*_JOB, "off_policy"), "self.k >= 1",
            "spec.job.off_policy.k must be >= 1 (policy versions of off-policyness)", ".k"),
    CelRule((*_JOB, "generation"),
            "self.interruption.window_tokens[0] >= 1 && "
            "self.interruption.window_tokens[0] <= self.interruption.window_tokens[1] && "
            "self.interruption.window_tokens[1] <= self.thinking_budget_tokens",
            "spec.job.generation.interruption.window_tokens [lo, hi] must satisfy "
            "1 <= lo <= hi <= thinking_budget_tokens", ".interruption.window_tokens"),
    CelRule((*_JOB, "model", "tiny"), "self.hidden_size % self.num_heads == 0",
            "spec.job.model.tiny.hidden_size must be divisible by num_heads", ".hidden_size"),
    CelRule((*_JOB, "task"), "self.kind != 'jsonl' || (has(self.train_path) && self.train_path != '')",
            "spec.job.task.train_path is required when task.kind is jsonl", ".train_path", "FieldValueRequired"),
    CelRule((*_JOB, "loss"), "self.type != 'cispo' || (!has(self.ppo_clip_low) && !has(self.ppo_clip_high))",
            "spec.job.loss.ppo_clip_low/ppo_clip_high do not apply to loss cispo (use cispo_eps_max)",
            ".type"),
    CelRule(("spec", "store"), f"self.uri.matches(r'{S3_URI_PATTERN}')",  # a raw CEL string: \s
            "spec.store.uri must be s3://bucket[/prefix] with a 3-63 character bucket name", ".uri"),
    CelRule(("spec", "store"), "self.retention != 'delete' || self.uri.matches('^s3://[^/]+/.*[^/].*$')",
            "spec.store.retention: delete needs a prefix in spec.store.uri (s3://bucket/prefix), so deleting "
            "the job never empties a whole bucket", ".retention"),
    # A transition rule (oldSelf): the learner's torchrun world is fixed while the job runs.
    CelRule(("spec",),
            "oldSelf.suspend || (self.roles.learner.nodes == oldSelf.roles.learner.nodes && "
            "self.roles.learner.devicesPerNode == oldSelf.roles.learner.devicesPerNode)",
            "spec.roles.learner.nodes and spec.roles.learner.devicesPerNode are immutable while the job "
            "runs: set spec.suspend to true first, then change them (and resume)",
            ".roles.learner", "FieldValueForbidden"),
)



def _cel_list(names: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{n}'" for n in names) + "]"


def _pod_template_rules(at: tuple[str, ...]) -> tuple[CelRule, ...]:
    """What the operator sets is refused in a podTemplate at `at` (each mirrors a podtemplate validator)."""
    where = ".".join(at)
    prefix = pt.RESERVED_PREFIX
    sources = ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef")
    one_source = ", ".join(f"has(e.valueFrom.{s})" for s in sources)
    return (
        CelRule((*at, "labels"), f"self.all(k, !(k in {_cel_list(pt.RESERVED_LABELS)}) && !k.startsWith('{prefix}'))",
                f"{where}.labels: {', '.join(pt.RESERVED_LABELS)} and {prefix}* are set by the operator"),
        CelRule((*at, "annotations"),
                f"self.all(k, !(k in {_cel_list(pt.RESERVED_ANNOTATIONS)}) && !k.startsWith('{prefix}'))",
                f"{where}.annotations: {', '.join(pt.RESERVED_ANNOTATIONS)} and {prefix}* are set by the operator"),
        CelRule((*at, "env"), f"self.all(e, !(e.name in {_cel_list(pt.RESERVED_ENV)}))",
                f"{where}.env: {', '.join(pt.RESERVED_ENV)} are set by the operator"),
        CelRule((*at, "env"), "self.all(e, !(has(e.value) && has(e.valueFrom)))",
                f"{where}.env: value and valueFrom are exclusive"),
        CelRule((*at, "env"), f"self.all(e, !has(e.valueFrom) || [{one_source}].filter(x, x).size() == 1)",
                f"{where}.env: valueFrom takes exactly one of {', '.join(sources)}"),
        CelRule((*at, "volumes"), f"self.all(v, !(v.name in {_cel_list(pt.RESERVED_VOLUMES)}))",
                f"{where}.volumes: {', '.join(pt.RESERVED_VOLUMES)} are the operator's volumes"),
        CelRule((*at, "volumeMounts"), f"self.all(m, !(m.mountPath in {_cel_list(pt.RESERVED_MOUNT_PATHS)}) && "
                f"!(m.name in {_cel_list(pt.RESERVED_VOLUMES)}))",
                f"{where}.volumeMounts: mountPath {', '.join(pt.RESERVED_MOUNT_PATHS)} and volumes "
                f"{', '.join(pt.RESERVED_VOLUMES)} are the operator's"),
    )


POD_TEMPLATES = (("spec", "podTemplate"),
                 *(("spec", "roles", role, "podTemplate") for role in ("generator", "verifier", "curriculum",
                                                                       "learner")))
CEL_RULES += tuple(rule for at in POD_TEMPLATES for rule in _pod_template_rules(at))
# Lists of a podTemplate are maps by their Kubernetes merge key: the API server refuses duplicates.
POD_TEMPLATE_LIST_KEYS = {"env": ["name"], "volumes": ["name"], "imagePullSecrets": ["name"],
                          "volumeMounts": ["mountPath"], "topologySpreadConstraints": ["topologyKey",
                                                                                       "whenUnsatisfiable"]}

# Printer columns read conditions by type, never by position.
PRINTER_COLUMNS: tuple[dict[str, Any], ...] = (
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    {"name": "Policy", "type": "integer", "jsonPath": ".status.policyVersion",
     "description": "Policy version the generators sample from"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.learnerStep", "description": "Learner step"},
    {"name": "Gen", "type": "string", "jsonPath": ".status.roles.generator.summary",
     "description": "Generator pods ready/desired"},
    {"name": "Ver", "type": "string", "jsonPath": ".status.roles.verifier.summary",
     "description": "Verifier pods ready/desired"},
    {"name": "Lag", "type": "integer", "jsonPath": ".status.lagTotal",
     "description": "Consumer-group lag over the job's topics, records"},
    {"name": "Staleness", "type": "string", "jsonPath": ".status.staleness.summary",
     "description": "Policy staleness current/bound k, versions"},
    {"name": "PassRate", "type": "number", "jsonPath": ".status.passRate", "description": "Held-out mean@k"},
    {"name": "A", "type": "number", "jsonPath": ".status.fit.A", "description": "Fitted asymptotic pass rate"},
    {"name": "Reason", "type": "string", "priority": 1,
     "jsonPath": '.status.conditions[?(@.type=="Ready")].reason'},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
)


class SchemaError(ValueError):
    """A pydantic schema construct with no structural-schema equivalent."""


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if ref is None:
        return node
    target: dict[str, Any] = copy.deepcopy(defs[ref.removeprefix("#/$defs/")])
    for key, value in node.items():
        if key != "$ref":
            target[key] = value
    return target


def _structural(node: dict[str, Any], defs: dict[str, Any], where: str) -> dict[str, Any]:
    """One pydantic JSON Schema node as a structural OpenAPI v3 node (recursively)."""
    node = _resolve(node, defs)
    out: dict[str, Any] = {k: v for k, v in node.items() if k not in _DROPPED_KEYS}
    if "anyOf" in out:
        branches = [_resolve(b, defs) for b in out.pop("anyOf")]
        non_null = [b for b in branches if b.get("type") != "null"]
        if out.get("x-kubernetes-int-or-string"):
            return {**out, "anyOf": [{"type": "integer"}, {"type": "string"}]}
        if len(non_null) != 1:
            raise SchemaError(f"{where}: a union of {len(non_null)} types has no structural schema")
        if len(non_null) < len(branches):
            out["nullable"] = True
            if out.get("default", 0) is None:
                del out["default"]
        out = {**_structural(non_null[0], defs, where), **out}
    if "const" in out:
        out["enum"] = [out.pop("const")]
    for bound in ("Minimum", "Maximum"):
        value = out.get(f"exclusive{bound}")
        if isinstance(value, int | float) and not isinstance(value, bool):  # 2020-12 number -> 3.0 boolean
            out[bound.lower()] = value
            out[f"exclusive{bound}"] = True
    if "prefixItems" in out:  # tuple[T, T]: a fixed-length array of one item type
        items = [_structural(i, defs, where) for i in out.pop("prefixItems")]
        if any(i != items[0] for i in items):
            raise SchemaError(f"{where}: a tuple of mixed item types has no structural schema")
        out["items"] = items[0]
    elif isinstance(out.get("items"), dict):
        out["items"] = _structural(out["items"], defs, f"{where}[]")
    _object_structural(out, defs, where)
    if "type" not in out and not out.get("x-kubernetes-int-or-string"):
        raise SchemaError(f"{where}: no type")
    return out


def _object_structural(out: dict[str, Any], defs: dict[str, Any], where: str) -> None:
    """Properties, maps and free-form objects of `out`, converted in place."""
    extra = out.pop("additionalProperties", None)
    if "properties" in out:
        required = set(out.get("required", ()))
        props = {}
        for name, sub in out["properties"].items():
            prop = _structural(sub, defs, f"{where}.{name}")
            if (prop.get("type") == "object" and "properties" in prop and "default" not in prop
                    and name not in required and not prop.get("nullable")
                    and not prop.get("required")):
                prop["default"] = {}  # all its fields have defaults: the server fills them in
            props[name] = prop
        out["properties"] = props
        # extra="forbid" needs no schema (the server's strict field validation rejects unknown keys);
        # extra="allow" keeps unknown keys
        if extra is True:
            out["x-kubernetes-preserve-unknown-fields"] = True
    elif isinstance(extra, dict):  # dict[str, T]: a map
        out["additionalProperties"] = _structural(extra, defs, f"{where}{{}}")
    elif out.get("type") == "object" and extra is True:  # dict[str, Any]: kept as given
        out["x-kubernetes-preserve-unknown-fields"] = True


def _from_model(schema: dict[str, Any], where: str) -> dict[str, Any]:
    return _structural(schema, schema.get("$defs", {}), where)


_KEY_ORDER = ("type", "description", "format", "enum", "default", "nullable", "minimum", "exclusiveMinimum",
              "maximum", "exclusiveMaximum", "minLength", "maxLength", "pattern", "minItems", "maxItems",
              "maxProperties", "required")


def _tidy(node: Any, keep_defaults: bool = True) -> Any:
    """Keys in a readable order (type and description first), recursively; optionally no defaults."""
    if isinstance(node, list):
        return [_tidy(v, keep_defaults) for v in node]
    if not isinstance(node, dict):
        return node
    rank = {k: i for i, k in enumerate(_KEY_ORDER)}
    out = {}
    for key in sorted(node, key=lambda k: (rank.get(k, len(rank)), 0)):
        if key == "default" and not keep_defaults:
            continue
        value = node[key]
        if key == "properties":  # property names keep the model's order
            out[key] = {name: _tidy(sub, keep_defaults) for name, sub in value.items()}
        elif key in ("enum", "default", "x-kubernetes-validations", "required"):  # data, not schemas
            out[key] = value
        else:
            out[key] = _tidy(value, keep_defaults)
    return out


def job_schema() -> dict[str, Any]:
    """The schema of spec.job: JobSpec's, without the fields the RLJob supplies itself."""
    schema = _from_model(JobSpec.model_json_schema(mode="validation"), "spec.job")
    for name in JOB_EXCLUDED_FIELDS:
        schema["properties"].pop(name)
    schema.pop("required", None)
    schema["description"] = ("A scalerl JobSpec (the YAML of `scalerl run`) without name (metadata.name), "
                             "runtime (set from spec.bus and spec.store) and stop_policy (spec.stopPolicy).")
    return schema


def _at(schema: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    node = schema
    for key in path:
        node = node["properties"][key]
    return node


def openapi_schema() -> dict[str, Any]:
    """The RLJob's openAPIV3Schema: apiVersion, kind, metadata (name rules), spec, status."""
    spec = _from_model(RLJobSpec.model_json_schema(mode="validation", by_alias=True), "spec")
    spec["properties"]["job"] = {**job_schema(), "default": {}}
    status = _from_model(RLJobStatus.model_json_schema(mode="serialization", by_alias=True), "status")
    status["properties"]["conditions"].update({
        "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]})
    root: dict[str, Any] = {
        "type": "object",
        "description": "RLJob: a scalerl reinforcement-learning job (generators, verifiers, curriculum, learner).",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object", "properties": {
                "name": {"type": "string", "maxLength": NAME_MAX_LENGTH, "pattern": NAME_PATTERN}}},
            "spec": _tidy(spec),
            # status is what the operator writes: no server-side defaults there
            "status": _tidy(status, keep_defaults=False),
        },
    }
    for at in POD_TEMPLATES:
        for key, map_keys in POD_TEMPLATE_LIST_KEYS.items():
            _at(root, (*at, key)).update({"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": map_keys})
    for cel in CEL_RULES:
        node = _at(root, cel.path)
        node.setdefault("x-kubernetes-validations", []).append(cel.entry())
        if node.get("default") == {}:
            # The API server checks a default against the rules of its own node without defaulting
            # inside it first, so `{}` would fail `self.k >= 1` ("no such key"): spell it out.
            node["default"] = defaulted(node, {})
    return root


def defaulted(node: dict[str, Any], obj: Any) -> Any:
    """`obj` with the schema's defaults filled in as the API server does: a missing property gets its
    default, which is defaulted in turn; map values and list items are defaulted too."""
    obj = copy.deepcopy(obj)
    if isinstance(obj, dict) and "properties" in node:
        for key, sub in node["properties"].items():
            if key not in obj and "default" in sub:
                obj[key] = copy.deepcopy(sub["default"])
            if key in obj:
                obj[key] = defaulted(sub, obj[key])
    elif isinstance(obj, dict) and isinstance(node.get("additionalProperties"), dict):
        obj = {k: defaulted(node["additionalProperties"], v) for k, v in obj.items()}
    elif isinstance(obj, list) and isinstance(node.get("items"), dict):
        obj = [defaulted(node["items"], v) for v in obj]
    return obj


def crd() -> dict[str, Any]:
    """The apiextensions.k8s.io/v1 CustomResourceDefinition object."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {"app.kubernetes.io/name": "scalerl",
                                                   "app.kubernetes.io/component": "crd"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL, "singular": SINGULAR,
                      "shortNames": [SHORT_NAME], "categories": ["scalerl"]},
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": openapi_schema()},
                "subresources": {"status": {}},
                "additionalPrinterColumns": [dict(c) for c in PRINTER_COLUMNS],
            }],
        },
    }


def crd_yaml() -> str:
    header = ("# Generated by `python -m scalerl_operator.api.crd` from the models in operators/scalerl_operator/api/: "
              "do not edit.\n")
    return header + str(yaml.safe_dump(crd(), sort_keys=False, width=120, allow_unicode=True))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["-"]):
        print(f"usage: python -m scalerl_operator.api.crd > crd.yaml (unexpected arguments: {' '.join(args)})",
              file=sys.stderr)
        return 2
    sys.stdout.write(crd_yaml())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
