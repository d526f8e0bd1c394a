"""Object storage for checkpoints and policy weights: one interface, chosen by URL.

`file:///path` (a local folder, embedded mode) or `s3://bucket/prefix` (MinIO or any S3, distributed
mode). Writes are atomic: a reader never sees half an object.
"""

from scalerl.store.base import Store
from scalerl.store.factory import open_store

__all__ = ["Store", "open_store"]
