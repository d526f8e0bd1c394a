"""The infrastructure an RLJob runs on: its Kafka bus (`spec.bus`, with SASL/TLS in `security`), its S3
store (`spec.store`) and where its roles send telemetry (`spec.telemetry`).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, StringConstraints, field_validator, model_validator

from scalerl_operator.api.k8s_model import MAX_REPLICAS, MAX_URI_LENGTH, K8sModel

# s3://bucket[/prefix]: a bucket name as S3 allows it (3-63 lowercase letters, digits, '.', '-').
S3_URI_PATTERN = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s]*)?$"
SecretField = Annotated[str, StringConstraints(min_length=1, max_length=253)]
"""A Secret's name or key (Kubernetes: at most 253 characters)."""


GRPC_PORT = 50051
"""Every role's gRPC port in its Pod."""
TORCH_PORT = 29500
"""The learner ranks' torchrun rendezvous port."""

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


RPC_RESERVED = ("learner", "generator", "verifier", "curriculum", "operator", "client", "ca")
RpcIdentity = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$")]


class RpcSpec(K8sModel):
    """Who may call the roles' gRPC endpoints besides the job's own roles and `client`."""

    clients: list[RpcIdentity] = Field(default_factory=list, max_length=16, description=(
        "Extra identities (e.g. an evaluation service): the operator issues each a certificate of the job's CA "
        "(Secret <job>-rpc-<name>), and every role lets it call Generate, Score and Status."))

    @field_validator("clients")
    @classmethod
    def _not_reserved(cls, clients: list[str]) -> list[str]:
        if taken := [c for c in clients if c in RPC_RESERVED]:
            raise ValueError(f"{', '.join(taken)}: already an identity of every job; allowed: other names "
                             f"(reserved: {', '.join(RPC_RESERVED)})")
        if len(set(clients)) != len(clients):
            raise ValueError("an identity is listed twice")
        return clients


class TelemetrySpec(K8sModel):
    otlp_endpoint: Annotated[str, StringConstraints(max_length=MAX_URI_LENGTH)] = Field(
        "", description="OTLP collector endpoint; empty = no traces exported.")
    metrics_port: int = Field(9090, ge=1, le=65535, description="Prometheus /metrics port of every role.")
