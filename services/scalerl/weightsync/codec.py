"""Chunk codecs of a weight version: the bits of a slice of one tensor, raw or as a sparse XOR delta.

A tensor is handled as its bit pattern (`bits`: the same memory viewed as int16 for bfloat16/float16,
int32 for float32 and so on: `BIT_VIEWS`), so decoding is exact: no float arithmetic touches a value. A
chunk is a contiguous element range [start, start + count) of one tensor, encoded one of three ways:

- ``raw``: the chunk's bytes as they are (snapshots; a delta chunk where most values changed).
- ``xor``: against the previous version's bits of the same range: the positions that changed, as gaps
  (uint32: the first position, then the distance to the next) and their ``new ^ old``, both split into
  byte planes (every element's first byte, then every second byte...), in one zstd frame. At RL learning
  rates most low-precision values do not move between versions (about 2.5% of SmolLM2's bf16 values per
  step at the example's learning rate), gaps are small numbers and the XOR of a one-ulp move is one low
  bit, so a delta is a few percent of the raw bytes, and decoding touches only the changed values.
- ``same``: nothing stored; the chunk equals the previous version's.

`digest(data)` is the checksum of a version's objects and of each chunk's bit pattern: BLAKE3 (256 bits, hex),
a cryptographic hash that one core computes at about 5 GB/s, four to five times SHA-256's rate (weight sync
hashes every byte of a version twice on each side).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import blake3
import numpy as np
import torch
import zstandard

BIT_VIEWS: dict[torch.dtype, torch.dtype] = {
    torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32, torch.float64: torch.int64,
    torch.int64: torch.int64, torch.int32: torch.int32, torch.int16: torch.int16, torch.int8: torch.int8,
    torch.uint8: torch.uint8, torch.bool: torch.uint8,
}
"""Dtypes a tensor may be published in -> the integer dtype of the same width its bits are read as."""

ENCODINGS = ("raw", "xor", "same")
_LEVEL = 1  # zstd's fastest regular level: the deltas are mostly zeros, a higher level buys under 1%


class CodecError(ValueError):
    """A chunk that does not decode to what its manifest entry says (names the chunk in the message)."""


@dataclass(frozen=True, slots=True)
class Encoded:
    """One encoded chunk: `encoding` (ENCODINGS), its bytes (raw: a view of the chunk's own memory, not a
    copy), and how many elements changed (count for raw)."""

    encoding: str
    data: bytes | memoryview
    changed: int


def bits_of(t: torch.Tensor) -> torch.Tensor:
    """The bit pattern of a contiguous float tensor as a flat integer tensor sharing its memory [numel]."""
    if t.dtype not in BIT_VIEWS:
        raise CodecError(f"dtype {t.dtype} cannot be published: expected one of {sorted(map(str, BIT_VIEWS))}")
    return t.reshape(-1).view(BIT_VIEWS[t.dtype])


def digest(data: bytes | memoryview) -> str:
    """BLAKE3 of `data` as 64 hex digits, on the calling thread (it releases the GIL: callers hash in parallel)."""
    return blake3.blake3(data, max_threads=1).hexdigest()


def bits_digest(bits: torch.Tensor) -> str:
    """`digest` of a flat integer tensor's bytes [count]."""
    return digest(bits.numpy().view(np.uint8).reshape(-1).data)


def _planes(x: np.ndarray) -> bytes:
    """[k] integers -> bytes of its byte planes ([itemsize, k]: every element's first byte, then second...)."""
    return x.view(np.uint8).reshape(-1, x.itemsize).T.tobytes()


def _unplanes(buf: bytes | memoryview, offset: int, k: int, dtype: np.dtype) -> np.ndarray:
    """Inverse of `_planes` for `k` elements of `dtype` starting `offset` bytes into `buf`."""
    planes = np.frombuffer(buf, np.uint8, k * dtype.itemsize, offset).reshape(dtype.itemsize, k)
    return np.ascontiguousarray(planes.T).view(dtype).reshape(-1)


_GAP = np.dtype(np.uint32)
_local = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    if not hasattr(_local, "c"):  # one per thread: a compressor is not shared between threads
        _local.c, _local.d = zstandard.ZstdCompressor(level=_LEVEL), zstandard.ZstdDecompressor()
    c: zstandard.ZstdCompressor = _local.c
    return c


def _decompressor() -> zstandard.ZstdDecompressor:
    _compressor()
    d: zstandard.ZstdDecompressor = _local.d
    return d


def encode(new: torch.Tensor, old: torch.Tensor | None) -> Encoded:
    """Encode the chunk `new` (flat bits [count]) against the previous version's `old` (flat bits [count];
    None: a snapshot, raw). Picks ``same`` when nothing changed and ``raw`` when the delta is not smaller."""
    a = new.numpy()
    if old is None:
        return Encoded("raw", a.data.cast("B"), a.size)
    b = old.numpy()
    where = np.flatnonzero(a != b)
    changed = int(where.size)
    if changed == 0:
        return Encoded("same", b"", 0)
    if a.size > np.iinfo(_GAP).max:
        raise CodecError(f"a chunk of {a.size} elements: at most {np.iinfo(_GAP).max} (a smaller shard size)")
    gaps = np.empty(changed, _GAP)
    gaps[0] = where[0]
    np.subtract(where[1:], where[:-1], out=gaps[1:], casting="unsafe")
    body = _planes(gaps) + _planes(np.bitwise_xor(a[where], b[where]))
    data = _compressor().compress(body)
    if len(data) >= a.nbytes:
        return Encoded("raw", a.data.cast("B"), changed)
    return Encoded("xor", data, changed)


def decode_into(out: torch.Tensor, encoding: str, data: bytes | memoryview, changed: int, what: str) -> None:
    """Apply one chunk to `out` (flat bits [count], holding the previous version's bits for ``xor`` and
    ``same``) in place; `what` names the chunk in a CodecError."""
    a = out.numpy()
    if encoding == "same":
        if len(data):
            raise CodecError(f"{what}: encoding 'same' carries {len(data)} bytes, expected none")
        return
    if encoding == "raw":
        if len(data) != a.nbytes:
            raise CodecError(f"{what}: raw chunk of {len(data)} bytes, expected {a.nbytes}")
        a[:] = np.frombuffer(data, dtype=a.dtype)
        return
    if encoding != "xor":
        raise CodecError(f"{what}: unknown encoding {encoding!r} (expected one of {ENCODINGS})")
    expected = changed * (_GAP.itemsize + a.itemsize)
    if not 0 < changed <= a.size:
        raise CodecError(f"{what}: {changed} changed values in a chunk of {a.size}")
    try:
        body = _decompressor().decompress(data, max_output_size=expected)
    except zstandard.ZstdError as exc:
        raise CodecError(f"{what}: not a zstd frame ({exc})") from None
    if len(body) != expected:
        raise CodecError(f"{what}: xor chunk decodes to {len(body)} bytes, expected {expected}")
    gaps = _unplanes(body, 0, changed, _GAP)
    where = np.cumsum(gaps, dtype=np.int64)
    if where[-1] >= a.size or not gaps[1:].all():
        raise CodecError(f"{what}: positions out of order or past the chunk's {a.size} elements")
    a[where] ^= _unplanes(body, changed * _GAP.itemsize, changed, a.dtype)
