"""The operator's own Kafka settings for one RLJob: `spec.bus.security` with the credentials and CA read
from its Secret (the same Secret the role pods get as env), for lag reads, topic creation, the metrics
tail and the finalizer's clean-up. No security block: PLAINTEXT (never the operator's own environment).

`loopback_problem`: brokers that advertise a loopback address (a test Kafka with advertised.listeners on
127.0.0.1) while the bootstrap address is not one send every client, after bootstrapping, to its own
loopback: every role would time out. The operator says so (condition BusReachable=False, reason
BrokersAdvertiseLoopback, and an Event) instead."""

from __future__ import annotations

import ipaddress

from scalerl.bus.security import KafkaSecurity, KafkaSecurityError
from scalerl_operator.api.infra import BusSpec
from scalerl_operator.cluster.kube import Kube
from scalerl_operator.cluster.secrets import secret_values


class KafkaAccessError(RuntimeError):
    """spec.bus.security cannot make client settings (one line naming it)."""


def kafka_security(kube: Kube, namespace: str, bus: BusSpec) -> KafkaSecurity:
    """The client settings of `bus` with its Secret's values; raises `secrets.SecretNotFound` / `SecretError`
    when the Secret is missing or lacks a key, `KafkaAccessError` when the settings do not fit together."""
    sec = bus.security
    if sec is None:
        return KafkaSecurity()
    values = {"username": "", "password": "", "ca": ""}
    ref = sec.secret_ref
    if ref is not None:
        wanted = {"ca": ref.ca_key} if ref.ca_key else {}
        if sec.sasl_mechanism:
            wanted.update(username=ref.username_key, password=ref.password_key)
        values.update(secret_values(kube, namespace, ref.name, wanted, "spec.bus.security.secretRef"))
    try:
        return KafkaSecurity(protocol=sec.protocol, mechanism=sec.sasl_mechanism, username=values["username"],
                             password=values["password"], ca_data=values["ca"], check_hostname=sec.check_hostname)
    except KafkaSecurityError as exc:
        raise KafkaAccessError(f"spec.bus.security: {exc}") from None


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost (any case, a trailing dot, a localhost subdomain)."""
    name = host.strip("[]").rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _host(address: str) -> str:
    """The host of HOST:PORT or [V6]:PORT."""
    address = address.strip()
    if address.startswith("["):
        return address[1:].partition("]")[0]
    return address.rpartition(":")[0] if address.count(":") == 1 else address


def loopback_problem(bootstrap: str, advertised: list[tuple[str, int]]) -> str | None:
    """Why pods cannot reach the brokers that `bootstrap` ("host:port[,...]") advertises, or None: some
    advertise a loopback address while no bootstrap address is one (bootstrapping through loopback, e.g. a
    port-forward, is a set-up where loopback is meant).
    Example: ("kafka.ns:9092", [("127.0.0.1", 9092)]) → "the brokers behind spec.bus.bootstrap kafka.ns:9092
    advertise 127.0.0.1:9092 (loopback): ..."."""
    boots = [b for b in bootstrap.split(",") if b.strip()]
    if any(is_loopback(_host(b)) for b in boots):
        return None
    bad = [f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in advertised if is_loopback(h)]
    if not bad:
        return None
    return (f"the brokers behind spec.bus.bootstrap {bootstrap} advertise {', '.join(bad)} (loopback): every pod "
            "would connect to itself after bootstrapping; set the brokers' advertised.listeners to an address "
            "the pods can reach (e.g. the broker Service's DNS name)")
