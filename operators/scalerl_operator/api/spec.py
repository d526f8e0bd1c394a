"""The RLJob custom resource (`scalerl.dev/v1alpha1`) as pydantic models (the status ones live in
`scalerl_operator.api.status` and are re-exported here; the roles' autoscaling settings in
`scalerl_operator.api.autoscaling`, the bus, store and telemetry in `scalerl_operator.api.infra`).

These models are the single source of the CRD's OpenAPI schema (`scalerl_operator.api.crd`) and what the
operator parses every RLJob it sees with. Kubernetes parts use camelCase keys (aliases; Python names
are snake_case); `spec.job` is exactly a `scalerl.config.JobSpec` without `name` (that is
`metadata.name`) and `runtime` (the operator fills bus and store from `spec.bus` / `spec.store`), with
the same snake_case keys as the YAML that `scalerl run` reads, validated by the same rules.

`parse_rljob(obj)` validates a whole RLJob object (a dict from the API server) and raises
`scalerl.config.SpecError` with a one-line message naming the field, as `load_spec` does.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from scalerl.config import (
    JobSpec,
    RuntimeConfig,
    SpecError,
    StopPolicyConfig,
    WeightBroadcastConfig,
    WeightSyncConfig,
    spec_from_dict,
)
from scalerl_operator.api.autoscaling import GeneratorAutoscaling, VerifierAutoscaling
from scalerl_operator.api.infra import GRPC_PORT, TORCH_PORT, BusSpec, RpcSpec, StoreSpec, TelemetrySpec
from scalerl_operator.api.k8s_model import (
    MAX_CONDITIONS,
    MAX_IMAGE_LENGTH,
    MAX_MAP_ENTRIES,
    MAX_REPLICAS,
    MAX_TOLERATIONS,
    MAX_URI_LENGTH,
    K8sModel,
)
from scalerl_operator.api.newer_fields import NESTED, FieldsFromNewerCRD, prune_unknown
from scalerl_operator.api.podtemplate import PodTemplate, merge, missing_volumes
from scalerl_operator.api.status import (
    Checkpoint,
    Condition,
    ConditionStatus,
    Fit,
    Phase,
    Recommendation,
    RLJobStatus,
    RoleReplicas,
    RolesStatus,
    ScalingState,
    ScalingStatus,
    Staleness,
)

GROUP = "scalerl.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "RLJob"
PLURAL = "rljobs"
SINGULAR = "rljob"
SHORT_NAME = "rlj"

# An RLJob's name prefixes its children (`J-curriculum`, StatefulSet `J-learner` whose pods carry a
# `controller-revision-hash` label of `J-learner-<10 chars>`, at most 63): 40 keeps every one valid.
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
NAME_MAX_LENGTH = 40
# A Kubernetes resource quantity (the pattern apimachinery publishes for resource.Quantity).
QUANTITY_PATTERN = (r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
                    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")


def _quantity(value: int | str) -> int | str:
    if isinstance(value, str) and (len(value) > 64 or not re.match(QUANTITY_PATTERN, value)):
        raise ValueError(f"not a resource quantity such as 2, \"500m\" or \"16Gi\" (got {value!r})")
    return value


# int-or-string, as resource.Quantity is in Kubernetes schemas (crd.py keeps the anyOf for it).
Quantity = Annotated[int | str, AfterValidator(_quantity), Field(
    description="A resource quantity: 4, \"500m\", \"16Gi\".",
    json_schema_extra={"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN})]
ResourceMap = Annotated[dict[Annotated[str, StringConstraints(max_length=253)], Quantity],
                        Field(max_length=MAX_MAP_ENTRIES)]
LabelMap = Annotated[dict[Annotated[str, StringConstraints(max_length=317)],
                          Annotated[str, StringConstraints(max_length=63)]],
                     Field(max_length=MAX_MAP_ENTRIES)]
Image = Annotated[str, StringConstraints(max_length=MAX_IMAGE_LENGTH)]


RoleName = Literal["generator", "verifier", "curriculum", "learner"]
ROLE_NAMES: tuple[RoleName, ...] = ("generator", "verifier", "curriculum", "learner")


# ---- per-role pod settings --------------------------------------------------------------------------

class ResourceRequirements(K8sModel):
    """corev1.ResourceRequirements (requests/limits), e.g. `limits: {nvidia.com/gpu: 1}`."""

    limits: ResourceMap = Field(default_factory=dict, description="Most a container may use.")
    requests: ResourceMap = Field(default_factory=dict, description="What the scheduler reserves.")


class Toleration(K8sModel):
    """corev1.Toleration."""

    key: Annotated[str, StringConstraints(max_length=317)] = Field("", description="Taint key; empty = all.")
    operator: Literal["Exists", "Equal"] = Field("Equal", description="Exists or Equal.")
    value: Annotated[str, StringConstraints(max_length=63)] = Field("", description="Taint value (Equal).")
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = Field(
        "", description="Taint effect to tolerate; empty = all.")
    toleration_seconds: int | None = Field(None, ge=0, description="NoExecute only: seconds bound before eviction.")


class PodPlacement(K8sModel):
    image: Image = Field("", description="Container image of this role; empty = spec.image.")
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    node_selector: LabelMap = Field(default_factory=dict, description="Node labels the pods must match.")
    tolerations: list[Toleration] = Field(default_factory=list, max_length=MAX_TOLERATIONS)
    pod_template: PodTemplate = Field(default_factory=PodTemplate, description=(
        "Pod-template override of this role, merged over spec.podTemplate (README: Shaping pods)."))


class GeneratorRole(PodPlacement):
    replicas: int = Field(1, ge=0, le=MAX_REPLICAS, description="Generator pods (autoscaling off).")
    autoscaling: GeneratorAutoscaling = Field(default_factory=GeneratorAutoscaling)


class VerifierRole(PodPlacement):
    replicas: int = Field(1, ge=0, le=MAX_REPLICAS, description="Verifier pods (autoscaling off).")
    autoscaling: VerifierAutoscaling = Field(default_factory=VerifierAutoscaling)


class CurriculumRole(PodPlacement):
    """The curriculum is one pod (it owns the prompt pool and its pass-rate history)."""


class LearnerRole(PodPlacement):
    """The learner: a StatefulSet of `nodes` pods, each running torchrun with `devicesPerNode` ranks."""

    nodes: int = Field(1, ge=1, le=256, description="Learner pods (torchrun nodes); immutable unless suspended.")
    devices_per_node: int = Field(1, ge=1, le=64, description="Ranks per pod; immutable unless suspended.")


class Roles(K8sModel):
    generator: GeneratorRole = Field(default_factory=GeneratorRole)
    verifier: VerifierRole = Field(default_factory=VerifierRole)
    curriculum: CurriculumRole = Field(default_factory=CurriculumRole)
    learner: LearnerRole = Field(default_factory=LearnerRole)


class FailurePolicy(K8sModel):
    max_restarts: int = Field(3, ge=0, le=1000, description="Learner restarts (from the last checkpoint) "
                              "before the job is Failed; generator/verifier pods are always replaced.")
    progress_deadline_seconds: int | None = Field(
        None, ge=1, le=86_400, description="Restart the learner group when its step has not advanced for this "
        "long while it runs (counts as a restart); null = no watchdog.")


class StopPolicy(K8sModel):
    """Stop the run early on its forecast (`JobSpec.stop_policy`, whose fields these are in the RLJob's
    casing); off unless minGain or target is set. The learner decides after each eval and never on a forecast
    that is not identified; the job then ends Succeeded with reason ForecastPlateau or ForecastBelowTarget,
    status.stoppedEarly holding the numbers it acted on."""

    min_gain: float | None = Field(None, gt=0.0, lt=1.0,
                                   description=StopPolicyConfig.model_fields["min_gain"].description)
    target: float | None = Field(None, gt=0.0, le=1.0, description=StopPolicyConfig.model_fields["target"].description)
    level: float = Field(0.95, ge=0.5, lt=1.0, description=StopPolicyConfig.model_fields["level"].description)

    def to_config(self) -> dict[str, Any]:
        """The JobSpec's `stop_policy` tree."""
        return StopPolicyConfig(min_gain=self.min_gain, target=self.target, level=self.level).model_dump()


def _ws(field: str) -> str | None:
    return WeightSyncConfig.model_fields[field].description


def _wb(field: str) -> str | None:
    return WeightBroadcastConfig.model_fields[field].description


class WeightBroadcast(K8sModel):
    """The broadcast path (`JobSpec.runtime.weight_sync.broadcast`): the learner also pushes each version to the
    generators over torch.distributed. The address is rendered: learner rank 0's Pod name through its headless
    Service; the job's NetworkPolicy already lets its role Pods reach each other on any port (gloo's too)."""

    enabled: bool = Field(False, description=_wb("enabled"))
    port: int = Field(29650, ge=1, le=65535, description=_wb("port"))
    generators: int = Field(0, ge=0, le=4096, description=_wb("generators"))
    timeout_s: float = Field(30.0, gt=0, le=3600, description=_wb("timeout_s"))
    backend: Literal["gloo", "nccl"] = Field("gloo", description=_wb("backend"))

    def to_config(self, address: str) -> WeightBroadcastConfig:
        return WeightBroadcastConfig(enabled=self.enabled, address=address, port=self.port,
                                     generators=self.generators, timeout_s=self.timeout_s, backend=self.backend)


class WeightSync(K8sModel):
    """How policy versions reach the generators through the job's store (`JobSpec.runtime.weight_sync`, whose
    fields these are in the RLJob's casing): a snapshot every snapshotEvery versions, deltas between, and
    optionally a broadcast to the generators beside the store."""

    dtype: Literal["model", "bfloat16", "float16", "float32"] = Field("model", description=_ws("dtype"))
    delta: bool = Field(True, description=_ws("delta"))
    snapshot_every: int = Field(10, ge=1, le=10_000, description=_ws("snapshot_every"))
    shard_mb: int = Field(32, ge=1, le=4096, description=_ws("shard_mb"))
    parallel: int = Field(4, ge=1, le=64, description=_ws("parallel"))
    keep_last: int = Field(3, ge=1, le=1000, description=_ws("keep_last"))
    prefetch: bool = Field(True, description=_ws("prefetch"))
    broadcast: WeightBroadcast = Field(default_factory=WeightBroadcast, description=_ws("broadcast"))

    def to_config(self, broadcast_address: str) -> WeightSyncConfig:
        """The JobSpec's tree; `broadcast_address`: where the generators reach the learner (rendered)."""
        return WeightSyncConfig(dtype=self.dtype, delta=self.delta, snapshot_every=self.snapshot_every,
                                shard_mb=self.shard_mb, parallel=self.parallel, keep_last=self.keep_last,
                                prefetch=self.prefetch, broadcast=self.broadcast.to_config(broadcast_address))


class RLJobSpec(K8sModel):
    job: dict[str, Any] = Field(default_factory=dict, description=(
        "A scalerl JobSpec without name, runtime and stop_policy."))
    suspend: bool = Field(False, description="Scale every role to zero, keeping checkpoints.")
    active_deadline_seconds: int | None = Field(
        None, ge=1, description="Seconds after the start before the job is Failed; null = none.")
    image: Image = Field("", description=(
        "Default image of every role; empty = the operator's default (the chart's image.repository:tag), "
        "pinned into the job's children when they are first created."))
    image_pull_policy: Literal["", "Always", "IfNotPresent", "Never"] = Field(
        "", description="Empty = the operator's default (the chart's image.pullPolicy).")
    pod_template: PodTemplate = Field(default_factory=PodTemplate, description=(
        "Pod-template override of every role (job-wide default; each role's podTemplate is merged over it)."))
    bus: BusSpec
    store: StoreSpec
    telemetry: TelemetrySpec = Field(default_factory=TelemetrySpec)
    rpc: RpcSpec = Field(default_factory=RpcSpec, description=(
        "The roles' gRPC endpoints: mutual TLS under a CA the operator makes for the job; extra identities."))
    failure_policy: FailurePolicy = Field(default_factory=FailurePolicy)
    stop_policy: StopPolicy = Field(default_factory=StopPolicy, description=(
        "Stop early when an identified forecast says the rest of the budget adds less than minGain, or the "
        "ceiling stays below target (off by default)."))
    weight_sync: WeightSync = Field(default_factory=WeightSync, description=(
        "How policy versions reach the generators: published dtype, deltas, snapshots, shard size, parallelism."))
    roles: Roles = Field(default_factory=Roles)
    queue_name: Annotated[str, StringConstraints(max_length=63, pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$")] = Field(
        "", description="Kueue LocalQueue: the operator queues the job there as one Workload (learner nodes and "
        "each pool's minimum) and runs its roles only while Kueue admits it. Empty = not queued.")

    @field_validator("job")
    @classmethod
    def _job_is_a_jobspec(cls, job: dict[str, Any]) -> dict[str, Any]:
        for key, why in (("name", "the job's name is metadata.name"),
                         ("runtime", "the operator sets it from spec.bus and spec.store"),
                         ("stop_policy", "set spec.stopPolicy")):
            if key in job:
                raise ValueError(f"{key}: not allowed here ({why})")
        try:
            spec_from_dict(job)
        except SpecError as exc:
            raise ValueError(str(exc)) from None
        return job

    @model_validator(mode="after")
    def _broadcast_port_is_free(self) -> RLJobSpec:
        taken = {GRPC_PORT: "gRPC", TORCH_PORT: "the learner ranks' rendezvous",
                 self.telemetry.metrics_port: "telemetry.metricsPort"}
        port = self.weight_sync.broadcast.port
        if self.weight_sync.broadcast.enabled and port in taken:
            raise ValueError(f"weightSync.broadcast.port: {port} is {taken[port]}'s port in the role Pods; "
                             f"choose another (not {', '.join(map(str, sorted(taken)))})")
        return self

    @model_validator(mode="after")
    def _mounts_name_volumes(self) -> RLJobSpec:
        for role in ROLE_NAMES:
            merged = merge(self.pod_template, getattr(self.roles, role).pod_template)
            if missing := missing_volumes(merged):
                raise ValueError(f"roles.{role}.podTemplate.volumeMounts: {', '.join(missing)}: no such volume in "
                                 f"spec.podTemplate.volumes or spec.roles.{role}.podTemplate.volumes")
        return self

    def pod_template_of(self, role: RoleName, pull_secrets: tuple[str, ...] = ()) -> dict[str, Any]:
        """The effective pod-template override of `role` (podtemplate.merge)."""
        return merge(self.pod_template, getattr(self.roles, role).pod_template, pull_secrets=pull_secrets)

    def topic_partitions(self) -> int:
        """spec.bus.partitions, where 0 means max(verifier maxReplicas, generator maxReplicas)."""
        return self.bus.partitions or max(self.roles.verifier.autoscaling.max_replicas,
                                          self.roles.generator.autoscaling.max_replicas)

    def image_of(self, role: RoleName, default: str = "") -> str:
        """The role's image, else spec.image, else `default` (the operator's)."""
        image: str = getattr(self.roles, role).image
        return image or self.image or default

    def job_spec(self, name: str, runtime: RuntimeConfig | None = None) -> JobSpec:
        """The full JobSpec this RLJob runs: `spec.job` plus the name and the runtime section."""
        tree = dict(self.job, name=name, stop_policy=self.stop_policy.to_config())
        if runtime is not None:
            tree["runtime"] = runtime.model_dump()
        return spec_from_dict(tree)


__all__ = ["MAX_CONDITIONS", "MAX_MAP_ENTRIES", "MAX_URI_LENGTH", "Checkpoint", "Condition", "ConditionStatus",
           "Fit", "Phase", "RLJob", "RLJobSpec", "RLJobStatus", "Recommendation", "RoleReplicas", "RolesStatus",
           "ScalingState", "ScalingStatus", "Staleness", "parse_rljob", "parse_spec"]


# ---- the whole object -------------------------------------------------------------------------------

class RLJob(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    api_version: Literal["scalerl.dev/v1alpha1"] = Field("scalerl.dev/v1alpha1", alias="apiVersion")
    kind: Literal["RLJob"] = "RLJob"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: RLJobSpec
    status: RLJobStatus = Field(default_factory=RLJobStatus)

    @field_validator("metadata")
    @classmethod
    def _name(cls, metadata: dict[str, Any]) -> dict[str, Any]:
        name = metadata.get("name")
        if name is not None and (len(name) > NAME_MAX_LENGTH or not re.match(NAME_PATTERN, name)):
            raise ValueError(f"name: must be a DNS label of at most {NAME_MAX_LENGTH} characters "
                             f"(lowercase letters, digits, '-') (got {name!r})")
        return metadata


def _error_line(err: ValidationError, root: str) -> str:
    first = err.errors()[0]
    path = ".".join(str(p) for p in (root, *first["loc"]) if p != "")
    msg = "unknown field" if first["type"] == "extra_forbidden" else first["msg"].removeprefix("Value error, ")
    more = f" (and {err.error_count() - 1} more problem(s))" if err.error_count() > 1 else ""
    inner = re.match(r"^([A-Za-z_][\w.]*): (.*)$", msg)  # spec.job's SpecError: "off_policy.k: ..."
    if first["type"] == "value_error" and inner:
        path, msg = f"{path}.{inner.group(1)}", inner.group(2)
    return f"{path}: {msg}{more}"


def parse_rljob(obj: dict[str, Any]) -> RLJob:
    """Validate an RLJob object (as the API server returns it); SpecError names the first bad field."""
    try:
        return RLJob.model_validate(obj)
    except ValidationError as exc:
        raise SpecError(_error_line(exc, "")) from None


def parse_spec(spec: dict[str, Any]) -> RLJobSpec:
    """Validate `spec` of an RLJob; SpecError's message starts with the dotted path (`spec.roles...`)."""
    try:
        return RLJobSpec.model_validate(spec)
    except ValidationError as exc:
        raise SpecError(_error_line(exc, "spec")) from None


def parse_served_spec(spec: dict[str, Any]) -> RLJobSpec:
    """`parse_spec` of an RLJob as the API server serves it: FieldsFromNewerCRD (a SpecError) when it is
    valid but for fields this build does not know, which only a newer CRD can serve (newer_fields)."""
    try:
        return RLJobSpec.model_validate(spec)
    except ValidationError as exc:
        unknown: list[str] = []
        pruned = prune_unknown(RLJobSpec, spec, "spec", NESTED, unknown)
        if unknown:
            try:
                known = RLJobSpec.model_validate(pruned)
            except ValidationError:
                pass
            else:
                raise FieldsFromNewerCRD(unknown, known) from None
        raise SpecError(_error_line(exc, "spec")) from None
