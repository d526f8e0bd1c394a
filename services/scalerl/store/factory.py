"""`open_store`: a store from its URL. Apart from the interface (`store/base.py`) so that the backends,
which implement that interface, are never imported by it: base ← local, s3 ← factory.
"""

from __future__ import annotations

from scalerl.store.base import Store


def open_store(url: str) -> Store:
    """`file:///abs/path`, a plain path, or `s3://bucket/prefix` (endpoint and keys from the env)."""
    if url.startswith("s3://"):
        from scalerl.store.s3 import S3Store  # type: ignore[import-not-found,unused-ignore]

        return S3Store.from_url(url)
    from scalerl.store.local import LocalStore

    return LocalStore(url.removeprefix("file://"))
