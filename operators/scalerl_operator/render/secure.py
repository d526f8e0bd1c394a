"""What an RLJob's Kafka security and S3 settings add to the role pods (pure; rendered by render/children.py).

Kafka (`spec.bus.security`): SCALERL_KAFKA_SECURITY_PROTOCOL and _SASL_MECHANISM as values, the SASL
username and password as `secretKeyRef`s (never in the pod spec itself), and the CA bundle of the Secret
(`caKey`) mounted read-only at KAFKA_CA_DIR, named by SCALERL_KAFKA_SSL_CAFILE (scalerl.bus.security
reads them all). S3 (`spec.store`): S3_REGION and S3_ADDRESSING_STYLE when set; without
`credentialsSecret` no key is set at all and the roles use the service account's identity (IRSA's
AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN, which EKS injects) or the node's instance role
(scalerl.store.s3_settings).
"""

from __future__ import annotations

from typing import Any

from scalerl_operator.api.spec import RLJobSpec

KAFKA_CA_DIR = "/etc/scalerl/kafka-ca"
KAFKA_CA_FILE = "ca.crt"
KAFKA_CA_VOLUME = "kafka-ca"


def _secret(name: str, secret: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def secure_env(spec: RLJobSpec) -> list[dict[str, Any]]:
    """The env of every role container for spec.bus.security and spec.store's region/addressing."""
    env: list[dict[str, Any]] = []
    if spec.store.region:
        env.append({"name": "S3_REGION", "value": spec.store.region})
    if spec.store.addressing_style != "auto":
        env.append({"name": "S3_ADDRESSING_STYLE", "value": spec.store.addressing_style})
    sec = spec.bus.security
    if sec is None:
        return env
    env.append({"name": "SCALERL_KAFKA_SECURITY_PROTOCOL", "value": sec.protocol})
    ref = sec.secret_ref
    if sec.sasl_mechanism and ref is not None:
        env += [{"name": "SCALERL_KAFKA_SASL_MECHANISM", "value": sec.sasl_mechanism},
                _secret("SCALERL_KAFKA_SASL_USERNAME", ref.name, ref.username_key),
                _secret("SCALERL_KAFKA_SASL_PASSWORD", ref.name, ref.password_key)]
    if ref is not None and ref.ca_key:
        env.append({"name": "SCALERL_KAFKA_SSL_CAFILE", "value": f"{KAFKA_CA_DIR}/{KAFKA_CA_FILE}"})
    if not sec.check_hostname:
        env.append({"name": "SCALERL_KAFKA_SSL_CHECK_HOSTNAME", "value": "false"})
    return env


def add_secure_volumes(spec: RLJobSpec, volumes: list[dict[str, Any]], container: dict[str, Any]) -> None:
    """Mount the Kafka CA of spec.bus.security.secretRef.caKey (if any) into `container`."""
    sec = spec.bus.security
    ref = sec.secret_ref if sec is not None else None
    if ref is None or not ref.ca_key:
        return
    volumes.append({"name": KAFKA_CA_VOLUME, "secret": {
        "secretName": ref.name, "items": [{"key": ref.ca_key, "path": KAFKA_CA_FILE}]}})
    container["volumeMounts"].append({"name": KAFKA_CA_VOLUME, "mountPath": KAFKA_CA_DIR, "readOnly": True})
