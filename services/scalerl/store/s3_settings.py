"""Where the S3 store is and how it signs in, from the environment (checked before any work).

    S3_ENDPOINT          http(s)://host[:port] of MinIO or any S3 API; unset: AWS S3
                         (https://s3.<S3_REGION>.amazonaws.com, or https://s3.amazonaws.com without a region)
    S3_REGION            the signing region, e.g. us-east-1, eu-west-3 (unset: the client asks the server
                         for the bucket's region); AWS_REGION is read when S3_REGION is unset
    S3_ADDRESSING_STYLE  auto (default: virtual-host style for AWS endpoints, path style elsewhere) |
                         path (https://host/bucket/key: MinIO, Ceph, most private endpoints) |
                         virtual (https://bucket.host/key)

Credentials, the first that is configured (a half-configured one is an error, never skipped):
    static        S3_ACCESS_KEY + S3_SECRET_KEY (what an RLJob's store.credentialsSecret provides)
    env           AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN)
    web-identity  AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN: EKS IAM Roles for Service Accounts (IRSA), set
                  by EKS in pods whose service account has the eks.amazonaws.com/role-arn annotation
    container     AWS_CONTAINER_CREDENTIALS_FULL_URI or _RELATIVE_URI: EKS Pod Identity, ECS task roles
    instance      none of these: the node's instance profile (EC2 instance metadata)
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

ADDRESSING_STYLES = ("auto", "path", "virtual")
CREDENTIAL_SOURCES = ("static", "env", "web-identity", "container", "instance")
_REGION = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


class S3SettingsError(ValueError):
    """A malformed setting; the message is one line naming the variable and what is allowed."""


@dataclass(frozen=True)
class S3Settings:
    endpoint: str  # http(s)://host[:port]
    region: str | None
    addressing: str
    credentials: str  # one of CREDENTIAL_SOURCES
    access_key: str = ""
    secret_key: str = field(default="", repr=False)

    @property
    def host(self) -> str:
        return urlsplit(self.endpoint).netloc

    @property
    def secure(self) -> bool:
        return self.endpoint.startswith("https://")

    def describe(self) -> str:
        """For logs: never a key."""
        return (f"{self.endpoint} (region {self.region or 'from the server'}, {self.addressing} addressing, "
                f"{self.credentials} credentials)")


def _pair(env: Mapping[str, str], a: str, b: str) -> bool:
    """Both set: True; neither: False; one of them: S3SettingsError."""
    has_a, has_b = bool(env.get(a)), bool(env.get(b))
    if has_a != has_b:
        missing, given = (b, a) if has_a else (a, b)
        raise S3SettingsError(f"{missing}: not set, but {given} is (give both or neither)")
    return has_a


def credential_source(env: Mapping[str, str]) -> str:
    """Which credentials the store uses (see the module doc); raises S3SettingsError."""
    if _pair(env, "S3_ACCESS_KEY", "S3_SECRET_KEY"):
        return "static"
    if _pair(env, "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        return "env"
    if _pair(env, "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN"):
        token = env["AWS_WEB_IDENTITY_TOKEN_FILE"]
        if not os.access(token, os.R_OK):
            raise S3SettingsError(f"AWS_WEB_IDENTITY_TOKEN_FILE: {token!r} is not a readable file (the projected "
                                  "service account token)")
        return "web-identity"
    if env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI") or env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"):
        return "container"
    return "instance"


def s3_settings(env: Mapping[str, str] | None = None) -> S3Settings:
    """The S3 settings of the environment; raises S3SettingsError (one line naming the variable)."""
    env = os.environ if env is None else env
    region = (env.get("S3_REGION") or env.get("AWS_REGION") or "").strip() or None
    if region is not None and not _REGION.match(region):
        raise S3SettingsError(f"S3_REGION: {region!r} is not a region name (lower-case letters, digits and -, "
                              "e.g. us-east-1)")
    endpoint = (env.get("S3_ENDPOINT") or "").strip().rstrip("/")
    if not endpoint:
        endpoint = f"https://s3.{region}.amazonaws.com" if region else "https://s3.amazonaws.com"
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
        raise S3SettingsError(f"S3_ENDPOINT: {endpoint!r} is not http(s)://host[:port] (no path)")
    addressing = (env.get("S3_ADDRESSING_STYLE") or "auto").strip().lower()
    if addressing not in ADDRESSING_STYLES:
        raise S3SettingsError(f"S3_ADDRESSING_STYLE: {addressing!r} is not one of {', '.join(ADDRESSING_STYLES)}")
    source = credential_source(env)
    keys = (env["S3_ACCESS_KEY"], env["S3_SECRET_KEY"]) if source == "static" else ("", "")
    return S3Settings(endpoint, region, addressing, source, *keys)


def credentials_provider(settings: S3Settings) -> Any:
    """The minio credentials provider of `settings.credentials`."""
    from minio.credentials.providers import EnvAWSProvider, IamAwsProvider, StaticProvider

    if settings.credentials == "static":
        return StaticProvider(settings.access_key, settings.secret_key)
    if settings.credentials == "env":
        return EnvAWSProvider()
    # web-identity, container and instance: IamAwsProvider reads AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN,
    # then AWS_CONTAINER_CREDENTIALS_*, then the instance metadata service, in that order
    return IamAwsProvider(region=settings.region)


def s3_settings_problem(env: Mapping[str, str] | None = None) -> str | None:
    """Why the S3 settings of the environment cannot be used (one line), or None."""
    try:
        s3_settings(env)
    except S3SettingsError as exc:
        return str(exc)
    return None
