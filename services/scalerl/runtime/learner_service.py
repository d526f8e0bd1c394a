"""The learner as a service: `scored` → optimizer steps → weights in the store + `policy` announcements.

Exactly-once accounting across crashes. The learner takes B unique prompt groups per step. A group
already decided (trained, dropped or dead-lettered; known by the curriculum's issue number, in bounded state:
`scalerl.bus.dedup`) is a duplicate delivery: counted, never trained. Each
checkpoint (uploaded to the store) holds the model, the optimizer, the decided groups and the
**safe positions** on `scored`: per partition, the offset of the oldest record not yet consumed by a
step (records waiting in the batch buffer are not consumed). A restarted learner loads the checkpoint,
seeks to those positions and re-reads from there: every group before them is in exactly one step of
the resumed timeline (its train.jsonl is restored from the checkpoint too), every group after them is
read again. Each step record lists its group ids, so the accounting can be checked.

Fencing (`scalerl.bus.fencing`): every start takes a new learner epoch from the store and announces with it;
a learner that finds a newer epoch in the store before an upload stops (`Fenced`, exit 3).

A learner that starts without a checkpoint (a new job, or one killed before its first checkpoint) reads
`scored` from the beginning of every partition, never from a dead learner's committed offsets, starts its run
files afresh, and writes a step-0 checkpoint (its positions: the beginning) before it reads anything; every
later start is a restore. The consumer is the group's sole owner (`scalerl.bus.base.Bus.consumer`): its
positions, not the group's commits, decide where it reads after any rebalance or lost membership too.

What the learner reads from `scored`, drops or dead-letters without a step, and tells the curriculum
(PipelineRL-k, flow control, the dead letters of `scored`): `scalerl.runtime.learner_intake`. The step
itself is guarded (`_guarded_step`): a batch that still raises is probed group by group (forward pass only,
no state changes); the groups that raise are dead-lettered ("step_failed"), the others go back to the
buffer, and no step is taken. So no record can crash the learner
into a restart loop. (With several torchrun ranks a failed step may have left a collective half done: it is
re-raised and the group restarts, as for any rank failure.)

The end of the run: the learner writes summary.json and report.html, uploads them with metrics.jsonl and
train.jsonl to `run/` of the store (`scalerl.store.run_files`: the run folder dies with the pod), then
announces `done` on the metrics topic (the operator turns the job Succeeded and sets status.report). Each
step logs one line (`scalerl.runtime.outputs.step_line`), what `kubectl logs` of the learner shows.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

from scalerl.bus import TopicNames
from scalerl.bus.background import BackgroundConsumer
from scalerl.bus.base import Bus, Record
from scalerl.bus.dedup import DecidedSet
from scalerl.bus.dlq import DeadLetters
from scalerl.bus.fencing import EPOCH_HEADER
from scalerl.faults.points import crash_point
from scalerl.learner.checkpoint import load_trainer_state, save_checkpoint, set_rng_state
from scalerl.learner.lineage import lineage_of, resume_lineage
from scalerl.messages import STOP_REASON_CODES, MetricRecord
from scalerl.runtime.learner_intake import ScoredIntake
from scalerl.runtime.outputs import step_line
from scalerl.runtime.roles import ServiceContext, connect_bus, ensure_job_topics, input_lag, retry_io
from scalerl.runtime.trainer import TrainerHost
from scalerl.store import open_store
from scalerl.store.checkpoints import download_latest_checkpoint, upload_checkpoint
from scalerl.store.fencing import check_epoch, take_epoch
from scalerl.store.run_files import PREFIX as RUN_PREFIX
from scalerl.store.run_files import upload_run_files
from scalerl.telemetry.steps import StepTimes
from scalerl.weightsync.reader import highest_version

log = logging.getLogger(__name__)

RUN_FILES = ("metrics.jsonl", "train.jsonl")


class LearnerService(ScoredIntake, TrainerHost):
    def __init__(self, ctx: ServiceContext, *, show_progress: bool = False) -> None:
        super().__init__(ctx.spec, ctx.out_dir, resume=True, show_progress=show_progress)
        if ctx.spec.off_policy.mode != "pipeline":
            raise ValueError("off_policy.mode: the distributed learner runs PipelineRL-k ('pipeline'); "
                             f"got {ctx.spec.off_policy.mode!r} (run PPO-off-policy-k embedded)")
        self.ctx = ctx
        self.topics = TopicNames.of(ctx.spec)
        self._init_intake()
        self.finished = False
        self.last_step: dict[str, Any] = {}
        self.last_eval: dict[str, Any] = {}
        self.summary: dict[str, Any] | None = None
        self.steps = StepTimes()  # optimizer steps (the step-time histogram)
        self.versions_published = 0

    # -- assembly ----------------------------------------------------------------------------------
    def build(self) -> None:
        """Bus, store and checkpoint first (each retried on its own), then the learner: its start is a
        collective over the torchrun ranks, so it must not be redone by a retry."""
        spec = self.spec
        self._setup_common()
        self.store = open_store(self.ctx.store_url)
        self.bus: Bus = connect_bus(self.ctx.bus_url)
        retry_io(lambda: ensure_job_topics(self.bus, spec), what="create the job's topics")
        self.dead = DeadLetters(self.bus, self.topics.dlq, self.topics.group("learner"))
        self.scored = retry_io(lambda: self.bus.consumer([self.topics.scored], self.topics.group("learner"),
                                                         sole_owner=True), what="join the learner group")
        self.dead_letters = BackgroundConsumer(retry_io(lambda: self.bus.reader(
            [self.topics.dlq], role=self.topics.group("learner")), what="read the dead letters"), name="dlq-reader")
        ckpt = retry_io(lambda: download_latest_checkpoint(self.store, self.out.checkpoints), what="fetch checkpoint")
        if ckpt is None:  # a fresh timeline: from the beginning of `scored`, never a dead learner's commits
            for name in RUN_FILES:
                (self.out.root / name).unlink(missing_ok=True)
            start = retry_io(lambda: self.bus.partitions(self.topics.scored), what="read partitions")
            self.scored.seek({f"{self.topics.scored}:{p}": 0 for p in start})
        state = load_trainer_state(ckpt) if ckpt is not None else None
        self.epoch = retry_io(lambda: take_epoch(self.store), what="take the learner epoch")  # (bus/fencing)
        # versions never repeat: number past the highest ever uploaded or announced (scalerl.learner.lineage)
        high = retry_io(lambda: highest_version(self.store), what="read policy versions")
        learner_state = state["learner"] if state is not None else None
        lineage = resume_lineage(int(learner_state["version"]) if learner_state else 0,
                                 lineage_of(learner_state) if learner_state else None, high)
        if lineage.lost:
            log.warning("policy versions %s are a lost lineage: their rollouts are dropped as stale",
                        ", ".join(f"{lo}..{hi}" for lo, hi in lineage.lost))
        model, tok = self._load_policy(ckpt)
        self._setup_learner(model, tok, learner_state, lineage)
        if ckpt is not None and state is not None:
            self._restore(ckpt, state)
        retry_io(self._publish, what="publish policy")
        if ckpt is None:  # every later start is a restore (see the module docstring)
            retry_io(self._checkpoint, what="step-0 checkpoint")

    def _restore(self, ckpt: Path, state: dict[str, Any]) -> None:
        """Everything but the learner's own state (restored by `_setup_learner`)."""
        self.eval_engine.set_rng_state(state["eval_rng"])
        self._restore_compute(state)
        self.decided = DecidedSet.from_state(state)
        self.decided_ahead = {(str(k), int(o)) for k, o in state.get("decided_ahead", [])}
        # (a checkpoint from before the count lists the duplicates below its positions)
        self.duplicates_settled = int(state.get("duplicates_settled", len(state.get("duplicate_positions", []))))
        self.pending_drops = [(str(g), str(r)) for g, r in state.get("pending_drops", [])]
        if "consumed_ids" in state:  # (an older checkpoint counted its pending drops apart)
            for gid, _ in self.pending_drops:
                self.decided.add(0, gid)
        self.scored.seek(state["bus_positions"])
        set_rng_state(state["rng"])
        for name in RUN_FILES:  # the run files as of the checkpoint (none yet: none): later records are redone
            src, dst = ckpt / "run" / name, self.out.root / name
            if src.is_file():
                shutil.copyfile(src, dst)
            else:
                dst.unlink(missing_ok=True)
        log.info("learner resumed from %s at step %d", ckpt.name, self.learner.version)

    # -- pieces ------------------------------------------------------------------------------------
    def _policy_headers(self) -> dict[str, str]:
        return {**super()._policy_headers(), "learner_consumed": str(self._consumed()),
                EPOCH_HEADER: str(self.epoch)}

    def _publish(self) -> None:
        check_epoch(self.store, self.epoch)  # a fenced learner uploads nothing more (scalerl.bus.fencing)
        super()._publish()
        self.versions_published += 1
        self.announced_consumed, self.announced_at = self._consumed(), time.monotonic()

    def _guarded_step(self, records: list[Record]) -> dict[str, float] | None:
        """The optimizer step on `records`, or None when it raised: then each group is probed alone, those
        that raise are dead-lettered (all of them when none raises alone), the rest go back to the buffer."""
        try:
            return self.ranks.step([r.value for r in records])
        except Exception as exc:
            if self.learner.world_size > 1:
                raise
            log.exception("step %d raised; probing its %d groups one by one", self.learner.version + 1, len(records))
            failing: dict[int, str] = {}
            for i, rec in enumerate(records):
                try:
                    self.learner.probe(rec.value)
                except Exception as alone:
                    failing[i] = f"step_failed: the learner raised {alone!r} on this group"
            if not failing:
                failing = {i: f"step_failed: the batch raised {exc!r} (no group raised alone)"
                           for i in range(len(records))}
            for i, reason in failing.items():
                self._dead_letter(records[i], reason)
            retry_io(self.bus.flush, what="flush dead letters")
            self.buffer = [r for i, r in enumerate(records) if i not in failing] + self.buffer
            return None

    def _checkpoint(self) -> None:
        safe = self.safe_positions()
        self.counters["duplicates"] = self.duplicates_settled = self._count_duplicates(safe)
        self.duplicate_positions = [p for p in self.duplicate_positions if p[1] >= safe.get(p[0], 0)]
        self.decided_positions = [p for p in self.decided_positions if p[1] >= safe.get(p[0], 0)]
        self.decided_ahead = {p for p in self.decided_ahead if p[1] >= safe.get(p[0], 0)}
        weights = self.ranks.full_state_dict() if self.learner.sharded else None  # (collectives, every rank)
        state = {"learner": self.ranks.state_dict(), "eval_rng": self.eval_engine.rng_state(),
                 "train_s": self.clock.now_s(), "counters": dict(self.counters),
                 "devices": self.ledger.state(self.clock.now_s()), "decided": self.decided.state_dict(),
                 "bus_positions": safe,
                 "duplicates_settled": self.duplicates_settled,
                 "decided_ahead": sorted(self.decided_ahead | set(self.decided_positions)),  # (≥ safe: pruned above)
                 "pending_drops": list(self.pending_drops)}
        model = self.learner.model
        if weights is not None and self.eval_copy is not None:  # save the unsharded copy, not the FSDP module
            self.eval_copy.load_state_dict(weights)
            model, weights = self.eval_copy, None
        check_epoch(self.store, self.epoch)
        folder = save_checkpoint(self.out.checkpoints, self.learner.version, model, self.tokenizer, state,
                                 keep=self.spec.train.keep_checkpoints, state_dict=weights)
        (folder / "run").mkdir(exist_ok=True)
        for name in RUN_FILES:
            if (self.out.root / name).is_file():
                shutil.copyfile(self.out.root / name, folder / "run" / name)
        upload_checkpoint(self.store, folder, keep=self.spec.train.keep_checkpoints)
        self._announce("checkpoint", self._compute_fields())

    def _announce(self, kind: str, values: dict[str, Any]) -> None:
        """A MetricRecord on the job's metrics topic (the operator's status source)."""
        nums = {k: float(v) for k, v in values.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        self.bus.publish(self.topics.metrics, MetricRecord(kind, self.learner.version, nums), key="learner")

    def status(self) -> dict[str, Any]:
        step = getattr(getattr(self, "learner", None), "version", 0)
        last = self.last_step
        return {"role": "learner", "id": self.ctx.role_id, "ready": self.ready(), "step": step,
                "policy_version": self.learner.policy_version if self.ready() else 0,
                "groups_consumed": self.decided.count, "decided_window": self.decided.window,
                "groups_dropped_stale": self.counters["dropped_stale"],
                "dead_lettered": self._dead_lettered_counts(),
                "tokens_trained": self.counters["train_tokens"], "versions_published": self.versions_published,
                # the oldest data of the last step, as the operator's PolicyLagExceeded condition reads it
                "staleness_versions": float(last.get("staleness_max") or 0.0),
                "step_seconds": float(last.get("step_time_s") or 0.0),
                "newest_version_seen": self.newest_version_seen, "buffered_groups": len(self.buffer),
                "compute_device_hours": self.compute_device_hours(), "compute_flops": self.compute_flops(),
                "devices": self.ledger.devices, **self._progress(), **self.broadcast_counters(),
                "finished": self.finished,
                "lag": input_lag(self.bus, self.topics.group("learner"), self.topics.scored)
                if hasattr(self, "bus") and not self.finished else {}}  # (finished: the bus is closed)

    def _dead_lettered_counts(self) -> dict[str, int]:
        """By reason code: what this learner dead-lettered (since it started), undecodable records included."""
        counts = dict(self.dead.counts) if hasattr(self, "dead") else {}
        undecodable = int(getattr(getattr(self, "scored", None), "undecodable", 0))
        return {**counts, "undecodable": undecodable} if undecodable else counts

    def _progress(self) -> dict[str, float]:
        """Last held-out pass rate, the online fit (A with its interval, B, C_mid, R0), the forecast at the end
        of the budget and the bound k."""
        out: dict[str, float] = {"staleness_bound": float(self.spec.off_policy.k)}
        if self.last_eval:
            out["eval_pass_rate"] = float(self.last_eval["pass_rate"])
        fit = self.last_fit or {}
        for key in ("A", "B", "C_mid", "R0"):
            if isinstance(fit.get(key), int | float):
                out[f"fit_{key}"] = float(fit[key])
        interval = (fit.get("ci") or {}).get("A")
        if interval and all(isinstance(v, int | float) for v in interval):
            out["fit_A_low"], out["fit_A_high"] = float(interval[0]), float(interval[1])
        for key in ("identified", "pass_rate", "low", "high"):  # the forecast of the budget's end
            if isinstance(fit.get(f"budget_{key}"), int | float):
                out[f"forecast_budget_{key}"] = float(fit[f"budget_{key}"])
        return out

    def _stop_fields(self) -> dict[str, float]:
        """The forecast stop of a `done` record (numbers only): stop_reason (`STOP_REASON_CODES`) and the
        numbers it rested on, prefixed stop_; empty when the run ran its steps."""
        s = self.stopped_early
        if s is None:
            return {}
        nums = {f"stop_{k}": float(v) for k, v in s.items()
                if isinstance(v, int | float) and not isinstance(v, bool)}
        return {**nums, "stop_reason": STOP_REASON_CODES[s["reason"]]}

    def ready(self) -> bool:
        return hasattr(self, "learner")

    # -- the loop ----------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> dict[str, Any] | None:
        if not hasattr(self, "learner"):
            self.build()
        spec = self.spec
        # resumed: the newest evaluation so far (a learner restarted after its last step re-evaluates nothing)
        first, last = self._first_eval()
        self.last_eval = last
        if self.learner.version >= spec.train.steps:
            log.info("learner: already finished at step %d (restarted after the end); announcing it again",
                     self.learner.version)
        bar = self.progress.bar("RL", spec.train.steps, unit="step", initial=self.learner.version)
        self.clock.start()
        while not self.stop_due() and not stop.is_set():
            t_wait = time.perf_counter()
            records = self._take_groups(spec.train.prompts_per_step, stop)
            if records is None:
                break
            self._wait_for_generators(len(records), stop)
            waited_s = time.perf_counter() - t_wait
            stats = self._guarded_step(records)
            if stats is None:  # groups were dead-lettered; the others wait in the buffer for the next batch
                continue
            groups = [r.value for r in records]
            drops, self.pending_drops = self.pending_drops, []
            for g in groups:
                self.decided.add(g.rollout.task.seq, g.group_id)
            stats["batch/dropped_stale"] = stats.get("batch/dropped_stale", 0.0) + len(drops)
            stats["batch/dropped_lost_lineage"] = (stats.get("batch/dropped_lost_lineage", 0.0)
                                                   + sum(why == "lost" for _, why in drops))
            self._count(stats)
            crash_point("learner.step")
            safe = self.safe_positions()
            retry_io(partial(self.scored.commit, safe), what="commit scored offsets")  # (for lag metrics)
            retry_io(self._publish, what="publish policy")
            step_s = float(stats.get("time/step_s", 0.0))
            self.steps.observe(step_s)
            rec = self._log_step(stats, bar, {"group_ids": [g.group_id for g in groups],
                                              "dropped_group_ids": [gid for gid, _ in drops],
                                              "duplicates": self.duplicates_settled + len(self.duplicate_positions),
                                              # generators' starvation signal for the autoscaler
                                              "batch_wait_s": waited_s,
                                              "batch_wait_frac": waited_s / max(waited_s + step_s, 1e-9)})
            retry_io(partial(self._announce, "train", rec), what="metrics record")
            self.last_step = rec
            rollouts = len(groups) * spec.generation.group_size  # completions trained on, over the step's wall time
            log.info("%s", step_line(rec, total_steps=spec.train.steps, bound_k=spec.off_policy.k,
                                     rollouts_per_s=rollouts / max(waited_s + step_s, 1e-9)))
            if self._eval_due():
                last = self.last_eval = self._evaluate_paused_clock()
                retry_io(partial(self._announce, "eval", last), what="metrics record")
                if self.last_fit:  # the run's fit as computed once (A, B, C_mid, A_low/A_high, R0)
                    retry_io(partial(self._announce, "fit", {**self.last_fit, "compute": last["compute"]}),
                             what="metrics record")
            if self._checkpoint_due():
                retry_io(self._checkpoint, what="checkpoint")
        self.clock.stop()
        bar.close()
        if self.learner.version < spec.train.steps and self.stopped_early is None:  # SIGTERM: keep the work
            self._checkpoint()
            log.info("learner stopped at step %d; checkpoint saved", self.learner.version)
            self.close()
            return None
        if last["step"] != self.learner.version:
            last = self._evaluate()
            self._checkpoint()
        elif self.stopped_early is not None:
            self._checkpoint()  # stopped on the forecast right after an eval: keep this step's weights
        final = self.safe_positions()
        self.counters["duplicates"] = self._count_duplicates(final)
        self.summary = self._summary(first, last, final_positions=final, distributed=True)
        check_epoch(self.store, self.epoch)  # (a fenced learner uploads nothing)
        uploaded = retry_io(partial(upload_run_files, self.store, self.out.root), what="upload the run files")
        log.info("run files uploaded to %s: %s", self.store.uri(f"{RUN_PREFIX}/"), ", ".join(uploaded))
        # after the upload: the operator reads `done` as "the run's files are in the store" (status.report)
        self._announce("done", {"final_pass_rate": last["pass_rate"], "run_files": len(uploaded),
                                "report_html": float("report.html" in uploaded), **self._stop_fields()})
        self.bus.flush()
        self.finished = True
        self.close()
        return self.summary

    def close(self) -> None:
        self.ranks.stop(finished=self.finished)  # release the other ranks (after the last checkpoint's collectives)
        self.close_broadcast()
        self.scored.close()
        if self.dead_letters is not None:
            self.dead_letters.close()
        self.bus.flush()
        self.bus.close()

