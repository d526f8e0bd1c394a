"""Chunk codecs of a weight version: the bits of a slice of one tensor, raw or as a sparse XOR delta.

A tensor is handled as its bit pattern (`bits`: the same memory viewed as int16 for bfloat16/float16,
int32 for float32 and so on: `BIT_VIEWS`), so decoding is exact: no float arithmetic touches a value. A
chunk is a contiguous element range [start, start + count) of one tensor, encoded one of three ways:

- ``raw``: the chunk's bytes as they are (snapshots; a delta chunk where most values changed).
- ``xor``: against the previous version's bits of the same range, ``x = new ^ old``; stored as one zstd
  frame of ``packbits(x != 0)`` (one bit per element) followed by the changed elements' ``x`` split into
  byte planes (all first bytes, then all second bytes...). At RL learning rates most low-precision values
  do not move between versions, the mask is sparse and an XOR of a one-ulp move is a small number, so
  both parts compress well (8.5% of bf16 values changed -> about 5% of the raw bytes).
- ``same``: nothing stored; the chunk equals the previous version's.

`crc32(bits)` is the per-tensor checksum of the bit pattern (zlib's CRC-32 of its bytes).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

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
    """One encoded chunk: `encoding` (ENCODINGS), its bytes, and how many elements changed (count for raw)."""

    encoding: str
    data: bytes
    changed: int


def bits_of(t: torch.Tensor) -> torch.Tensor:
    """The bit pattern of a contiguous float tensor as a flat integer tensor sharing its memory [numel]."""
    if t.dtype not in BIT_VIEWS:
        raise CodecError(f"dtype {t.dtype} cannot be published: expected one of {sorted(map(str, BIT_VIEWS))}")
    return t.reshape(-1).view(BIT_VIEWS[t.dtype])


def crc32(bits: torch.Tensor) -> int:
    """CRC-32 of a flat integer tensor's bytes (zlib's; releases the GIL, so tensors hash in parallel)."""
    a = bits.numpy()
    return zlib.crc32(a.view(np.uint8).reshape(-1).data) & 0xFFFFFFFF


def _planes(x: np.ndarray) -> bytes:
    """[k] int16/int32 -> bytes of its byte planes ([width, k]: every element's first byte, then second...)."""
    return x.view(np.uint8).reshape(-1, x.itemsize).T.tobytes()


def encode(new: torch.Tensor, old: torch.Tensor | None) -> Encoded:
    """Encode the chunk `new` (flat bits [count]) against the previous version's `old` (flat bits [count];
    None: a snapshot, raw). Picks ``same`` when nothing changed and ``raw`` when the delta is not smaller."""
    a = new.numpy()
    if old is None:
        return Encoded("raw", a.tobytes(), a.size)
    x = np.bitwise_xor(a, old.numpy())
    mask = x != 0
    changed = int(np.count_nonzero(mask))
    if changed == 0:
        return Encoded("same", b"", 0)
    body = np.packbits(mask).tobytes() + _planes(x[mask])
    data = zstandard.ZstdCompressor(level=_LEVEL).compress(body)
    if len(data) >= a.nbytes:
        return Encoded("raw", a.tobytes(), changed)
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
    mask_bytes = (a.size + 7) // 8
    expected = mask_bytes + changed * a.itemsize
    try:
        body = zstandard.ZstdDecompressor().decompress(data, max_output_size=expected)
    except zstandard.ZstdError as exc:
        raise CodecError(f"{what}: not a zstd frame ({exc})") from None
    if len(body) != expected:
        raise CodecError(f"{what}: xor chunk decodes to {len(body)} bytes, expected {expected}")
    mask = np.unpackbits(np.frombuffer(body, np.uint8, mask_bytes), count=a.size).view(bool)
    if int(np.count_nonzero(mask)) != changed:
        raise CodecError(f"{what}: mask marks {int(np.count_nonzero(mask))} changed values, expected {changed}")
    planes = np.frombuffer(body, np.uint8, offset=mask_bytes).reshape(a.itemsize, changed)
    a[mask] ^= np.ascontiguousarray(planes.T).view(a.dtype).reshape(-1)
