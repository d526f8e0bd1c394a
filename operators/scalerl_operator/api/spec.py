"""The RLJob custom resource (`scalerl.dev/v1alpha1`) as pydantic models (the status ones live in
`scalerl_operator.status` and are re-exported here).

These models are the single source of the CRD's OpenAPI schema (`scalerl_operator.crd`) and what the
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

from scalerl.config import JobSpec, RuntimeConfig, SpecError, spec_from_dict
from scalerl_operator.k8s_model import (
    MAX_CONDITIONS,
    MAX_IMAGE_LENGTH,
    MAX_MAP_ENTRIES,
    MAX_POLICIES,
    MAX_REPLICAS,
    MAX_TOLERATIONS,
    MAX_URI_LENGTH,
    K8sModel,
)
from scalerl_operator.newer_fields import NESTED, FieldsFromNewerCRD, prune_unknown
from scalerl_operator.podtemplate import PodTemplate, merge, missing_volumes
from scalerl_operator.status import (
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
# s3://bucket[/prefix]: a bucket name as S3 allows it (3-63 lowercase letters, digits, '.', '-').
S3_URI_PATTERN = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s]*)?$"
# A Kubernetes resource quantity (the pattern apimachinery publishes for resource.Quantity).
QUANTITY_PATTERN = (r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
                    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")


def _quantity(value: int | str) -> int | str:
    if isinstance(value, str) and (len(value) > 64 or not re.match(QUANTITY_PATTERN, value)):
        raise ValueError(f"not a resource quantity such as 2, \"500m\" or \"16Gi\" (got {value!r})")
    return value


# int-or-string, as resource.Quantity is in Kubernetes schemas (crd.py keeps the anyOf for it).
SecretField = Annotated[str, StringConstraints(min_length=1, max_length=253)]
"""A Secret's name or key (Kubernetes: at most 253 characters)."""
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


# ---- autoscaling (HPA v2 field names) ---------------------------------------------------------------

class ScalingPolicy(K8sModel):
    """At most `value` pods (type Pods) or percent of current replicas (type Percent) per period."""

    type: Literal["Pods", "Percent"] = Field(description="Pods or Percent.")
    value: int = Field(ge=1, le=10_000, description="Pods, or percent of the current replicas.")
    period_seconds: int = Field(ge=1, le=1800, description="Window the limit applies to, seconds.")


class ScaleUpRules(K8sModel):
    stabilization_window_seconds: int = Field(
        0, ge=0, le=3600, description="Take the min recommendation over this window, seconds.")
    select_policy: Literal["Max", "Min", "Disabled"] = Field("Max", description="Which policy limit wins.")
    policies: list[ScalingPolicy] = Field(
        default=[ScalingPolicy(type="Pods", value=4, period_seconds=15)], max_length=MAX_POLICIES)


class ScaleDownRules(K8sModel):
    stabilization_window_seconds: int = Field(
        300, ge=0, le=3600, description="Take the max recommendation over this window, seconds.")
    select_policy: Literal["Max", "Min", "Disabled"] = Field("Max", description="Which policy limit wins.")
    policies: list[ScalingPolicy] = Field(
        default=[ScalingPolicy(type="Percent", value=100, period_seconds=15)], max_length=MAX_POLICIES)


class ScalingBehavior(K8sModel):
    scale_up: ScaleUpRules = Field(default_factory=ScaleUpRules)
    scale_down: ScaleDownRules = Field(default_factory=ScaleDownRules)


class _Autoscaling(K8sModel):
    enabled: bool = Field(False, description="Off: replicas is used as given.")
    min_replicas: int = Field(1, ge=0, le=MAX_REPLICAS, description="Fewest replicas the autoscaler sets.")
    max_replicas: int = Field(4, ge=1, le=MAX_REPLICAS, description="Most replicas the autoscaler sets.")
    tolerance: float = Field(0.1, ge=0.0, le=1.0, description="No change while |ratio − 1| ≤ tolerance.")
    fallback_replicas: int = Field(1, ge=0, le=MAX_REPLICAS,
                                   description="Replicas after failureThreshold failed metric reads in a row.")
    failure_threshold: int = Field(3, ge=1, le=100, description="Failed metric reads before the fallback.")
    behavior: ScalingBehavior = Field(default_factory=ScalingBehavior)
    external: bool = Field(False, description="An external scaler (HPA, KEDA) owns the pool's replicas: the "
                           "operator sets `replicas` only when it creates the workload or resumes it from "
                           "suspension, never on a spec change. Needs enabled: false.")

    @model_validator(mode="after")
    def _min_le_max(self) -> _Autoscaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"minReplicas ({self.min_replicas}) must be <= maxReplicas ({self.max_replicas})")
        if self.external and self.enabled:
            raise ValueError("external: an external scaler and the operator's own (enabled) cannot both own replicas")
        return self


class GeneratorAutoscaling(_Autoscaling):
    """Generators scale on learner starvation and hold/shrink as policy staleness nears the bound k."""

    target_starvation: float = Field(
        0.1, gt=0.0, le=1.0, description="Target fraction of learner step time spent waiting for a batch.")
    staleness_headroom: int = Field(
        1, ge=0, le=1024, description="Hold when measured staleness is within this many versions of k.")


class VerifierAutoscaling(_Autoscaling):
    """Verifiers scale on the consumer-group lag of their input topic (KEDA-style)."""

    max_replicas: int = Field(8, ge=1, le=MAX_REPLICAS, description="Most replicas the autoscaler sets.")
    target_lag_per_replica: int = Field(50, ge=1, description="Records of lag one verifier is meant to carry.")
    activation_lag: int = Field(0, ge=0, description="Below this total lag: scale to minReplicas.")
    no_offset_policy: Literal["minReplicas", "hold", "lagFromEarliest"] = Field(
        "minReplicas", description="A group with no committed offset: minReplicas, hold the current count, "
                                   "or count lag from the earliest offset.")


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


# ---- infrastructure endpoints ----------------------------------------------------------------------

class KafkaSecretRef(K8sModel):
    name: SecretField = Field(
        description="Secret in the RLJob's namespace.")
    username_key: SecretField = Field(
        "username", description="Key of the SASL username (SASL protocols).")
    password_key: SecretField = Field(
        "password", description="Key of the SASL password (SASL protocols).")
    ca_key: Annotated[str, StringConstraints(max_length=253)] = Field(
        "", description="Key of the PEM CA bundle that signs the brokers' certificates (TLS protocols); "
        "empty = the image's system trust store.")


class KafkaSecuritySpec(K8sModel):
    """How the roles and the operator authenticate to Kafka and encrypt: the roles get the settings as
    SCALERL_KAFKA_* env (credentials from the Secret, the CA mounted as a file); the operator reads the
    same Secret for its own lag reads, topic creation and clean-up."""

    protocol: Literal["SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "SASL_SSL", description="SSL (TLS only), SASL_PLAINTEXT or SASL_SSL (SASL over TLS).")
    sasl_mechanism: Literal["", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        "", description="PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; required with SASL_*, empty with SSL.")
    secret_ref: KafkaSecretRef | None = Field(
        None, description="Secret with the SASL username/password and optionally the CA; required with SASL_*.")
    check_hostname: bool = Field(True, description="Match the brokers' certificates to their host names.")

    @model_validator(mode="after")
    def _consistent(self) -> KafkaSecuritySpec:
        sasl, tls = self.protocol.startswith("SASL_"), self.protocol != "SASL_PLAINTEXT"
        if sasl and not self.sasl_mechanism:
            raise ValueError(f"saslMechanism: required with {self.protocol} (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)")
        if not sasl and self.sasl_mechanism:
            raise ValueError(f"saslMechanism: {self.protocol} uses no SASL (leave it empty)")
        if sasl and self.secret_ref is None:
            raise ValueError(f"secretRef: required with {self.protocol} (the Secret with username and password)")
        if not tls and self.secret_ref is not None and self.secret_ref.ca_key:
            raise ValueError(f"secretRef.caKey: {self.protocol} uses no TLS (leave it empty)")
        if not tls and not self.check_hostname:
            raise ValueError(f"checkHostname: {self.protocol} uses no TLS (leave it true)")
        return self


class BusSpec(K8sModel):
    bootstrap: Annotated[str, StringConstraints(min_length=1, max_length=MAX_URI_LENGTH)] = Field(
        description="Kafka bootstrap servers, HOST:PORT[,HOST:PORT...].")
    partitions: int = Field(0, ge=0, le=MAX_REPLICAS, description="Partitions of the job's topics; 0 = "
                            "max(verifier maxReplicas, generator maxReplicas).")
    security: KafkaSecuritySpec | None = Field(
        None, description="SASL/TLS of the brokers; null = PLAINTEXT.")


class SecretKeys(K8sModel):
    name: SecretField = Field(
        description="Secret in the RLJob's namespace.")
    access_key_key: SecretField = Field(
        "accessKey", description="Key of the access key in the Secret.")
    secret_key_key: SecretField = Field(
        "secretKey", description="Key of the secret key in the Secret.")


class StoreSpec(K8sModel):
    uri: Annotated[str, StringConstraints(max_length=MAX_URI_LENGTH)] = Field(
        description="s3://bucket/prefix of checkpoints, policies and reports.")
    endpoint: Annotated[str, StringConstraints(max_length=MAX_URI_LENGTH)] = Field(
        "", description="S3 endpoint URL, e.g. http://minio:9000; empty = the client's default.")
    credentials_secret: SecretKeys | None = Field(
        None, description="Secret holding the S3 key pair; null = no static keys: the pods' service account "
        "(IRSA: AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN; EKS Pod Identity) or the node's instance role.")
    retention: Literal["keep", "delete"] = Field(
        "keep", description="When the RLJob is deleted: keep every object under uri (checkpoints, policies "
        "and reports outlive the job), or delete them (the finalizer does, after the roles stopped).")
    region: Annotated[str, StringConstraints(max_length=63, pattern=r"^([a-z0-9][a-z0-9-]*)?$")] = Field(
        "", description="S3 signing region, e.g. eu-west-3; empty = asked from the server (S3_REGION).")
    addressing_style: Literal["auto", "path", "virtual"] = Field(
        "auto", description="auto (virtual-host style for AWS, path style elsewhere), path or virtual.")

    @field_validator("uri")
    @classmethod
    def _s3_uri(cls, v: str) -> str:
        if not re.match(S3_URI_PATTERN, v):
            raise ValueError(f"must be s3://bucket[/prefix] with a 3-63 character bucket name (got {v!r})")
        return v

    @model_validator(mode="after")
    def _delete_needs_prefix(self) -> StoreSpec:
        if self.retention == "delete" and not self.uri.removeprefix("s3://").partition("/")[2].strip("/"):
            raise ValueError(f"retention: 'delete' needs a prefix in uri (s3://bucket/prefix), so deleting the "
                             f"job never empties a whole bucket (got {self.uri!r})")
        return self


class TelemetrySpec(K8sModel):
    otlp_endpoint: Annotated[str, StringConstraints(max_length=MAX_URI_LENGTH)] = Field(
        "", description="OTLP collector endpoint; empty = no traces exported.")
    metrics_port: int = Field(9090, ge=1, le=65535, description="Prometheus /metrics port of every role.")


class FailurePolicy(K8sModel):
    max_restarts: int = Field(3, ge=0, le=1000, description="Learner restarts (from the last checkpoint) "
                              "before the job is Failed; generator/verifier pods are always replaced.")
    progress_deadline_seconds: int | None = Field(
        None, ge=1, le=86_400, description="Restart the learner group when its step has not advanced for this "
        "long while it runs (counts as a restart); null = no watchdog.")


class RLJobSpec(K8sModel):
    job: dict[str, Any] = Field(default_factory=dict, description="A scalerl JobSpec without name and runtime.")
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
    failure_policy: FailurePolicy = Field(default_factory=FailurePolicy)
    roles: Roles = Field(default_factory=Roles)
    queue_name: Annotated[str, StringConstraints(max_length=63, pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$")] = Field(
        "", description="Kueue LocalQueue: the operator queues the job there as one Workload (learner nodes and "
        "each pool's minimum) and runs its roles only while Kueue admits it. Empty = not queued.")

    @field_validator("job")
    @classmethod
    def _job_is_a_jobspec(cls, job: dict[str, Any]) -> dict[str, Any]:
        for key, why in (("name", "the job's name is metadata.name"),
                         ("runtime", "the operator sets it from spec.bus and spec.store")):
            if key in job:
                raise ValueError(f"{key}: not allowed here ({why})")
        try:
            spec_from_dict(job)
        except SpecError as exc:
            raise ValueError(str(exc)) from None
        return job

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
        tree = dict(self.job, name=name)
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
