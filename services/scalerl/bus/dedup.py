"""Which issued groups are decided: a watermark and a window over the curriculum's issue numbers.

Every prompt the curriculum issues carries `PromptTask.seq`, a number 1, 2, 3, … that never repeats for
another prompt (the curriculum writes its state ahead of publishing, so a restart re-publishes the same
task under the same number: `scalerl.runtime.curriculum_service`). A group is *decided* once the learner
trained or dropped it, or once it was dead-lettered anywhere. A copy of a decided group (a generator or a
verifier that crashed before its commit and produced it again; a batch the curriculum re-published) must be
skipped, never trained twice.

`DecidedSet` remembers that with bounded state: `below`, every number ≤ it decided, and `above`, the decided
numbers past the first undecided one. Its size is the out-of-order span of the run — how many groups were
decided while the oldest undecided one was still in flight — not the length of the run: a set of every
decided id grew for the whole run and went into every checkpoint (#27, finding 7).

Groups without a number (`seq == 0`: published by hand or by a test, or read from a checkpoint written before
the numbers) are remembered by id in `ids`, as every group was before.
"""

from __future__ import annotations

from typing import Any


class DecidedSet:
    """The decided issue numbers (`below` and `above`), groups without one by id, and how many this learner
    decided itself (`count`: the curriculum's flow control; dead letters it only learned of are not counted)."""

    def __init__(self) -> None:
        self.below = 0
        self.above: set[int] = set()
        self.ids: set[str] = set()
        self.count = 0

    def __contains__(self, key: tuple[int, str]) -> bool:
        seq, group_id = key
        if seq > 0:
            return seq <= self.below or seq in self.above
        return group_id in self.ids

    def add(self, seq: int, group_id: str, *, counted: bool = True) -> bool:
        """Mark one group decided. Returns False when it was decided already (then nothing changes).
        `counted`: decided by this learner (trained, dropped, dead-lettered by it), not only learned of."""
        if (seq, group_id) in self:
            return False
        if seq > 0:
            self.above.add(seq)
            while self.below + 1 in self.above:
                self.below += 1
                self.above.discard(self.below)
        else:
            self.ids.add(group_id)
        self.count += int(counted)
        return True

    @property
    def window(self) -> int:
        """Numbers kept past the watermark: the state's size beside the constant `below`."""
        return len(self.above)

    def state_dict(self) -> dict[str, Any]:
        return {"below": self.below, "above": sorted(self.above), "ids": sorted(self.ids), "count": self.count}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> DecidedSet:
        """From `state_dict()`, or from a checkpoint's list of decided ids (written before the numbers)."""
        out = cls()
        if "consumed_ids" in state:  # (an older checkpoint: every id it decided, and no numbers)
            out.ids = {str(i) for i in state["consumed_ids"]}
            out.count = len(out.ids)
            return out
        decided = state["decided"]
        out.below = int(decided["below"])
        out.above = {int(s) for s in decided["above"]}
        out.ids = {str(i) for i in decided["ids"]}
        out.count = int(decided["count"])
        if out.below < 0 or any(s <= out.below for s in out.above):
            raise ValueError(f"decided: numbers {sorted(out.above)[:4]} at or below the watermark {out.below}")
        return out
