"""Pod-template overrides of an RLJob (`spec.podTemplate`, job-wide, and `spec.roles.<role>.podTemplate`):
the part of a Kubernetes PodTemplateSpec a platform team shapes pods with, as a validated subset.

Fields: `labels`, `annotations` (the pod template's metadata); `serviceAccountName`,
`imagePullSecrets`, `affinity`, `topologySpreadConstraints`, `priorityClassName`,
`runtimeClassName`, `schedulerName`, `volumes` (the pod spec); `env`, `volumeMounts` (the role's one
container). Everything else of a pod (containers, command, probes, security context, ports) is the
operator's; per role, `image`, `resources`, `nodeSelector` and `tolerations` stay where they were.

Merge (`merge`): the job-wide `spec.podTemplate` first, the role's over it, then into what the
operator renders:
- scalars (serviceAccountName, priorityClassName, runtimeClassName, schedulerName): the role's when set;
- labels, annotations: key by key, the role's value wins;
- lists merge by their Kubernetes merge key, the role's entry replacing the job-wide one of the same key
  and keeping its place: env and volumes and imagePullSecrets by `name`, volumeMounts by `mountPath`,
  topologySpreadConstraints by (`topologyKey`, `whenUnsatisfiable`); new entries are appended;
- affinity: per kind (nodeAffinity, podAffinity, podAntiAffinity), the role's replaces the job-wide one.
A role cannot remove a job-wide entry (it can replace it). The operator's image pull secrets (the
chart's `imagePullSecrets`) come first, merged by name with both.

What the operator sets itself is refused, by the CRD (CEL) and by the operator, with the field named:
its labels (`RESERVED_LABELS` and any `scalerl.dev/` key), annotations (`RESERVED_ANNOTATIONS`, any
`scalerl.dev/` key), env names (`RESERVED_ENV`), volume names (`RESERVED_VOLUMES`) and mount paths
(`RESERVED_MOUNT_PATHS`). Nothing is silently overridden. `affinity` and each volume's source are the
Kubernetes types, kept as given (x-kubernetes-preserve-unknown-fields): the API server checks them
when the operator applies the children (a bad one fails the RLJob with ChildApplyFailed, naming it).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StringConstraints, field_validator, model_validator

from scalerl_operator.api.k8s_model import MAX_MAP_ENTRIES, K8sModel

MAX_ENV = 128
MAX_VOLUMES = 64
MAX_PULL_SECRETS = 16
MAX_SPREAD = 8
RESERVED_PREFIX = "scalerl.dev/"
# what render/children.py sets (tests/unit/operator/test_pod_template.py keeps these equal to the rendering)
RESERVED_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component",
                   "app.kubernetes.io/managed-by", "apps.kubernetes.io/pod-index")
RESERVED_ANNOTATIONS = ("prometheus.io/scrape", "prometheus.io/port", "prometheus.io/scheme")
RESERVED_ENV = ("POD_NAME", "POD_NAMESPACE", "HOME", "SCALERL_CACHE", "PYTHONUNBUFFERED", "S3_ENDPOINT",
                "S3_ACCESS_KEY", "S3_SECRET_KEY", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SERVICE_NAME",
                "OTEL_RESOURCE_ATTRIBUTES", "NODE_RANK", "SCALERL_RPC_TLS_DIR", "SCALERL_RPC_CLIENTS",
                "SCALERL_RPC_PLAINTEXT")  # (plain text cannot be switched on from a pod template)
RESERVED_VOLUMES = ("job-spec", "work", "tmp", "dshm", "rpc-tls")
RESERVED_MOUNT_PATHS = ("/etc/scalerl", "/home/scalerl", "/tmp", "/dev/shm", "/var/run/scalerl/rpc")

DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
Subdomain = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)]
VolumeName = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=DNS_LABEL)]
EnvName = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")]
Key = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")]
LabelKey = Annotated[str, StringConstraints(min_length=1, max_length=317)]
Labels = Annotated[dict[LabelKey, Annotated[str, StringConstraints(max_length=63)]], Field(max_length=MAX_MAP_ENTRIES)]
Annotations = Annotated[dict[LabelKey, Annotated[str, StringConstraints(max_length=4096)]],
                        Field(max_length=MAX_MAP_ENTRIES)]
Path = Annotated[str, StringConstraints(min_length=1, max_length=1024, pattern=r"^/")]
Short = Annotated[str, StringConstraints(max_length=253)]


class LocalObjectReference(K8sModel):
    name: Subdomain = Field(description="Name of an object in the RLJob's namespace.")


class KeyRef(K8sModel):
    """A key of a ConfigMap or Secret (configMapKeyRef / secretKeyRef)."""

    name: Subdomain = Field(description="The ConfigMap or Secret, in the RLJob's namespace.")
    key: Key = Field(description="The key.")
    optional: bool | None = Field(None, description="Start the pod even when the key is missing.")


class FieldRef(K8sModel):
    field_path: Short = Field(min_length=1, description="e.g. metadata.name, status.podIP, spec.nodeName.")
    api_version: Short | None = Field(None, description="Default v1.")


class ResourceFieldRef(K8sModel):
    resource: Short = Field(min_length=1, description="e.g. limits.memory, requests.cpu.")
    container_name: Short | None = Field(None, description="Default: the role's container.")


class EnvVarSource(K8sModel):
    field_ref: FieldRef | None = None
    resource_field_ref: ResourceFieldRef | None = None
    config_map_key_ref: KeyRef | None = None
    secret_key_ref: KeyRef | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> EnvVarSource:
        if sum(v is not None for v in (self.field_ref, self.resource_field_ref, self.config_map_key_ref,
                                       self.secret_key_ref)) != 1:
            raise ValueError("exactly one of fieldRef, resourceFieldRef, configMapKeyRef, secretKeyRef")
        return self


class EnvVar(K8sModel):
    name: EnvName = Field(description="Variable name (not one the operator sets).")
    value: Annotated[str, StringConstraints(max_length=32768)] | None = Field(
        None, description="Value; $(VAR) expands earlier variables.")
    value_from: EnvVarSource | None = Field(None, description="Value from a field, resource, ConfigMap or Secret.")

    @model_validator(mode="after")
    def _one_source(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise ValueError(f"env {self.name}: value and valueFrom are exclusive")
        return self


class VolumeMount(K8sModel):
    name: VolumeName = Field(description="A volume of podTemplate.volumes (job-wide or the role's).")
    mount_path: Path = Field(description="Absolute path in the container (not one the operator mounts).")
    sub_path: Short | None = Field(None, description="Path within the volume.")
    read_only: bool | None = Field(None, description="Mount read-only.")


class Volume(K8sModel):
    """A corev1.Volume: `name` plus one volume source (persistentVolumeClaim, secret, configMap, csi,
    emptyDir, nfs, ...), kept as given and checked by the API server when the children are applied."""

    model_config = ConfigDict(extra="allow")

    name: VolumeName = Field(description="Volume name (not one the operator uses).")


class LabelSelectorRequirement(K8sModel):
    key: LabelKey
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[Annotated[str, StringConstraints(max_length=63)]] = Field(default_factory=list, max_length=64)


class LabelSelector(K8sModel):
    match_labels: Labels = Field(default_factory=dict)
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list, max_length=16)


class TopologySpreadConstraint(K8sModel):
    max_skew: int = Field(ge=1, le=1024, description="Most pods more in one domain than in the emptiest.")
    topology_key: LabelKey = Field(description="Node label of the domains, e.g. topology.kubernetes.io/zone.")
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"] = Field(description="Hard or soft.")
    label_selector: LabelSelector | None = Field(
        None, description="Pods counted; default: none (set it, e.g. to scalerl.dev/job and the component).")
    min_domains: int | None = Field(None, ge=1, le=1024, description="DoNotSchedule only.")
    match_label_keys: list[LabelKey] = Field(default_factory=list, max_length=16)
    node_affinity_policy: Literal["Honor", "Ignore"] | None = None
    node_taints_policy: Literal["Honor", "Ignore"] | None = None


class Affinity(K8sModel):
    """corev1.Affinity; each kind is the Kubernetes type, kept as given (checked on apply)."""

    node_affinity: dict[str, Any] | None = Field(None, description="corev1.NodeAffinity.")
    pod_affinity: dict[str, Any] | None = Field(None, description="corev1.PodAffinity.")
    pod_anti_affinity: dict[str, Any] | None = Field(None, description="corev1.PodAntiAffinity.")


def _refused(what: str, found: list[str], rule: str) -> ValueError:
    return ValueError(f"set by the operator, not allowed in a podTemplate: {', '.join(found)} (the operator's "
                      f"{what}: {rule})")


class PodTemplate(K8sModel):
    """Pod-template override (see scalerl_operator.api.podtemplate for the merge rules)."""

    labels: Labels = Field(default_factory=dict, description="Pod labels (not the operator's own).")
    annotations: Annotations = Field(default_factory=dict, description="Pod annotations (not the operator's own).")
    service_account_name: Subdomain | None = Field(None, description="ServiceAccount the pods run as.")
    image_pull_secrets: list[LocalObjectReference] = Field(default_factory=list, max_length=MAX_PULL_SECRETS,
                                                           description="Secrets to pull the image with.")
    affinity: Affinity | None = Field(None, description="Node and pod (anti-)affinity.")
    topology_spread_constraints: list[TopologySpreadConstraint] = Field(default_factory=list, max_length=MAX_SPREAD)
    priority_class_name: Subdomain | None = Field(None, description="PriorityClass of the pods.")
    runtime_class_name: Subdomain | None = Field(None, description="RuntimeClass, e.g. nvidia.")
    scheduler_name: Subdomain | None = Field(None, description="Scheduler of the pods, e.g. a gang scheduler.")
    env: list[EnvVar] = Field(default_factory=list, max_length=MAX_ENV, description="Extra container env.")
    volumes: list[Volume] = Field(default_factory=list, max_length=MAX_VOLUMES, description="Extra volumes.")
    volume_mounts: list[VolumeMount] = Field(default_factory=list, max_length=MAX_VOLUMES,
                                             description="Extra mounts of the role's container.")

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        if bad := [k for k in v if k in RESERVED_LABELS or k.startswith(RESERVED_PREFIX)]:
            raise _refused("labels", bad, f"{', '.join(RESERVED_LABELS)} and {RESERVED_PREFIX}*")
        return v

    @field_validator("annotations")
    @classmethod
    def _annotations(cls, v: dict[str, str]) -> dict[str, str]:
        if bad := [k for k in v if k in RESERVED_ANNOTATIONS or k.startswith(RESERVED_PREFIX)]:
            raise _refused("annotations", bad, f"{', '.join(RESERVED_ANNOTATIONS)} and {RESERVED_PREFIX}*")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: list[EnvVar]) -> list[EnvVar]:
        if bad := [e.name for e in v if e.name in RESERVED_ENV]:
            raise _refused("env", bad, ", ".join(RESERVED_ENV))
        return _unique(v, lambda e: e.name, "env", "name")

    @field_validator("volumes")
    @classmethod
    def _volumes(cls, v: list[Volume]) -> list[Volume]:
        if bad := [x.name for x in v if x.name in RESERVED_VOLUMES]:
            raise _refused("volumes", bad, ", ".join(RESERVED_VOLUMES))
        return _unique(v, lambda x: x.name, "volumes", "name")

    @field_validator("volume_mounts")
    @classmethod
    def _mounts(cls, v: list[VolumeMount]) -> list[VolumeMount]:
        if bad := [m.mount_path for m in v if m.mount_path in RESERVED_MOUNT_PATHS or m.name in RESERVED_VOLUMES]:
            raise _refused("volumeMounts", bad, "mountPath " + ", ".join(RESERVED_MOUNT_PATHS) + "; volumes "
                           + ", ".join(RESERVED_VOLUMES))
        return _unique(v, lambda m: m.mount_path, "volumeMounts", "mountPath")

    @field_validator("image_pull_secrets")
    @classmethod
    def _secrets(cls, v: list[LocalObjectReference]) -> list[LocalObjectReference]:
        return _unique(v, lambda s: s.name, "imagePullSecrets", "name")

    @field_validator("topology_spread_constraints")
    @classmethod
    def _spread(cls, v: list[TopologySpreadConstraint]) -> list[TopologySpreadConstraint]:
        return _unique(v, lambda t: f"{t.topology_key}/{t.when_unsatisfiable}", "topologySpreadConstraints",
                       "(topologyKey, whenUnsatisfiable)")


def _unique(items: list[Any], key: Any, field: str, what: str) -> list[Any]:
    seen: set[str] = set()
    for item in items:
        k = key(item)
        if k in seen:
            raise ValueError(f"duplicate {what} {k!r} in {field}")
        seen.add(k)
    return items


def _by_key(base: list[dict[str, Any]], over: list[dict[str, Any]], key: Any) -> list[dict[str, Any]]:
    """Strategic merge of two lists by a merge key: `over` replaces `base`'s entry in place, or is appended."""
    out = list(base)
    index = {key(x): i for i, x in enumerate(out)}
    for item in over:
        if (i := index.get(key(item))) is not None:
            out[i] = item
        else:
            index[key(item)] = len(out)
            out.append(item)
    return out


def _dump(t: PodTemplate) -> dict[str, Any]:
    return t.model_dump(by_alias=True, exclude_none=True, mode="json")


def merge(*layers: PodTemplate, pull_secrets: tuple[str, ...] = ()) -> dict[str, Any]:
    """The effective override of one role: `layers` (job-wide, then the role's) merged in order, after
    the operator's default pull secrets. Keys are the camelCase Kubernetes ones; empty ones are left out."""
    out: dict[str, Any] = {"labels": {}, "annotations": {}, "imagePullSecrets": [{"name": n} for n in pull_secrets],
                           "env": [], "volumes": [], "volumeMounts": [], "topologySpreadConstraints": []}
    keys: dict[str, Any] = {"imagePullSecrets": lambda x: x["name"], "env": lambda x: x["name"],
                            "volumes": lambda x: x["name"], "volumeMounts": lambda x: x["mountPath"],
                            "topologySpreadConstraints": lambda x: (x["topologyKey"], x["whenUnsatisfiable"])}
    for layer in layers:
        d = _dump(layer)
        for name in ("labels", "annotations"):
            out[name].update(d[name])
        for name, key in keys.items():
            out[name] = _by_key(out[name], d[name], key)
        for name in ("serviceAccountName", "priorityClassName", "runtimeClassName", "schedulerName"):
            if name in d:
                out[name] = d[name]
        if "affinity" in d:
            out["affinity"] = {**out.get("affinity", {}), **d["affinity"]}
    return {k: v for k, v in out.items() if v not in ({}, [])}


def missing_volumes(merged: dict[str, Any]) -> list[str]:
    """Mount names of a merged override that name no volume of it."""
    names = {v["name"] for v in merged.get("volumes", [])}
    return [m["name"] for m in merged.get("volumeMounts", []) if m["name"] not in names]
