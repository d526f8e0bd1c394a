"""The broadcast's object framing (scalerl.weightsync.wire): a header round-trips, and one that no learner of
ours sends is refused before the receiver allocates anything."""

from __future__ import annotations

import pytest
import torch

from scalerl.weightsync.wire import MAX_OBJECT_BYTES, META_BYTES, SourceFailed, frame, pull, unframe

CPU = torch.device("cpu")


def test_a_header_round_trips_and_minus_one_ends_a_version() -> None:
    key = "policy/v00000012-0123456789abcdef-s/shard-0003"
    head = frame(269_030_016, key, CPU)
    assert head.dtype == torch.uint8 and head.numel() == META_BYTES
    assert unframe(head) == (269_030_016, key)
    assert unframe(frame(-1, "", CPU)) == (-1, "")
    assert unframe(frame(0, "policy/empty", CPU)) == (0, "policy/empty")


def _raw(size: int, key_len: int) -> torch.Tensor:
    head = size.to_bytes(8, "little", signed=True) + key_len.to_bytes(2, "little")
    return torch.frombuffer(bytearray(head.ljust(META_BYTES, b"\0")), dtype=torch.uint8)


@pytest.mark.parametrize(("size", "key_len"), [(MAX_OBJECT_BYTES + 1, 4), (-2, 4), (10, META_BYTES - 9)])
def test_a_foreign_header_is_refused(size: int, key_len: int) -> None:
    with pytest.raises(ValueError, match="not a send of ours"):
        unframe(_raw(size, key_len))


def test_a_key_too_long_for_a_header_is_refused_by_the_sender() -> None:
    with pytest.raises(ValueError, match="at most"):
        frame(1, "k" * (META_BYTES - 9), CPU)


def test_an_error_of_the_objects_themselves_is_told_apart() -> None:
    def objects():
        yield "a", b"1"
        raise OSError("the encoder failed")

    got = pull(objects())
    assert next(got) == ("a", b"1")
    with pytest.raises(SourceFailed) as caught:
        next(got)
    assert isinstance(caught.value.__cause__, OSError)
