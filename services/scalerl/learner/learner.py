"""The learner: one optimizer step of the ScaleRL objective per batch of B scored prompt groups.

    J(θ) = mean over kept groups g of  (1 / Σ_{i∈g} |y_i|) Σ_{i∈g} Σ_t sg(min(ρ_it, ε_max)) · Â_i · log π_θ(y_it)

(spec §2.8), with ρ formed from the log-probs the generator recorded at sampling time. The loss
itself lives in `scalerl.recipe.policy_loss`; this module does batching, micro-batching, AdamW with
linear warm-up then constant LR, optional grad clipping, FSDP when torch.distributed is initialised
with several processes, and exact-resume state.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
import torch.distributed as dist

from scalerl.config import JobSpec
from scalerl.learner.batch import TrainBatch, aggregation_units, assemble
from scalerl.learner.lineage import Lineage, lineage_of, lineage_state
from scalerl.messages import ScoredGroup
from scalerl.model.factory import sequence_logprobs, trunk_of
from scalerl.recipe import age_stats, policy_loss


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) when torch.distributed is not initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def shard_model(model: Any) -> None:
    """FSDP2 (`fully_shard`): each decoder layer, the trunk (embeddings, final norm), the LM head (its
    own unit, so an FP32 head is sharded and gathered in float32), then the root."""
    from torch.distributed.fsdp import fully_shard

    trunk = trunk_of(model)
    for layer in getattr(trunk, "layers", []):
        fully_shard(layer)
    fully_shard(trunk)
    fully_shard(model.get_output_embeddings())
    fully_shard(model)


class Learner:
    def __init__(self, spec: JobSpec, model: Any, *, pad_id: int, version: int = 0) -> None:
        self.spec = spec
        self.model = model
        self.pad_id = pad_id
        self.version = version  # = optimizer steps taken
        # policy version = steps + offset: a resumed learner numbers past every version ever announced
        self.lineage = Lineage()
        self.rank, self.world_size = world()
        # Shard whenever a process group exists (FSDP on one device too), never without one.
        self.sharded = dist.is_available() and dist.is_initialized()
        if self.sharded:
            shard_model(model)
        o = spec.optim
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=o.betas, eps=o.adam_eps,
                                           weight_decay=o.weight_decay)
        warm = o.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warm) if warm > 0 else 1.0)
        self.device = next(model.parameters()).device

    @property
    def policy_version(self) -> int:
        """The version of the current weights as announced: unique for the job's lifetime."""
        return self.version + self.lineage.offset

    # -- one step ----------------------------------------------------------------------------------
    def probe(self, group: ScoredGroup) -> None:
        """Assemble `group` alone and run its forward pass (no gradient, no state change): raises what a
        step would raise on it (e.g. an embedding lookup past the vocabulary)."""
        s = self.spec
        asm = assemble([group], version=self.policy_version, k=s.off_policy.k, pad_id=self.pad_id, lineage=self.lineage,
                       zero_variance_filter=False, normalization=s.loss.advantage_normalization)
        if asm.batch is None:
            return
        mb = asm.batch.to(self.device)
        with torch.no_grad():
            sequence_logprobs(self.model, mb.input_ids, mb.attention_mask, mb.targets,
                              fp32_head=s.model.fp32_lm_head, temperature=s.generation.temperature)

    def step(self, groups: list[ScoredGroup]) -> dict[str, float]:
        """Train on `groups` (all ranks get the same list; each takes its share of whole groups)."""
        t0 = time.perf_counter()
        s = self.spec
        asm = assemble(groups, version=self.policy_version, k=s.off_policy.k, pad_id=self.pad_id, lineage=self.lineage,
                       zero_variance_filter=s.loss.zero_variance_filter,
                       normalization=s.loss.advantage_normalization)
        stats: dict[str, float] = {
            "batch/groups": float(len(groups)),
            "batch/effective": float(len(asm.kept_groups)),
            "batch/dropped_stale": float(asm.dropped_stale),
            "batch/dropped_lost_lineage": float(asm.dropped_lost_lineage),
            "batch/dropped_zero_variance": float(asm.dropped_zero_variance),
        }
        stats.update(_rollout_stats(groups))
        stats.update(_token_age_stats(asm.token_ages))
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        if asm.batch is not None:
            stats.update(self._backward(asm.batch))
            if s.optim.grad_clip_norm is not None:
                norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), s.optim.grad_clip_norm)
                stats["optim/grad_norm"] = float(norm)
            self.optimizer.step()
        stats["optim/lr"] = float(self.scheduler.get_last_lr()[0])
        if asm.batch is not None:  # the LR schedule counts optimizer updates, not empty steps
            self.scheduler.step()
        self.version += 1
        stats["time/step_s"] = time.perf_counter() - t0
        return stats

    def _backward(self, batch: TrainBatch) -> dict[str, float]:
        s = self.spec
        agg = s.loss.aggregation
        n_groups = int(batch.group_ids.max()) + 1
        mine = torch.arange(self.rank, n_groups, self.world_size)  # this rank's whole groups
        per_mb = s.train.micro_batch_prompts or max(1, len(mine))
        units_total = aggregation_units(batch.loss_mask, batch.group_ids, agg)
        totals: dict[str, float] = {}
        weights: dict[str, float] = {}
        loss_sum = 0.0
        if len(mine) == 0:  # more ranks than groups: join the collectives with a zero-weight pass
            mb = batch.select_groups(torch.tensor([0])).to(self.device)
            logp, _ = sequence_logprobs(self.model, mb.input_ids, mb.attention_mask, mb.targets,
                                        fp32_head=s.model.fp32_lm_head)
            (logp.sum() * 0.0).backward()
        for start in range(0, len(mine), per_mb):
            mb = batch.select_groups(mine[start:start + per_mb]).to(self.device)
            units = aggregation_units(mb.loss_mask, mb.group_ids, agg)
            if units == 0:
                continue
            logp, entropy = sequence_logprobs(self.model, mb.input_ids, mb.attention_mask, mb.targets,
                                              fp32_head=s.model.fp32_lm_head, temperature=s.generation.temperature,
                                              with_entropy=True, where=mb.loss_mask)  # the head only where the loss is
            loss, st = policy_loss(logp, mb.logp_gen, mb.advantages, mb.loss_mask, mb.group_ids,
                                   loss_type=s.loss.type, aggregation=agg, clip_low=s.loss.ppo_clip_low,
                                   clip_high=s.loss.ppo_clip_high, cispo_eps_max=s.loss.cispo_eps_max)
            # FSDP averages gradients over ranks, so scale the local share back up by world size.
            scale = units / units_total * self.world_size
            (loss * scale).backward()
            loss_sum += float(loss.detach()) * units / units_total
            ntok = float(mb.loss_mask.sum())
            assert entropy is not None
            _accumulate(totals, weights, "policy/entropy", float((entropy * mb.loss_mask).sum()) / max(ntok, 1), ntok)
            _accumulate(totals, weights, "offpolicy/age_mean", float(mb.age.float().mean()), len(mb))
            for key, val in st.items():
                if key.startswith("loss/") and key not in ("loss/ratio_max", "loss/ratio_min",
                                                             "loss/log_ratio_abs_max", "loss/tokens"):
                    _accumulate(totals, weights, key, float(val), ntok)
            totals["loss/ratio_max"] = max(totals.get("loss/ratio_max", -math.inf), float(st["loss/ratio_max"]))
            totals["offpolicy/age_max"] = max(totals.get("offpolicy/age_max", 0.0), float(mb.age.max()))
        out = {k: (v / weights[k] if k in weights else v) for k, v in totals.items()}
        out["loss/value"] = loss_sum * self.world_size if self.world_size > 1 else loss_sum
        out["tokens/train"] = float(batch.loss_mask.sum())
        out["tokens/train_seq"] = float(batch.attention_mask.sum())  # tokens run forward + backward
        out["reward/advantage_abs_mean"] = float(batch.advantages.abs().mean())
        if self.world_size > 1:
            t = torch.tensor([out["loss/value"]], dtype=torch.float64)
            dist.all_reduce(t)
            out["loss/value"] = float(t) / self.world_size
        return out

    # -- state -------------------------------------------------------------------------------------
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Unsharded model weights on CPU (a collective under FSDP: every rank must call it)."""
        if self.sharded:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            sd = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True,
                                                                            cpu_offload=True))
            return {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}
        return {k: v.detach().cpu() for k, v in self.model.state_dict().items()}

    def state_dict(self) -> dict[str, Any]:
        """Step count, optimizer and LR schedule. Sharded: a collective (every rank must call it) that
        gathers the full optimizer state, keyed by parameter name, onto rank 0 (the others get `{}`), so
        a checkpoint does not depend on the number of ranks that wrote it."""
        if self.sharded:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

            optim = get_optimizer_state_dict(self.model, self.optimizer,
                                             options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        else:
            optim = self.optimizer.state_dict()
        return {"version": self.version, "optimizer": optim, "scheduler": self.scheduler.state_dict(),
                **lineage_state(self.lineage)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The inverse of `state_dict`. Sharded: a collective; only rank 0's `state["optimizer"]` is read
        (the full state, broadcast and re-sharded, and written into: the caller's dict is consumed), the
        other ranks' is ignored."""
        self.version = int(state["version"])
        self.lineage = lineage_of(state)
        if self.sharded:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"] if self.rank == 0 else {},
                                     options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])


def broadcast_weights(model: Any) -> None:
    """Make every rank's (unsharded) `model` hold rank 0's weights; a no-op without a process group.
    Called before the learner shards the model, so ranks that did not load the checkpoint (or run SFT)
    start from the same policy as rank 0."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    state = model.state_dict()
    layout = [(name, tuple(t.shape), str(t.dtype)) for name, t in state.items()]
    box: list[Any] = [layout]
    dist.broadcast_object_list(box, src=0)
    if box[0] != layout:
        theirs = {n: (s, d) for n, s, d in box[0]}
        ours = {n: (s, d) for n, s, d in layout}
        diff = sorted(n for n in theirs.keys() | ours.keys() if theirs.get(n) != ours.get(n))
        raise RuntimeError(f"rank {dist.get_rank()}: the model differs from rank 0's in {len(diff)} tensors "
                           f"(first: {diff[:3]}); every rank must build the same architecture")
    with torch.no_grad():
        for tensor in state.values():
            dist.broadcast(tensor, src=0)


def _accumulate(totals: dict[str, float], weights: dict[str, float], key: str, value: float, w: float) -> None:
    totals[key] = totals.get(key, 0.0) + value * w
    weights[key] = weights.get(key, 0.0) + w


def _token_age_stats(counts: dict[int, int]) -> dict[str, float]:
    """`offpolicy/token_age_mean|max` and `offpolicy/token_age_tokens/<age>` (trained tokens of that age)."""
    out = {f"offpolicy/token_age_tokens/{age}": float(n) for age, n in sorted(counts.items())}
    st = age_stats(counts)
    if st["mean"] is not None and st["max"] is not None:
        out["offpolicy/token_age_mean"] = float(st["mean"])
        out["offpolicy/token_age_max"] = float(st["max"])
    return out


def _rollout_stats(groups: list[ScoredGroup]) -> dict[str, float]:
    comps = [c for g in groups for c in g.rollout.completions]
    if not comps:
        return {}
    n = float(len(comps))
    correct = [ok for g in groups for ok in g.correct]
    return {
        "rollout/truncation_rate": sum(c.finish_reason == "length" for c in comps) / n,
        "rollout/interruption_rate": sum(c.finish_reason == "interrupted" for c in comps) / n,
        "rollout/mean_tokens": sum(len(c.token_ids) for c in comps) / n,
        "rollout/pass_rate": sum(correct) / max(len(correct), 1),
        "reward/mean": sum(r for g in groups for r in g.rewards) / n,
        "tokens/gen": float(sum(len(c.token_ids) for c in comps)),
        # each of the G samples of a prompt prefills the prompt (scaling.compute: FLOPs)
        "tokens/prefill": float(sum(len(g.rollout.prompt_token_ids) * len(g.rollout.completions) for g in groups)),
        "rollout/versions_per_seq_max": float(max(len(set(c.versions)) for c in comps)),
    }
