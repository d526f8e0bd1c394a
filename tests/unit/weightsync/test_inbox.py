"""The broadcast inbox: waiting for objects of a push under way, and the receive buffers it recycles."""

from __future__ import annotations

import threading
import time

import torch

from scalerl.weightsync.inbox import POOL_MIN_BYTES, Inbox

KEY = "policy/v{:08d}-0123456789abcdef-s/shard-{:04d}"


def receive(inbox: Inbox, version: int, index: int, size: int = POOL_MIN_BYTES) -> torch.Tensor:
    """What the receiver does for one object: a lent buffer, filled, put."""
    buf = inbox.buffer(size)
    buf.fill_(index)
    inbox.put(version, {KEY.format(version, index): buf.numpy().data})
    return buf


def test_a_take_waits_while_the_push_is_under_way_and_not_after_it_ended() -> None:
    inbox = Inbox()
    receive(inbox, 3, 0)
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(inbox.take(KEY.format(3, 1), wait_s=30)))
    t.start()
    time.sleep(0.3)
    assert t.is_alive(), "it did not wait for an object of a push under way"
    receive(inbox, 3, 1)
    t.join(timeout=30)
    assert got and got[0] is not None and bytes(got[0])[:1] == b"\x01"  # type: ignore[index]
    inbox.end(3)
    t0 = time.monotonic()
    assert inbox.take(KEY.format(3, 2), wait_s=30) is None and time.monotonic() - t0 < 5  # ended: no wait
    assert inbox.take(KEY.format(9, 0), wait_s=30) is None  # never pushed


def test_a_released_buffer_is_lent_again_and_one_still_read_never_is() -> None:
    inbox = Inbox(versions=1)
    first = receive(inbox, 3, 0)
    data = inbox.take(KEY.format(3, 0))
    assert data is not None
    inbox.release(KEY.format(3, 0))
    assert inbox.buffer(POOL_MIN_BYTES).data_ptr() == first.data_ptr()  # recycled
    inbox.end(3)  # (the lent buffer never came back as an object: forgotten)
    taken = receive(inbox, 4, 1)
    assert inbox.take(KEY.format(4, 1)) is not None  # taken, not released: a fetch may still read it
    untaken = receive(inbox, 4, 2)
    receive(inbox, 5, 3)  # version 4 is dropped: its untaken buffer is free again, the taken one is not
    lent = {inbox.buffer(POOL_MIN_BYTES).data_ptr() for _ in range(3)}
    assert untaken.data_ptr() in lent and taken.data_ptr() not in lent
    assert inbox.buffer(100).numel() == 100  # small objects: plain memory
