"""Generator role on the bus: `prompts` -> `rollouts`, with in-flight policy updates from `policy`.

Between decode steps the engine asks `poll_policy()`; when a new `PolicyVersion` has been announced,
its weights are built from the store (`scalerl.weightsync`: the deltas since the loaded version, or a
snapshot and the deltas after it; every shard and tensor checksummed) and swapped in, keeping the KV cache
(PipelineRL). The policy topic has one partition, so the last announcement read is the learner's
current policy: it is loaded whenever it differs from the loaded one, also when its version number is
lower (a learner that restarted from a checkpoint announces its versions again), except an announcement of a
fenced learner (an older learner epoch than the newest seen: `scalerl.bus.fencing`), which is ignored.

Offsets of `prompts` are committed only after the rollouts are published, so a
generator killed mid-batch leaves its prompts to be re-delivered.

The generators own the dead letters of `prompts`: a record that is not a PromptTask, names a prompt the
job does not have, asks for another group size than G (`scalerl.bus.validate`) or whose tokens leave no
room for a completion under the engine's positions ("too_long") goes to `dlq`, once: the batch's other
prompts are generated and the offset committed (a prompt the engine cannot take would otherwise fail its
whole batch after every restart, on every generator that gets its partition). A bad
record on `policy` is skipped here (the curriculum dead-letters it).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import torch

from scalerl.bus import Bus, TopicNames
from scalerl.bus.base import Consumer
from scalerl.bus.dlq import DeadLetters
from scalerl.bus.fencing import FenceFilter
from scalerl.bus.validate import Limits, reason_for
from scalerl.config import JobSpec
from scalerl.faults.points import crash_point
from scalerl.generator.engine import GenerationEngine, LengthControl, SamplingParams
from scalerl.generator.episode import episode_runner
from scalerl.messages import Completion, PolicyVersion, PromptTask, RolloutGroup
from scalerl.model.text import encode_prompt, end_ids, text_ids, think_close_spellings
from scalerl.store import Store
from scalerl.telemetry.hops import hop
from scalerl.weightsync.factory import make_reader, make_receiver
from scalerl.weightsync.prefetch import Prefetcher
from scalerl.weightsync.reader import WeightsUnavailable

__all__ = ["GeneratorRole", "encode_prompt", "length_control"]


def length_control(spec: JobSpec, tokenizer: Any, *, interrupt: bool | None = None) -> LengthControl:
    """The job's length rules in token ids (interruption unless `length_control: length_penalty`);
    `</think>`, EOS and the end-of-turn ids come from the tokenizer (`scalerl.model.text`)."""
    g = spec.generation
    use_interrupt = g.length_control == "interruption" if interrupt is None else interrupt
    phrase = text_ids(tokenizer, g.interruption.phrase)
    close, *alts = think_close_spellings(tokenizer)
    eos, *turn_ends = end_ids(tokenizer)
    return LengthControl(thinking_budget=g.thinking_budget_tokens, answer_budget=g.answer_budget_tokens,
                         think_close_ids=close, think_close_alts=tuple(alts), eos_id=eos, end_ids=tuple(turn_ends),
                         interruption_ids=phrase if use_interrupt else None,
                         window=tuple(g.interruption.window_tokens))  # type: ignore[arg-type]


def batch_staleness(newest_announced: int, comps: list[Completion]) -> int:
    """Policy versions between the newest announced and the oldest that produced a token of `comps`
    (0 for an empty batch): how far behind the learner the batch was when it left."""
    return max(0, newest_announced - min(c.min_version for c in comps)) if comps else 0

log = logging.getLogger(__name__)

WAIT_FOR_WEIGHTS_S = 600.0
"""How long a generator waits between batches for an announced version being built (seconds)."""


class GeneratorRole:
    def __init__(self, spec: JobSpec, engine: GenerationEngine, tokenizer: Any, bus: Bus, store: Store,
                 topics: TopicNames, limits: Limits, *, generator_id: str = "generator-0",
                 group: str = "generators", prompts: Consumer | None = None) -> None:
        self.spec = spec
        self.engine = engine
        self.tokenizer = tokenizer
        self.bus = bus
        self.store = store
        self.weights = make_reader(spec, store)  # builds announced versions in a resident copy (weightsync)
        self.prefetch = (Prefetcher(self.weights, name=f"{generator_id}-weights")
                         if spec.runtime.weight_sync.prefetch else None)
        # runtime.weight_sync.broadcast: shards pushed by the learner land in the reader's inbox
        self.receiver = make_receiver(spec, generator_id, self.weights)
        self.offered: PolicyVersion | None = None  # the last announcement fetched or handed to the prefetcher
        self.topics = topics
        self.generator_id = generator_id
        self.group = group
        self.limits = limits
        # `prompts`: a consumer shared by the generator threads of one process (each record goes to one of them)
        self.prompts = prompts if prompts is not None else bus.consumer([topics.prompts], group)
        self.policy = bus.reader([topics.policy])
        self.dead = DeadLetters(bus, topics.dlq, group)
        self.policy_skipped = 0  # records on `policy` that are not announcements
        self.fence = FenceFilter()  # announcements of a learner epoch older than the newest seen are ignored
        self.sampling = SamplingParams(spec.generation.temperature, spec.generation.top_p)
        self.length = length_control(spec, tokenizer)
        # `environment.tools`: multi-turn episodes with tool calls in place of single turns
        self.episodes = episode_runner(spec, engine, tokenizer)
        self.paused = threading.Event()  # set -> stop taking new work (evaluation in progress)
        self.gen_tokens = 0
        self.groups_out = 0
        self.loaded: PolicyVersion | None = None  # the announcement whose weights the engine holds
        self.newest_announced = 0  # the highest version announced so far
        # newest announced version minus the oldest that produced a token of the last batch published
        # (the staleness metric: > 0 when weights changed in flight or while the batch waited)
        self.staleness = 0

    def rewind(self) -> None:
        """After a failed batch: rejoin the group from its committed offsets, so the prompts of that
        batch are read again (by this generator or another)."""
        self.prompts.close()
        self.prompts = self.bus.consumer([self.topics.prompts], self.group)

    def poll_policy(self, timeout_s: float = 0.0, wait: bool = False) -> tuple[int, dict[str, torch.Tensor]] | None:
        """The newest announced policy if it is not the loaded one (called between decode steps; the caller
        loads what it returns before it polls again). Built at once from the store (`weightsync`), or, with
        `runtime.weight_sync.prefetch`, in the background while the engine generates (`weightsync.prefetch`:
        returned once built; `wait`: wait for it, between batches)."""
        if self.prefetch is not None:
            self.prefetch.loaded()  # what the last poll returned has been loaded by now
        latest: PolicyVersion | None = None
        for rec in self.policy.poll(timeout_s=timeout_s):
            if isinstance(rec.value, PolicyVersion):
                if not self.fence.admits(rec.headers):
                    continue  # a fenced learner's announcement (scalerl.bus.fencing)
                latest = rec.value
                self.newest_announced = max(self.newest_announced, latest.version)
            else:
                self.policy_skipped += 1
        fresh = latest if latest is not None and latest not in (self.loaded, self.offered) else None
        if self.prefetch is None:
            if fresh is None:
                return None
            self.offered = fresh
            try:
                weights = self.weights.fetch(fresh)
            except WeightsUnavailable as exc:  # keep serving the loaded version; the next one will be a snapshot
                log.warning("%s: %s", self.generator_id, exc)
                return None
            self.loaded = fresh
            return fresh.version, weights
        if fresh is not None:
            self.prefetch.offer(fresh)
            self.offered = fresh
        built = self.prefetch.take(wait_s=WAIT_FOR_WEIGHTS_S if wait else 0.0)
        if built is None:
            return None
        self.loaded = built[0]
        return built[0].version, built[1]

    def weight_counters(self) -> dict[str, float]:
        """Bytes of shards downloaded (and taken from the broadcast instead), versions that could not be built,
        seconds the last build took, and with broadcast on, groups lost and whether it is in one now."""
        w = self.weights
        out = {"weights_bytes": w.bytes_total, "weights_broadcast_bytes": w.bytes_broadcast,
               "weights_unbuildable": w.unbuildable, "weights_build_s": w.last_seconds}
        if self.receiver is not None:
            out.update(broadcast_failures=self.receiver.failures, broadcast_in_group=int(self.receiver.in_group))
        return out

    def sync_policy(self) -> None:
        """Load the newest announced weights now (between batches)."""
        update = self.poll_policy(wait=True)
        if update is not None:
            self.engine.load_weights(update[1], update[0])

    def close(self) -> None:
        """Stop building weights in the background (the consumers are the caller's)."""
        if self.prefetch is not None:
            self.prefetch.close()
        if self.receiver is not None:
            self.receiver.close()

    def run_once(self, timeout_s: float = 0.0, in_flight: bool = True) -> int:
        """Generate one batch of up to `prompts_per_batch` prompts; returns prompts handled."""
        self.sync_policy()
        records = self.prompts.poll(timeout_s=timeout_s, max_records=self.spec.generation.prompts_per_batch)
        tasks: list[tuple[Any, PromptTask, list[int]]] = []
        for rec in records:
            reason = reason_for(rec.value, PromptTask, self.limits)
            ids = encode_prompt(self.tokenizer, self._prompt(rec.value.prompt)) if reason is None else []
            reason = reason or self._room_reason(len(ids))
            if reason is None:
                tasks.append((rec, rec.value, ids))
            else:
                self.dead.send(rec, reason)
        if tasks:
            self.sync_policy()  # the policy announced before these prompts were issued, before the first token
            self._generate(tasks, in_flight)
        if records:
            self.bus.flush()
            self.prompts.commit()
        return len(records)

    def _prompt(self, text: str) -> str:
        """The prompt text the model sees: the task's, with the tools' instructions when it has tools."""
        return text if self.episodes is None else self.episodes.prompt(text)

    def _room_reason(self, n: int) -> str | None:
        """Why the engine cannot complete a prompt of `n` tokens ("too_long: ..."), or None."""
        room = self.engine.max_positions
        if n < room:
            return None
        return f"too_long: the prompt is {n} tokens, the model takes {room} positions in all (prompt + completion)"

    def _generate(self, tasks: list[tuple[Any, PromptTask, list[int]]], in_flight: bool) -> None:
        flat = [ids for _, t, ids in tasks for _ in range(t.group_size)]
        generate = self.engine.generate if self.episodes is None else self.episodes.generate
        comps = generate(flat, self.sampling, self.length, policy_source=self.poll_policy if in_flight else None)
        crash_point("generator.batch")
        i = 0
        for rec, task, pids in tasks:
            group = comps[i:i + task.group_size]
            i += task.group_size
            self.gen_tokens += sum(len(c.token_ids) for c in group)
            with hop("generator.generate", rec.headers) as headers:
                headers["policy_version"] = str(max(c.max_version for c in group))
                self.bus.publish(self.topics.rollouts,
                                 RolloutGroup(task=task, prompt_token_ids=pids, completions=group,
                                              generator_id=self.generator_id),
                                 key=task.prompt_id, headers=headers)
            self.groups_out += 1
        self.staleness = batch_staleness(self.newest_announced, comps)
