"""The per-job certificate authority of the role endpoints, and the certificates it issues.

    ca = new_ca("tiny")                                   # a CA that signs for job "tiny" only
    cert = ca.issue("learner")                            # identity "learner": CN, usable as server and client
    write_tls_dir("run/tls/learner", cert, ca)            # tls.crt, tls.key (0600), ca.crt

Every certificate the CA issues names its identity in the subject's common name (`learner`, `generator`,
`verifier`, `curriculum`, `operator`, or an extra client such as `eval`) and carries the DNS name
`server_name(job)` = `<job>.rpc.scalerl`: a client checks the server against that name whatever address
it dialled (a Pod IP, a Service, localhost), so one certificate per identity serves everywhere.

Choices:
1. ECDSA P-256 keys and SHA-256 signatures: small, fast handshakes, accepted by every gRPC TLS stack.
2. A CA per job (its own key, never shared): a certificate of one job is not accepted by another's
   endpoints, so identities need no job prefix. The CA is a path-length-0 CA with only certificate
   and CRL signing; issued certificates are not CAs and carry both serverAuth and clientAuth (each role
   serves and may call).
3. Validity: `days` (default 90) from one minute in the past (clock skew between nodes).
"""

from __future__ import annotations

import datetime as dt
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

IDENTITY = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$")
TLS_FILES = ("tls.crt", "tls.key", "ca.crt")  # a Kubernetes TLS Secret's keys, with the CA beside them


def server_name(job: str) -> str:
    """The DNS name every certificate of `job` carries, which clients verify servers against."""
    return f"{job}.rpc.scalerl"


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, both PEM."""

    cert_pem: bytes
    key_pem: bytes = field(repr=False)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _validity(days: int) -> tuple[dt.datetime, dt.datetime]:
    if days < 1:
        raise ValueError(f"days: must be >= 1, got {days}")
    now = dt.datetime.now(dt.UTC)
    return now - dt.timedelta(minutes=1), now + dt.timedelta(days=days)


@dataclass(frozen=True)
class CertificateAuthority:
    job: str
    cert_pem: bytes
    key_pem: bytes = field(repr=False)

    def issue(self, identity: str, days: int = 90) -> Issued:
        """A certificate for `identity` (CN; lowercase letters, digits, '-', '.'), signed by this CA."""
        if not IDENTITY.match(identity):
            raise ValueError(f"identity: {identity!r} is not allowed (lowercase letters, digits, '-' and '.', "
                             "at most 63 characters, starting and ending with a letter or digit)")
        ca_cert = x509.load_pem_x509_certificate(self.cert_pem)
        ca_key = serialization.load_pem_private_key(self.key_pem, password=None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        key = _key()
        start, end = _validity(days)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, identity),
                                     x509.NameAttribute(NameOID.ORGANIZATION_NAME, f"scalerl job {self.job}")]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, content_commitment=False,
                                         data_encipherment=False, key_agreement=True, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(server_name(self.job))]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        return Issued(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


def new_ca(job: str, days: int = 365) -> CertificateAuthority:
    """A new CA for `job` (its own P-256 key), valid `days`."""
    key = _key()
    start, end = _validity(days)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"scalerl {job} rpc CA")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, key_encipherment=False, content_commitment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return CertificateAuthority(job, cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


def write_tls_dir(folder: str | os.PathLike[str], issued: Issued, ca: CertificateAuthority) -> Path:
    """`folder` (made 0700) with tls.crt, tls.key (0600) and ca.crt (the CA's certificate, not its key)."""
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.chmod(0o700)
    (path / "tls.crt").write_bytes(issued.cert_pem)
    key = path / "tls.key"
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(issued.key_pem)
    (path / "ca.crt").write_bytes(ca.cert_pem)
    return path


def identity_of(cert_pem: bytes) -> str:
    """The identity (subject common name) a certificate names."""
    names = x509.load_pem_x509_certificate(cert_pem).subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else ""
