"""Batch assembly: scored groups -> padded tensors the loss consumes.

Legend: N = sequences (groups × G), L = longest prompt+completion − 1 (next-token positions).

Order of operations per step (ScaleRL §2.8):
1. drop groups older than k policy versions (PipelineRL-k bound; counted as `dropped_stale`), and groups
   with a token of a lost lineage (`scalerl.learner.lineage`; counted in `dropped_stale` and
   `dropped_lost_lineage`);
2. zero-variance filter: drop groups whose G rewards are all equal, no refill (§2.6);
3. advantages on the survivors (group-centred, batch std taken *after* the filter — spec §6.6
   leaves this open; after is the effective batch the loss actually sees).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scalerl.learner.lineage import Lineage
from scalerl.messages import ScoredGroup
from scalerl.recipe import group_advantages, token_age_counts, zero_variance_mask


@dataclass(slots=True)
class TrainBatch:
    """input_ids, attention_mask, targets: [N, L] long; loss_mask: [N, L] bool (completion tokens the
    policy chose); logp_gen: [N, L] float32 (generator log-probs aligned with targets, 0 elsewhere);
    group_ids: [N] long; advantages, rewards: [N] float32; age: [N] long (learner version − oldest token
    version of the sequence)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    targets: torch.Tensor
    loss_mask: torch.Tensor
    logp_gen: torch.Tensor
    group_ids: torch.Tensor
    advantages: torch.Tensor
    rewards: torch.Tensor
    age: torch.Tensor

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def select_groups(self, groups: torch.Tensor) -> TrainBatch:
        """Rows whose group id is in `groups` (for micro-batches of whole groups)."""
        rows = torch.isin(self.group_ids, groups)
        return TrainBatch(*(getattr(self, f)[rows] for f in self.__slots__))  # type: ignore[attr-defined]

    def to(self, device: torch.device) -> TrainBatch:
        return TrainBatch(*(getattr(self, f).to(device) for f in self.__slots__))  # type: ignore[attr-defined]


@dataclass(slots=True)
class Assembled:
    batch: TrainBatch | None
    kept_groups: list[ScoredGroup]
    dropped_stale: int
    dropped_zero_variance: int
    token_ages: dict[int, int]  # {age in versions: trained tokens} over the kept groups' loss-mask tokens
    dropped_lost_lineage: int = 0


def stale_reason(group: ScoredGroup, version: int, k: int, lineage: Lineage | None = None) -> str | None:
    """Why `group` can never be trained at learner version `version` or later: "lost" (a token sampled by a
    version of a lost lineage), "stale" (a token more than k versions old), or None (fresh)."""
    if lineage is not None and lineage.any_lost(v for c in group.rollout.completions for v in c.versions):
        return "lost"
    oldest = min((c.min_version for c in group.rollout.completions), default=version)
    return "stale" if version - oldest > k else None


def split_stale(groups: list[ScoredGroup], version: int, k: int,
                lineage: Lineage | None = None) -> tuple[list[ScoredGroup], list[ScoredGroup], int]:
    """(fresh, stale, lost): a group is stale when any of its tokens is more than k versions old or was
    sampled by a version of a lost lineage; `lost` counts the stale groups of the second kind."""
    fresh: list[ScoredGroup] = []
    stale: list[ScoredGroup] = []
    lost = 0
    for g in groups:
        reason = stale_reason(g, version, k, lineage)
        (stale if reason else fresh).append(g)
        lost += reason == "lost"
    return fresh, stale, lost


def assemble(groups: list[ScoredGroup], *, version: int, k: int, pad_id: int, zero_variance_filter: bool,
             normalization: str, lineage: Lineage | None = None) -> Assembled:
    """`version`: the learner's current policy version; `lineage`: its lost versions (None: none)."""
    fresh, stale, n_lost = split_stale(groups, version, k, lineage)
    rewards = torch.tensor([r for g in fresh for r in g.rewards], dtype=torch.float32)
    gid = torch.tensor([i for i, g in enumerate(fresh) for _ in g.rewards], dtype=torch.long)
    if zero_variance_filter and len(fresh):
        keep_rows = zero_variance_mask(rewards, gid)
        keep_groups = sorted({int(i) for i in gid[keep_rows]})
    else:
        keep_groups = list(range(len(fresh)))
    kept = [fresh[i] for i in keep_groups]
    n_zero = len(fresh) - len(kept)
    if not kept:
        return Assembled(None, [], len(stale), n_zero, {}, n_lost)

    seqs: list[list[int]] = []
    gens: list[list[float]] = []
    masks: list[list[bool]] = []
    starts: list[int] = []
    ages: list[int] = []
    group_of: list[int] = []
    for gi, g in enumerate(kept):
        prompt = g.rollout.prompt_token_ids
        for c in g.rollout.completions:
            seqs.append(prompt + c.token_ids)
            gens.append(c.logprobs)
            masks.append(c.loss_mask)
            starts.append(len(prompt) - 1)  # target position of the first completion token
            ages.append(version - c.min_version)
            group_of.append(gi)
    N, L = len(seqs), max(len(s) for s in seqs) - 1
    input_ids = torch.full((N, L), pad_id, dtype=torch.long)
    targets = torch.full((N, L), pad_id, dtype=torch.long)
    attn = torch.zeros((N, L), dtype=torch.long)
    loss_mask = torch.zeros((N, L), dtype=torch.bool)
    logp_gen = torch.zeros((N, L), dtype=torch.float32)
    for i, s in enumerate(seqs):
        n = len(s) - 1
        input_ids[i, :n] = torch.tensor(s[:-1])
        targets[i, :n] = torch.tensor(s[1:])
        attn[i, :n] = 1
        T = len(gens[i])
        loss_mask[i, starts[i]:starts[i] + T] = torch.tensor(masks[i], dtype=torch.bool)
        logp_gen[i, starts[i]:starts[i] + T] = torch.tensor(gens[i], dtype=torch.float32)
    group_ids = torch.tensor(group_of, dtype=torch.long)
    rewards_kept = torch.tensor([r for g in kept for r in g.rewards], dtype=torch.float32)
    adv = group_advantages(rewards_kept, group_ids, normalization=normalization)
    batch = TrainBatch(input_ids, attn, targets, loss_mask, logp_gen, group_ids, adv, rewards_kept,
                       torch.tensor(ages, dtype=torch.long))
    comps = [c for g in kept for c in g.rollout.completions]
    ages_hist = token_age_counts([c.versions for c in comps], [c.loss_mask for c in comps], version)
    return Assembled(batch, kept, len(stale), n_zero, ages_hist, n_lost)


def aggregation_units(mask: torch.Tensor, group_ids: torch.Tensor, aggregation: str) -> int:
    """How many units an aggregation averages over (groups / sequences with a token, or tokens).

    Micro-batch losses combine exactly as Σ loss_mb · units_mb / Σ units (see `policy_loss`'s
    `agg/units`)."""
    has_tok = mask.any(dim=-1)
    if aggregation == "token":
        return int(mask.sum())
    if aggregation == "sample":
        return int(has_tok.sum())
    return int(torch.unique(group_ids[has_tok]).numel())
