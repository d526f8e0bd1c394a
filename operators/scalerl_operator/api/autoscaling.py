"""The autoscaling part of an RLJob's roles (`spec.roles.generator.autoscaling`,
`spec.roles.verifier.autoscaling`), with the HorizontalPodAutoscaler v2 field names (`behavior`,
`scaleUp`/`scaleDown`, `policies`, `stabilizationWindowSeconds`): the settings the autoscaler
(`scalerl_operator.autoscale`) reads.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from scalerl_operator.api.k8s_model import MAX_POLICIES, MAX_REPLICAS, K8sModel


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
    target_busy_fraction: float = Field(
        0.6, gt=0.0, le=1.0, description="Jobs with tools: target mean fraction of the verifiers' tool-call "
        "execution slots in use; the pool takes the larger of this proposal and the lag's.")
    no_offset_policy: Literal["minReplicas", "hold", "lagFromEarliest"] = Field(
        "minReplicas", description="A group with no committed offset: minReplicas, hold the current count, "
                                   "or count lag from the earliest offset.")
