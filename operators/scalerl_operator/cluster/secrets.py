"""Values read from a Secret the RLJob's spec names (spec.bus.security.secretRef, spec.store.credentialsSecret).

A missing Secret (`SecretNotFound`) is told apart from an incomplete one (`SecretError`): a namespace being
deleted deletes its Secrets before the RLJob's finalizer has run, and no wait brings them back, while a key
missing from a Secret that exists is a fix its owner can still make.
"""

from __future__ import annotations

import base64

from scalerl_operator.cluster.kube import Kube


class SecretError(RuntimeError):
    """A Secret the spec names is missing or lacks a key (one line naming the field and the Secret)."""


class SecretNotFound(SecretError):
    """The Secret does not exist (never made, deleted by hand, or deleted with its namespace)."""


def secret_values(kube: Kube, namespace: str, name: str, keys: dict[str, str], field: str) -> dict[str, str]:
    """{what: decoded value} of `keys` ({what: key in the Secret}) from Secret `namespace/name`; `field` names
    the spec field in errors. Example: ({"username": "user"}, "spec.bus.security.secretRef") with no such Secret →
    SecretNotFound("spec.bus.security.secretRef: Secret ns/kafka-auth not found")."""
    found = kube.get("v1", "Secret", namespace, name)
    if found is None:
        raise SecretNotFound(f"{field}: Secret {namespace}/{name} not found")
    data = found.get("data") or {}
    missing = [key for key in keys.values() if key not in data]
    if missing:
        raise SecretError(f"{field}: Secret {namespace}/{name} lacks {', '.join(missing)}")
    return {what: base64.b64decode(data[key]).decode() for what, key in keys.items()}
