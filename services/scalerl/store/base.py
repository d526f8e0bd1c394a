"""Store interface (the URL factory, `open_store`, is store/factory.py)."""

from __future__ import annotations

from abc import ABC, abstractmethod


class StoreError(RuntimeError):
    """A missing object or a failed integrity check."""


class Store(ABC):
    """Key/value object storage. Keys are '/'-separated relative paths ("policy/v3.safetensors")."""

    @abstractmethod
    def put_bytes(self, key: str, data: bytes) -> str:
        """Write `data` atomically under `key`; return the object's URI."""

    @abstractmethod
    def get_bytes(self, key: str) -> bytes:
        """Read the object; raises StoreError if it does not exist."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Keys under `prefix`, sorted."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object if present."""

    @abstractmethod
    def uri(self, key: str) -> str:
        """The URI naming `key` in this store (file:///... or s3://...)."""

    def key_of(self, uri: str) -> str:
        """Inverse of `uri` for URIs of this store."""
        base = self.uri("")
        if not uri.startswith(base):
            raise StoreError(f"{uri} is not in store {base}")
        return uri[len(base):]
