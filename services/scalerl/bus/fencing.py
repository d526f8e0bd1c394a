"""Fencing of the learner's announcements: one learner timeline speaks on `policy` at a time.

Two learners can be alive at once: a StatefulSet Pod force-deleted while its container still runs on a
partitioned node, or a process a supervisor thought dead. Both would announce policy versions, and their
numbers can collide. Every learner start takes a new **epoch** from the store (`scalerl.store.fencing`:
the stored epoch + 1) before it announces anything, and every announcement carries it in the
`learner_epoch` header. Readers of `policy` (generators, the curriculum) keep the highest epoch they have
seen and ignore announcements of a lower one (`FenceFilter`); an announcement without the header is of
epoch 0 (a learner from before fencing). A fenced learner finds the stored epoch above its own before its
next upload (weights or checkpoint) and exits (`scalerl.store.fencing.Fenced`).
"""

from __future__ import annotations

from collections.abc import Mapping

EPOCH_HEADER = "learner_epoch"


def announcement_epoch(headers: Mapping[str, str]) -> int:
    """The learner epoch an announcement was made in (0 without the header, or when it is not a number)."""
    value = headers.get(EPOCH_HEADER, "")
    return int(value) if value.isdigit() else 0


class FenceFilter:
    """Admits the announcements of the newest learner epoch seen so far; counts the others (`fenced`)."""

    def __init__(self) -> None:
        self.epoch = 0
        self.fenced = 0

    def admits(self, headers: Mapping[str, str]) -> bool:
        epoch = announcement_epoch(headers)
        if epoch < self.epoch:
            self.fenced += 1
            return False
        self.epoch = epoch
        return True
