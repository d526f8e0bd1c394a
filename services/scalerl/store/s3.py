"""S3 store (MinIO or any S3 API) for distributed mode: `s3://bucket/prefix`.

Objects live at `<prefix>/<key>` in the bucket. `put_bytes` is one PUT request up to 64 MiB; larger
objects (a real model's weights: 270–540 MB for SmolLM2-135M) go up as a multipart upload of 64 MiB
parts, sent a few at a time and each retried alone, read from the caller's one copy of the bytes. S3
makes an object visible only once its PUT (or CompleteMultipartUpload) completes, so a reader never
sees half an object. Each object carries a checksum of its bytes in its user metadata: the SHA-256
(`x-amz-meta-sha256`), or the one the caller gives (weight shards: `x-amz-meta-blake3`); `get_bytes` verifies
it when present and raises StoreError on a mismatch, as it does for a missing object.

`S3Store.from_url("s3://bucket/prefix")` takes the endpoint, region, addressing style and credentials
from the environment (scalerl.store.s3_settings: S3_ENDPOINT, S3_REGION, S3_ADDRESSING_STYLE, then static
keys S3_ACCESS_KEY/S3_SECRET_KEY, AWS_* keys, IRSA web identity, container or instance role). The bucket
is created if it does not exist.
"""

from __future__ import annotations

import io
from typing import Any
from urllib.parse import urlsplit

from minio import Minio
from minio.error import S3Error

from scalerl.store.base import HASHES, Checksum, Store, StoreError
from scalerl.store.s3_settings import S3Settings, S3SettingsError, credentials_provider, s3_settings

_MIN_PART = 5 * 1024**2  # S3's smallest part (the minio client's smallest part_size)
MULTIPART_PART = 64 * 1024**2  # objects above this go up as a multipart upload of parts this size
READ_PIECE = 1024**2  # a ranged read fills its buffer this much at a time
_MISSING = ("NoSuchKey", "NoSuchObject", "NoSuchBucket", "NoSuchVersion")


def _split_endpoint(endpoint: str, secure: bool | None) -> tuple[str, bool]:
    """"http://host:port" -> ("host:port", False); a bare "host:port" keeps `secure` (default False)."""
    if "://" in endpoint:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"S3 endpoint {endpoint!r}: expected http(s)://host[:port]")
        if parts.path not in ("", "/"):
            raise ValueError(f"S3 endpoint {endpoint!r}: must not have a path")
        return parts.netloc, parts.scheme == "https" if secure is None else secure
    return endpoint, bool(secure)


class S3Store(Store):
    """`access_key`/`secret_key`: a static key pair; or "" and a minio `credentials` provider (IRSA,
    instance role...). `region` None: asked from the server. `addressing`: auto, path or virtual."""

    def __init__(self, endpoint: str, access_key: str, secret_key: str, bucket: str, prefix: str = "",
                 secure: bool | None = None, region: str | None = "us-east-1", *,
                 create_bucket: bool = True, client: Any = None, credentials: Any = None,
                 addressing: str = "auto") -> None:
        host, tls = _split_endpoint(endpoint, secure)
        if not bucket:
            raise ValueError("S3Store: bucket name is empty")
        if addressing not in ("auto", "path", "virtual"):
            raise ValueError(f"S3Store: addressing {addressing!r} is not auto, path or virtual")
        if credentials is None and not (access_key and secret_key):
            raise ValueError("S3Store: give an access key and a secret key, or a credentials provider")
        self.endpoint = host
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.region = region
        if client is None:
            client = Minio(host, access_key=None if credentials else access_key,
                           secret_key=None if credentials else secret_key, secure=tls, region=region,
                           credentials=credentials)
            if addressing == "path":
                client.disable_virtual_style_endpoint()
            elif addressing == "virtual":
                client.enable_virtual_style_endpoint()
        self.client: Any = client
        if create_bucket:
            self._ensure_bucket()

    @classmethod
    def from_settings(cls, settings: S3Settings, bucket: str, prefix: str = "", *,
                      create_bucket: bool = True) -> S3Store:
        return cls(settings.endpoint, "", "", bucket, prefix, region=settings.region,
                   credentials=credentials_provider(settings), addressing=settings.addressing,
                   create_bucket=create_bucket)

    @classmethod
    def from_url(cls, url: str) -> S3Store:
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc:
            raise ValueError(f"store URL {url!r}: expected s3://bucket[/prefix]")
        try:
            settings = s3_settings()
        except S3SettingsError as exc:
            raise StoreError(f"{url}: {exc}") from None
        return cls.from_settings(settings, parts.netloc, parts.path)

    def _ensure_bucket(self) -> None:
        if self.client.bucket_exists(self.bucket):
            return
        try:
            self.client.make_bucket(self.bucket, location=self.region)
        except S3Error as exc:  # created concurrently by another process
            if exc.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise

    def _name(self, key: str) -> str:
        if not key or key.startswith("/") or any(p in ("", ".", "..") for p in key.split("/")):
            raise StoreError(f"invalid key {key!r}: expected a relative 'a/b/c' path")
        return f"{self.prefix}/{key}" if self.prefix else key

    # ---- Store ------------------------------------------------------------------------------------

    def put_bytes(self, key: str, data: bytes | memoryview, *, checksum: Checksum | None = None) -> str:
        name = self._name(key)
        n = len(data)
        part_size = max(n, _MIN_PART) if n <= MULTIPART_PART else MULTIPART_PART  # one part: a single PUT
        algorithm, digest = checksum or ("sha256", HASHES["sha256"](data))
        if algorithm not in HASHES:
            raise StoreError(f"checksum algorithm {algorithm!r}: expected one of {sorted(HASHES)}")
        self.client.put_object(self.bucket, name, io.BytesIO(data), n, part_size=part_size,
                               content_type="application/octet-stream",
                               metadata={algorithm: digest})
        return self.uri(key)

    def get_bytes(self, key: str, *, verify: bool = True) -> bytes:
        name = self._name(key)
        try:
            resp = self.client.get_object(self.bucket, name)
        except S3Error as exc:
            if exc.code in _MISSING:
                raise StoreError(f"no object {self.uri(key)}") from exc
            raise StoreError(f"{self.uri(key)}: {exc.code}: {exc.message}") from exc
        try:
            data = bytes(resp.read())
            recorded = [(name, v) for name in HASHES if (v := resp.headers.get(f"x-amz-meta-{name}"))]
        finally:
            resp.close()
            resp.release_conn()
        for name, expected in recorded if verify else []:
            if (digest := HASHES[name](data)) != expected:
                raise StoreError(f"checksum mismatch for {self.uri(key)}: {name} {digest} != stored "
                                 f"{expected} (object corrupted or overwritten without metadata)")
        return data

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        """One ranged GET, read in pieces of READ_PIECE straight into `out` (the client's read of a piece is the
        only copy beside it)."""
        if not len(out):
            return
        try:
            resp = self.client.get_object(self.bucket, self._name(key), offset=offset, length=len(out))
        except S3Error as exc:
            if exc.code in _MISSING:
                raise StoreError(f"no object {self.uri(key)}") from exc
            raise StoreError(f"{self.uri(key)}: {exc.code}: {exc.message}") from exc
        try:
            got = 0
            while got < len(out):
                n = resp.readinto(out[got:got + READ_PIECE])
                if not n:
                    raise StoreError(f"{self.uri(key)}: the object ended after {offset + got} bytes, asked for "
                                     f"[{offset}, {offset + len(out)})")
                got += n
        finally:
            resp.close()
            resp.release_conn()

    def exists(self, key: str) -> bool:
        try:
            self.client.stat_object(self.bucket, self._name(key))
        except S3Error as exc:
            if exc.code in _MISSING:
                return False
            raise
        return True

    def list(self, prefix: str = "") -> list[str]:
        base = f"{self.prefix}/" if self.prefix else ""
        objs = self.client.list_objects(self.bucket, prefix=base + prefix, recursive=True)
        return sorted(o.object_name[len(base):] for o in objs if not o.is_dir)

    def delete(self, key: str) -> None:
        self.client.remove_object(self.bucket, self._name(key))  # S3 deletes are idempotent

    def uri(self, key: str) -> str:
        base = f"s3://{self.bucket}/{self.prefix}/" if self.prefix else f"s3://{self.bucket}/"
        return base + key
