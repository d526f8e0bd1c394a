"""The learner's fencing epoch in the store (`scalerl.bus.fencing` says what it is for).

`take_epoch` reads `learner/epoch` (0 when absent), writes it + 1 and returns that: the new learner's epoch.
`check_epoch` raises Fenced when the stored epoch is no longer the caller's: a newer learner has started.
The learner checks before each upload, so a fenced learner stops before it writes weights or a checkpoint
(what remains is the time between the check and the upload, milliseconds; weights keys carry their checksum,
so even then no object is overwritten). Two learners that start within that same window take the same epoch:
fencing covers a learner that outlives its replacement, not two replacements started together.
"""

from __future__ import annotations

from scalerl.store.base import Store

EPOCH_KEY = "learner/epoch"
FENCED_EXIT = 3
"""The exit status of a fenced learner process."""


class Fenced(RuntimeError):
    """A newer learner has taken over this job: this one must stop without writing anything more."""


def stored_epoch(store: Store) -> int:
    return int(store.get_bytes(EPOCH_KEY).decode()) if store.exists(EPOCH_KEY) else 0


def take_epoch(store: Store) -> int:
    epoch = stored_epoch(store) + 1
    store.put_bytes(EPOCH_KEY, str(epoch).encode())
    return epoch


def check_epoch(store: Store, epoch: int) -> None:
    now = stored_epoch(store)
    if now != epoch:
        raise Fenced(f"fenced: this learner has epoch {epoch}, the store says {now}: a newer learner of this job "
                     "has started; stopping without writing anything more")
