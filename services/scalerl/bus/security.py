"""How a Kafka client authenticates and encrypts: SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) and TLS.

The bus URL names only the brokers (`kafka://HOST:PORT[,...]`); credentials never go into a URL, a
command line or a log line. Every client of the roles (producer, consumers, admin; `scalerl dlq`) reads
the settings from the environment:

    SCALERL_KAFKA_SECURITY_PROTOCOL   PLAINTEXT (default) | SSL | SASL_PLAINTEXT | SASL_SSL
    SCALERL_KAFKA_SASL_MECHANISM      PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512   (SASL_* only, required there)
    SCALERL_KAFKA_SASL_USERNAME       (SASL_* only, required there)
    SCALERL_KAFKA_SASL_PASSWORD       (SASL_* only, required there)
    SCALERL_KAFKA_SSL_CAFILE          PEM file of the CAs that sign the brokers' certificates
                                      (SSL/SASL_SSL only; unset: the system's trust store)
    SCALERL_KAFKA_SSL_CERTFILE        client certificate (PEM) for mutual TLS (SSL/SASL_SSL only;
    SCALERL_KAFKA_SSL_KEYFILE         with its key; both or neither)
    SCALERL_KAFKA_SSL_CHECK_HOSTNAME  true (default) | false: match the broker's certificate to its host

The operator builds a `KafkaSecurity` from an RLJob's `spec.bus.security` and its Secret instead (the
CA then comes as PEM text, `ca_data`). A setting that does not apply to the chosen protocol is refused
(never accepted and ignored). Pure: the standard library only, no Kafka import.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
ENV = "SCALERL_KAFKA_"
_BOOL = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


class KafkaSecurityError(ValueError):
    """A malformed setting; the message is one line naming the setting and what is allowed."""


@dataclass(frozen=True)
class KafkaSecurity:
    protocol: str = "PLAINTEXT"
    mechanism: str = ""
    username: str = ""
    password: str = field(default="", repr=False)
    ca_file: str = ""
    ca_data: str = field(default="", repr=False)  # PEM text (the operator's copy of a Secret's CA)
    cert_file: str = ""
    key_file: str = ""
    check_hostname: bool = True
    source: str = "settings"  # how the fields are named in error messages: "settings" or "env"

    def __post_init__(self) -> None:
        self.validate()

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    def field_name(self, attr: str) -> str:
        env = {"protocol": "SECURITY_PROTOCOL", "mechanism": "SASL_MECHANISM", "username": "SASL_USERNAME",
               "password": "SASL_PASSWORD", "ca_file": "SSL_CAFILE", "cert_file": "SSL_CERTFILE",
               "key_file": "SSL_KEYFILE", "check_hostname": "SSL_CHECK_HOSTNAME", "ca_data": "SSL_CAFILE"}
        return ENV + env[attr] if self.source == "env" else f"kafka {attr}"

    def _bad(self, attr: str, why: str) -> KafkaSecurityError:
        return KafkaSecurityError(f"{self.field_name(attr)}: {why}")

    def validate(self) -> None:
        """Raise KafkaSecurityError (one line naming the setting) unless the settings fit together."""
        if self.protocol not in PROTOCOLS:
            raise self._bad("protocol", f"{self.protocol!r} is not one of {', '.join(PROTOCOLS)}")
        self._validate_sasl()
        self._validate_tls()

    def _validate_sasl(self) -> None:
        bad = self._bad
        if self.sasl:
            if self.mechanism not in MECHANISMS:
                raise bad("mechanism", f"{self.mechanism!r} is not one of {', '.join(MECHANISMS)} "
                          f"(required with {self.protocol})")
            for attr in ("username", "password"):
                if not getattr(self, attr):
                    raise bad(attr, f"missing; required with {self.protocol}")
        else:
            for attr in ("mechanism", "username", "password"):
                if getattr(self, attr):
                    raise bad(attr, f"set, but {self.protocol} uses no SASL (allowed with SASL_PLAINTEXT "
                              "or SASL_SSL)")

    def _validate_tls(self) -> None:
        bad = self._bad
        if not self.tls:
            for attr in ("ca_file", "ca_data", "cert_file", "key_file"):
                if getattr(self, attr):
                    raise bad(attr, f"set, but {self.protocol} uses no TLS (allowed with SSL or SASL_SSL)")
            if not self.check_hostname:
                raise bad("check_hostname", f"set to false, but {self.protocol} uses no TLS")
            return
        if self.ca_file and self.ca_data:
            raise bad("ca_file", "give the CA as a file or as PEM text, not both")
        if bool(self.cert_file) != bool(self.key_file):
            raise bad("cert_file" if not self.cert_file else "key_file",
                      "mutual TLS needs both the client certificate and its key")
        for attr in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, attr)
            if path and not os.access(path, os.R_OK):
                raise bad(attr, f"{path!r} is not a readable file")
        if self.ca_data and "-----BEGIN CERTIFICATE-----" not in self.ca_data:
            raise bad("ca_data", "not a PEM certificate (no -----BEGIN CERTIFICATE----- line)")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> KafkaSecurity:
        """The settings of SCALERL_KAFKA_* (see the module doc); raises KafkaSecurityError."""
        env = os.environ if env is None else env

        def get(name: str) -> str:
            return env.get(ENV + name, "").strip()

        check = get("SSL_CHECK_HOSTNAME").lower() or "true"
        if check not in _BOOL:
            raise KafkaSecurityError(f"{ENV}SSL_CHECK_HOSTNAME: {check!r} is not true or false")
        return cls(protocol=get("SECURITY_PROTOCOL").upper() or "PLAINTEXT",
                   mechanism=get("SASL_MECHANISM").upper(), username=get("SASL_USERNAME"),
                   password=env.get(ENV + "SASL_PASSWORD", ""), ca_file=get("SSL_CAFILE"),
                   cert_file=get("SSL_CERTFILE"), key_file=get("SSL_KEYFILE"),
                   check_hostname=_BOOL[check], source="env")

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of a client (None without TLS): the given CA (else the system's), hostname
        check as set, the client certificate for mutual TLS."""
        if not self.tls:
            return None
        ctx = ssl.create_default_context(cafile=self.ca_file or None, cadata=self.ca_data or None)
        ctx.check_hostname = self.check_hostname
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for kafka-python's KafkaProducer / KafkaConsumer / KafkaAdminClient."""
        out: dict[str, Any] = {"security_protocol": self.protocol}
        if self.tls:
            out["ssl_context"] = self.ssl_context()
            out["ssl_check_hostname"] = self.check_hostname
        if self.sasl:
            out.update(sasl_mechanism=self.mechanism, sasl_plain_username=self.username,
                       sasl_plain_password=self.password)
        return out

    def describe(self) -> str:
        """For logs: never the password."""
        parts = [self.protocol]
        if self.sasl:
            parts.append(f"{self.mechanism} as {self.username!r}")
        if self.tls:
            parts.append(f"CA {self.ca_file or ('from Secret' if self.ca_data else 'system')}")
        return ", ".join(parts)


class KafkaConnectError(ConnectionError):
    """No Kafka client could bootstrap: the message says which step failed (TCP, TLS, SASL)."""


def diagnose(bootstrap: list[str], security: KafkaSecurity, timeout_s: float = 5.0) -> str:
    """Why a client could not bootstrap, found step by step against each broker (TCP connect, then the TLS
    handshake with the client's trust settings); when both work, what is left is the SASL exchange (the
    broker closes the connection on bad credentials without a reason a client can read)."""
    import socket

    reasons = []
    for addr in bootstrap:
        host, _, port = addr.rpartition(":")
        try:
            sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s)
        except (OSError, ValueError) as exc:
            reasons.append(f"{addr}: TCP connect failed ({exc})")
            continue
        try:
            ctx = security.ssl_context()
            if ctx is not None:
                try:
                    ctx.wrap_socket(sock, server_hostname=host.strip("[]")).close()
                except (ssl.SSLError, OSError) as exc:
                    reasons.append(f"{addr}: TLS handshake failed ({exc}); check the CA "
                                   f"({security.field_name('ca_file')}) and the broker's certificate")
                    continue
            if security.sasl:
                reasons.append(f"{addr}: SASL {security.mechanism} authentication as {security.username!r} "
                               f"failed (the broker closed the connection): wrong username or password, or "
                               f"the mechanism is not enabled on this listener")
            elif security.protocol == "PLAINTEXT":
                reasons.append(f"{addr}: reachable, but the Kafka handshake failed (a TLS or SASL listener? "
                               f"set {ENV}SECURITY_PROTOCOL)")
            else:
                reasons.append(f"{addr}: TLS works, but the Kafka handshake failed (does the listener "
                               "expect SASL?)")
        finally:
            sock.close()
    return "; ".join(reasons)


def kafka_security_problem(env: Mapping[str, str] | None = None) -> str | None:
    """Why the SCALERL_KAFKA_* settings cannot be used (one line), or None."""
    try:
        KafkaSecurity.from_env(env)
    except KafkaSecurityError as exc:
        return str(exc)
    return None
