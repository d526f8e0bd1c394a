"""Store interface (the URL factory, `open_store`, is store/factory.py)."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable

import blake3

Checksum = tuple[str, str]
"""(algorithm, hex digest) of an object's bytes: an algorithm of HASHES."""
HASHES: dict[str, Callable[[bytes | memoryview], str]] = {
    "sha256": lambda data: hashlib.sha256(data).hexdigest(),
    "blake3": lambda data: blake3.blake3(data, max_threads=1).hexdigest(),
}
"""The checksums a store may record with an object and check when reading it back (`get_bytes`)."""


class StoreError(RuntimeError):
    """A missing object or a failed integrity check."""


class Store(ABC):
    """Key/value object storage. Keys are '/'-separated relative paths ("policy/v3.safetensors")."""

    @abstractmethod
    def put_bytes(self, key: str, data: bytes | memoryview, *, checksum: Checksum | None = None) -> str:
        """Write `data` atomically under `key`; return the object's URI. `checksum`: the caller's checksum of
        `data` where it has one (a store that records checksums records it and does not hash the bytes
        again; without it, such a store records the SHA-256)."""

    @abstractmethod
    def get_bytes(self, key: str, *, verify: bool = True) -> bytes:
        """Read the object; raises StoreError if it does not exist. `verify` False: skip the store's own
        checksum check (for a caller that checks the bytes against a checksum of its own)."""

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        """Fill `out` with the object's bytes [offset, offset + len(out)); StoreError when it does not exist or
        is shorter. No checksum (the caller checks the whole). This default reads the whole object; stores
        override it with a ranged read."""
        data = self.get_bytes(key, verify=False)
        if offset + len(out) > len(data):
            raise StoreError(f"{self.uri(key)}: {len(data)} bytes, asked for [{offset}, {offset + len(out)})")
        out[:] = data[offset:offset + len(out)]

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
