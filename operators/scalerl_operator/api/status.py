"""The RLJob's status as pydantic models: what the operator writes through the /status subresource.

`RLJobStatus(...).model_dump(by_alias=True, mode="json", exclude_none=True)` is a status patch. The
printer-column helpers fill themselves: `roles.<role>.summary` ("ready/desired"),
`staleness.summary` ("current/bound") and `lagTotal` (the sum of `lag`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, StringConstraints, model_validator

from scalerl_operator.api.k8s_model import MAX_CONDITIONS, MAX_MAP_ENTRIES, MAX_URI_LENGTH, K8sModel

ConditionStatus = Literal["True", "False", "Unknown"]
Phase = Literal["Pending", "Running", "Suspended", "Succeeded", "Failed"]


class Condition(K8sModel):
    """metav1.Condition."""

    type: Annotated[str, StringConstraints(min_length=1, max_length=316)]
    status: ConditionStatus
    reason: Annotated[str, StringConstraints(min_length=1, max_length=1024,
                                             pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")]
    message: Annotated[str, StringConstraints(max_length=32768)] = ""
    last_transition_time: datetime
    observed_generation: int | None = Field(None, ge=0)


class Checkpoint(K8sModel):
    uri: Annotated[str, StringConstraints(max_length=MAX_URI_LENGTH)] = Field(description="Store URI of it.")
    step: int = Field(ge=0, description="Learner step it holds.")


class Report(K8sModel):
    """Where a finished run's files are: the learner uploads them to `<store>/run/` before it reports done."""

    uri: Annotated[str, StringConstraints(max_length=MAX_URI_LENGTH)] = Field(
        description="Store URI of the run's files (summary.json, report.html, metrics.jsonl, train.jsonl).")
    summary: Annotated[str, StringConstraints(max_length=MAX_URI_LENGTH)] = Field(
        description="Store URI of summary.json.")
    html: Annotated[str, StringConstraints(max_length=MAX_URI_LENGTH)] | None = Field(
        None, description="Store URI of report.html; null when the report could not be rendered.")
    fetch: Annotated[str, StringConstraints(max_length=MAX_URI_LENGTH + 64)] = Field(
        description="The command that copies them to a local folder.")


class Staleness(K8sModel):
    """Policy versions between the generating policy and the learner; `summary` is 'current/bound'."""

    current: int = Field(ge=0, description="Measured staleness, policy versions.")
    bound: int = Field(ge=1, description="The recipe's bound k, policy versions.")
    summary: str = Field("", description="current/bound, filled from the two (printer column).")

    @model_validator(mode="after")
    def _fill_summary(self) -> Staleness:
        text = f"{self.current}/{self.bound}"
        if self.summary != text:
            self.summary = text
        return self


class Fit(K8sModel):
    """The fitted sigmoid R(C) = R0 + (A − R0) / (1 + (Cmid / C)^B) at the last fit."""

    a: float = Field(alias="A", description="Asymptotic pass rate.")
    b: float = Field(alias="B", description="Scaling exponent (efficiency).")
    c_mid: float = Field(alias="Cmid", description="Compute at half the gain, device-hours.")
    compute_at_fit: float = Field(ge=0.0, description="Compute of the last point fitted, device-hours.")
    a_low: float | None = Field(None, alias="ALow", description="Low end of A's bootstrap interval.")
    a_high: float | None = Field(None, alias="AHigh", description="High end of A's bootstrap interval.")
    budget_compute: float | None = Field(None, ge=0.0, description=(
        "Compute at the end of the budget (spec.job.train.steps, extrapolated from the compute so far), "
        "device-hours; null when the fit had no compute left to forecast."))
    budget_identified: bool | None = Field(None, description=(
        "Whether the data pin the forecast at budgetCompute; false: not identified yet, only the range."))
    budget_pass_rate: float | None = Field(None, description="The forecast eval at budgetCompute (identified only).")
    budget_low: float | None = Field(None, description="Low end of the forecast's prediction interval.")
    budget_high: float | None = Field(None, description="High end of the forecast's prediction interval.")


class StoppedEarly(K8sModel):
    """spec.stopPolicy ended the run on an identified forecast: why, and the numbers the learner acted on."""

    reason: Literal["ForecastPlateau", "ForecastBelowTarget"] = Field(description=(
        "ForecastPlateau: the rest of the budget adds less than minGain; ForecastBelowTarget: the ceiling's "
        "upper end is below target."))
    step: int = Field(ge=0, description="The learner step of the fit acted on.")
    compute: float = Field(ge=0.0, description="Compute of the fit's last eval, device-hours.")
    budget_compute: float = Field(ge=0.0, description="Compute at the end of the budget, device-hours.")
    gain_high: float = Field(description="Upper end of the interval of R(budget) − R(now), the fitted gain.")
    a_high: float = Field(alias="AHigh", description="Upper end of the ceiling A's interval.")
    level: float = Field(gt=0.0, lt=1.0, description="Two-sided level of both intervals.")


class DevicesStatus(K8sModel):
    """Devices the job holds now (pods × accelerators per pod, as rendered into pool.json), per role and in
    total: what the learner integrates into compute (device-hours)."""

    generator: int = Field(0, ge=0, description="Devices of the generator pods.")
    verifier: int = Field(0, ge=0, description="Devices of the verifier pods.")
    curriculum: int = Field(0, ge=0, description="Devices of the curriculum pod.")
    learner: int = Field(0, ge=0, description="Devices of the learner pods (all ranks).")
    total: int = Field(0, ge=0, description="Sum over roles, devices.")


class RoleReplicas(K8sModel):
    """Ready and desired pods of a role; `summary` is 'ready/desired' (printer column)."""

    ready: int = Field(0, ge=0)
    desired: int = Field(0, ge=0)
    summary: str = Field("", description="ready/desired, filled from the two.")

    @model_validator(mode="after")
    def _fill_summary(self) -> RoleReplicas:
        text = f"{self.ready}/{self.desired}"
        if self.summary != text:
            self.summary = text
        return self


class RolesStatus(K8sModel):
    generator: RoleReplicas = Field(default_factory=RoleReplicas)
    verifier: RoleReplicas = Field(default_factory=RoleReplicas)
    curriculum: RoleReplicas = Field(default_factory=RoleReplicas)
    learner: RoleReplicas = Field(default_factory=RoleReplicas)


class Recommendation(K8sModel):
    time: datetime
    replicas: int = Field(ge=0)


class ScalingState(K8sModel):
    """Autoscaler memory kept in status so a restarted operator keeps its cool-downs (open for more keys)."""

    model_config = ConfigDict(extra="allow")

    last_scale_time: datetime | None = None
    last_replicas: int | None = Field(None, ge=0)
    consecutive_failures: int = Field(0, ge=0, description="Failed metric reads in a row.")
    recommendations: list[Recommendation] = Field(default_factory=list, max_length=256)


class ScalingStatus(K8sModel):
    generator: ScalingState = Field(default_factory=ScalingState)
    verifier: ScalingState = Field(default_factory=ScalingState)


class LearnerProgress(K8sModel):
    """The progress watchdog's memory: the last learner step seen and since when (the group running)."""

    step: int | None = Field(None, ge=0, description="Last learner step seen.")
    since: datetime | None = Field(None, description="When that step was first seen with the group up.")


class LearnerRank(K8sModel):
    """One learner pod of the running group, as the operator last saw it live."""

    name: Annotated[str, StringConstraints(max_length=253)] = Field(description="Pod name (<job>-learner-<ordinal>).")
    uid: Annotated[str, StringConstraints(max_length=64)] = Field(description="Pod UID.")


class ContainerKill(K8sModel):
    """A container of the job's pods killed by the kernel for exceeding its memory limit (OOMKilled), as the
    kubelet reported it; the operator also sends a Warning Event `OOMKilled` for each (control.podfaults)."""

    pod: Annotated[str, StringConstraints(max_length=253)] = Field(description="Pod name.")
    uid: Annotated[str, StringConstraints(max_length=64)] = Field(description="Pod UID.")
    role: Annotated[str, StringConstraints(max_length=63)] = Field(
        description="generator, verifier, curriculum or learner.")
    container: Annotated[str, StringConstraints(max_length=253)] = Field(description="Container name.")
    reason: Literal["OOMKilled"] = Field("OOMKilled", description="The kubelet's termination reason.")
    exit_code: int = Field(description="The container's exit code (137: SIGKILL).")
    finished_at: Annotated[str, StringConstraints(max_length=64)] = Field(description="When it was killed (RFC 3339).")
    memory_limit: Annotated[str, StringConstraints(max_length=64)] | None = Field(
        None, description="The container's resources.limits.memory; null when it had none.")
    restarts: int = Field(0, ge=0, description="The container's restartCount when the operator saw the kill.")


class RLJobStatus(K8sModel):
    observed_generation: int | None = Field(None, ge=0)
    phase: Phase = "Pending"
    conditions: list[Condition] = Field(default_factory=list, max_length=MAX_CONDITIONS)
    policy_version: int | None = Field(None, ge=0)
    learner_step: int | None = Field(None, ge=0)
    last_checkpoint: Checkpoint | None = None
    staleness: Staleness | None = None
    lag: dict[Annotated[str, StringConstraints(max_length=255)], int] = Field(
        default_factory=dict, max_length=MAX_MAP_ENTRIES, description="Consumer-group lag per topic, records.")
    lag_total: int = Field(0, ge=0, description="Sum of lag over topics, records (printer column).")
    pass_rate: float | None = Field(None, ge=0.0, le=1.0, description="Last held-out mean@k pass rate.")
    fit: Fit | None = None
    report: Report | None = Field(None, description="The finished run's files in the store (summary, report).")
    stopped_early: StoppedEarly | None = Field(None, description="Set when spec.stopPolicy ended the run.")
    roles: RolesStatus = Field(default_factory=RolesStatus)
    devices: DevicesStatus | None = None
    scaling: ScalingStatus = Field(default_factory=ScalingStatus)
    start_time: datetime | None = Field(None, description="When the job first ran (activeDeadlineSeconds).")
    restarts: int = Field(0, ge=0, description="Learner group restarts so far, one per restart of the whole "
                          "torchrun group however many pods it spans (failurePolicy.maxRestarts).")
    learner_progress: LearnerProgress | None = None
    learner_group: list[LearnerRank] = Field(
        default_factory=list, max_length=256, description="The learner pods of the running group (name and UID): "
        "one being deleted, gone or replaced under a new UID other than by the operator is a lost rank, which "
        "restarts the group and counts in restarts. Emptied before the operator deletes the pods itself and "
        "while the learner is scaled to zero.")
    container_kills: list[ContainerKill] = Field(
        default_factory=list, max_length=16, description="The newest containers of the job's pods killed for "
        "exceeding their memory limit (OOMKilled), oldest first; each also a Warning Event OOMKilled.")

    @model_validator(mode="after")
    def _fill_lag_total(self) -> RLJobStatus:
        total = sum(self.lag.values())
        if self.lag_total != total:
            self.lag_total = total
        return self
