"""Policy versions that never repeat across learner restarts, and what rollouts of a lost lineage are.

A policy version is `steps + offset`. A learner that resumes from its checkpoint (step s, announced as
version c = s + offset) may have announced versions after c before it died: c+1..h (h = the highest
version ever uploaded, read from the store's `policy/` keys, which are written before each announcement).
Those weights are gone: the resumed learner continues from c's weights. It numbers past them: its offset
becomes h + 1 − s, so its current weights are announced as h + 1 and every later version is new. The
versions c+1..h are the **lost lineage** (kept in the learner's checkpointed state, so followers of a
sharded learner and later restarts know them too). A learner that starts without a checkpoint while the
store already holds versions 0..h treats all of them as lost (it cannot vouch for weights it did not load).

Decision: rollouts with any token sampled by a lost version are **stale**: dropped before the batch is
formed and counted (`dropped_stale`, and `dropped_lost_lineage` for this cause), never trained on. Why not
use them as off-policy data under CISPO's truncated importance sampling (their recorded log-probs would
allow it)? The bound k promises that the behaviour policy is at most k optimizer steps from the learner;
a lost version's distance to the current weights is not its version difference (it sits on a branch that
forked at c, so it is (v − c) + (current − (h + 1)) steps away, possibly more than k), and the rule that
keeps k's meaning with no per-branch bookkeeping is to drop them. The cost is bounded by what was in
flight when the learner died (at most `max_inflight` prompts).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Lineage:
    """offset: policy version − optimizer steps; lost: inclusive [lo, hi] ranges of lost versions."""

    offset: int = 0
    lost: tuple[tuple[int, int], ...] = ()

    def is_lost(self, version: int) -> bool:
        return any(lo <= version <= hi for lo, hi in self.lost)

    def any_lost(self, versions: Iterable[int]) -> bool:
        return bool(self.lost) and any(self.is_lost(v) for v in set(versions))


def resume_lineage(step: int, checkpoint: Lineage | None, high_water: int | None) -> Lineage:
    """The lineage of a learner that starts at `step` from a checkpoint with lineage `checkpoint` (None: no
    checkpoint, step 0), given `high_water`, the highest version ever uploaded (None: none yet)."""
    base = checkpoint if checkpoint is not None else Lineage()
    if high_water is None:
        return base
    current = step + base.offset
    if checkpoint is not None and high_water <= current:
        return base  # nothing announced past the checkpoint: its version is announced again, same weights
    first_lost = current + 1 if checkpoint is not None else 0
    lost = (*base.lost, (first_lost, high_water)) if first_lost <= high_water else base.lost
    return Lineage(offset=high_water + 1 - step, lost=lost)


def lineage_state(lineage: Lineage) -> dict[str, Any]:
    """The lineage's entries of a learner state dict."""
    return {"version_offset": lineage.offset, "lost_versions": [list(r) for r in lineage.lost]}


def lineage_of(state: dict[str, Any]) -> Lineage:
    """The lineage in a learner state dict (a checkpoint from before lineages has offset 0, nothing lost)."""
    lost = state.get("lost_versions") or []
    return Lineage(int(state.get("version_offset") or 0), tuple((int(lo), int(hi)) for lo, hi in lost))
