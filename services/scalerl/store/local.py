"""Local-folder store: write to a temporary file in the same folder, fsync, then rename (atomic)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from scalerl.store.base import Checksum, Store, StoreError


class LocalStore(Store):
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()

    def _path(self, key: str) -> Path:
        p = (self.root / key).resolve()
        if self.root not in p.parents and p != self.root:
            raise StoreError(f"key {key!r} escapes the store root")
        return p

    def put_bytes(self, key: str, data: bytes | memoryview, *, checksum: Checksum | None = None) -> str:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return self.uri(key)

    def get_bytes(self, key: str, *, verify: bool = True) -> bytes:  # no checksum of its own
        path = self._path(key)
        if not path.is_file():
            raise StoreError(f"no object {self.uri(key)}")
        return path.read_bytes()

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        path = self._path(key)
        try:
            with path.open("rb") as f:
                f.seek(offset)
                got = f.readinto(out)
        except FileNotFoundError:
            raise StoreError(f"no object {self.uri(key)}") from None
        if got != len(out):
            raise StoreError(f"{self.uri(key)}: the object ended after {offset + got} bytes, asked for "
                             f"[{offset}, {offset + len(out)})")

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> list[str]:
        if not self.root.exists():
            return []
        keys = []
        for p in self.root.rglob("*"):
            if p.is_file() and not p.name.startswith("."):
                k = p.relative_to(self.root).as_posix()
                if k.startswith(prefix):
                    keys.append(k)
        return sorted(keys)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def uri(self, key: str) -> str:
        return f"file://{self.root.as_posix()}/{key}"
