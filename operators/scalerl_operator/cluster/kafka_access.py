"""The operator's own Kafka settings for one RLJob: `spec.bus.security` with the credentials and CA read
from its Secret (the same Secret the role pods get as env), for lag reads, topic creation, the metrics
tail and the finalizer's clean-up. No security block: PLAINTEXT (never the operator's own environment)."""

from __future__ import annotations

import base64

from scalerl.bus.security import KafkaSecurity, KafkaSecurityError
from scalerl_operator.api.infra import BusSpec
from scalerl_operator.cluster.kube import Kube


class KafkaAccessError(RuntimeError):
    """The Secret of spec.bus.security is missing or incomplete (one line naming it)."""


def kafka_security(kube: Kube, namespace: str, bus: BusSpec) -> KafkaSecurity:
    sec = bus.security
    if sec is None:
        return KafkaSecurity()
    values = {"username": "", "password": "", "ca": ""}
    ref = sec.secret_ref
    if ref is not None:
        wanted = {"ca": ref.ca_key} if ref.ca_key else {}
        if sec.sasl_mechanism:
            wanted.update(username=ref.username_key, password=ref.password_key)
        found = kube.get("v1", "Secret", namespace, ref.name)
        if found is None:
            raise KafkaAccessError(f"spec.bus.security.secretRef: Secret {namespace}/{ref.name} not found")
        data = found.get("data") or {}
        missing = [key for key in wanted.values() if key not in data]
        if missing:
            raise KafkaAccessError(f"spec.bus.security.secretRef: Secret {namespace}/{ref.name} lacks "
                                   f"{', '.join(missing)}")
        for what, key in wanted.items():
            values[what] = base64.b64decode(data[key]).decode()
    try:
        return KafkaSecurity(protocol=sec.protocol, mechanism=sec.sasl_mechanism, username=values["username"],
                             password=values["password"], ca_data=values["ca"], check_hostname=sec.check_hostname)
    except KafkaSecurityError as exc:
        raise KafkaAccessError(f"spec.bus.security: {exc}") from None
