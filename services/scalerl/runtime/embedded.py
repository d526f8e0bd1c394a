"""Every role in one process: the quickstart and the reference behaviour of the distributed system.

Two off-policy modes (ScaleRL §2.1), both over the same bus/store interfaces as distributed mode:

- `pipeline` (PipelineRL-k): `off_policy.embedded_generators` generator threads (each with its own copy of
  the weights, sharing one prompt consumer) and a verifier thread stream rollouts while the main thread
  (curriculum + learner) trains; each new policy version is published to the store and announced on
  `policy`, and every generator swaps it in between decode steps. Up to k × B prompts are in flight (the
  curriculum's default depth), so generation runs up to k steps ahead. The learner waits while it is
  more than k versions ahead of the slowest generator and drops (and counts) groups holding a token
  older than k versions. With k = 1 generation and training alternate: every trained token is on-policy.
- `ppo` (PPO-off-policy-k): phases. Generate k·B prompts with the current weights, then take k
  optimizer steps of B prompts each, then publish the weights.

Compute is counted in device-hours — `runtime.devices` (the one process's devices; a CPU machine is 1)
× wall hours of training, evaluation excluded — and in FLOPs (`compute_flops`, `scalerl.scaling.compute`).
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scalerl.bus import TopicNames, open_bus
from scalerl.bus.base import Bus, Consumer
from scalerl.bus.dlq import DeadLetters
from scalerl.bus.validate import reason_for
from scalerl.config import JobSpec
from scalerl.curriculum.curriculum import Curriculum, CurriculumExhausted
from scalerl.generator.factory import make_engine
from scalerl.generator.role import GeneratorRole
from scalerl.learner.checkpoint import latest_checkpoint, load_trainer_state, save_checkpoint, set_rng_state
from scalerl.messages import ScoredGroup
from scalerl.runtime.setup import make_curriculum
from scalerl.runtime.trainer import TrainerHost
from scalerl.store import open_store
from scalerl.telemetry.hops import hop
from scalerl.verifier.role import VerifierRole

log = logging.getLogger(__name__)


class _Worker(threading.Thread):
    """Runs `body()` until stopped; an exception is kept and re-raised in the main thread."""

    def __init__(self, name: str, body: Callable[[], Any], paused: threading.Event) -> None:
        super().__init__(name=name, daemon=True)
        self.body = body
        self.paused = paused
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.idle = threading.Event()

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                if self.paused.is_set():
                    self.idle.set()
                    time.sleep(0.005)
                    continue
                self.idle.clear()
                self.body()
        except BaseException as exc:  # surfaced by EmbeddedRun._check_workers
            self.error = exc
        finally:
            self.idle.set()


class EmbeddedRun(TrainerHost):
    def __init__(self, spec: JobSpec, out_dir: Path, *, resume: bool = False, show_progress: bool = True) -> None:
        super().__init__(spec, out_dir, resume=resume, show_progress=show_progress)
        self.topics = TopicNames.of(spec)

    # -- assembly ----------------------------------------------------------------------------------
    def _build(self) -> None:
        spec = self.spec
        self._setup_common()
        ckpt = latest_checkpoint(self.out.checkpoints) if self.resume else None
        if self.resume and ckpt is None:
            log.warning("--resume: no checkpoint in %s, starting fresh", self.out.checkpoints)
        model, tok = self._load_policy(ckpt)
        self._setup_learner(model, tok)
        self.bus: Bus = open_bus(spec.runtime.bus)
        self.bus.ensure_topics(self.topics.all())
        self.store = open_store(spec.runtime.store or str(self.out.root / "store"))
        self.generators = self._make_generators(model, tok)
        self.generator = self.generators[0]
        self.verifier_role = VerifierRole(self.verifier, self.bus, self.topics, self.limits)
        self.dead = DeadLetters(self.bus, self.topics.dlq, "learner")
        self.curriculum = make_curriculum(
            spec, self.train_problems, steps_in_flight=spec.off_policy.k if spec.off_policy.mode == "ppo" else 1)
        self.scored: Consumer = self.bus.consumer([self.topics.scored], "learner")
        self.buffer: list[ScoredGroup] = []
        if ckpt is not None:
            self._restore(ckpt)
        self._publish()

    def _make_generators(self, model: Any, tok: Any) -> list[GeneratorRole]:
        """One generator (pipeline: `off_policy.embedded_generators` of them, sharing a prompt consumer), each sampling
        from its own copy of the weights with its own seed."""
        spec = self.spec
        default_workers = 2 if spec.generation.engine == "torch" else 1
        n = (spec.off_policy.embedded_generators or default_workers) if spec.off_policy.mode == "pipeline" else 1
        shared = self.bus.consumer([self.topics.prompts], "generators")
        out = []
        for i in range(n):
            engine = make_engine(spec, copy.deepcopy(model).eval(), tok, seed=spec.seed + 1 + 1000 * i,
                                 workdir=self.out.root / f"generator-init-{i}")
            out.append(GeneratorRole(spec, engine, tok, self.bus, self.store, self.topics, self.limits,
                                     generator_id=f"generator-{i}", prompts=shared))
        return out

    def _restore(self, ckpt: Path) -> None:
        state = load_trainer_state(ckpt)
        self.learner.load_state_dict(state["learner"])
        self.curriculum.load_state_dict(state["curriculum"])
        rngs = state.get("generator_rngs") or [state["generator_rng"]]  # older checkpoints: one generator
        for gen, rng in zip(self.generators, rngs, strict=False):
            gen.engine.set_rng_state(rng)  # type: ignore[attr-defined]
        self.eval_engine.set_rng_state(state["eval_rng"])
        self._restore_compute(state)
        for gen in self.generators:
            gen.engine.load_weights(self.learner.full_state_dict(), self.learner.version)
        set_rng_state(state["rng"])
        self.out.truncate_after(self.learner.version)
        log.info("resumed from %s at step %d", ckpt, self.learner.version)

    # -- pieces of the loop ----------------------------------------------------------------------------
    def _top_up(self) -> None:
        for task in self.curriculum.next_tasks():
            with hop("curriculum.issue", {"policy_version": str(self.learner.version)}, root=True) as headers:
                self.bus.publish(self.topics.prompts, task, key=task.prompt_id, headers=headers)
        self.bus.flush()

    def _take_groups(self, n: int, wait: Callable[[], None]) -> list[ScoredGroup]:
        """The next n scored groups; duplicates of consumed groups are dropped, never double-counted."""
        while len(self.buffer) < n:
            self._check_workers()
            recs = self.scored.poll(timeout_s=0.02)
            for rec in recs:
                g = rec.value
                reason = reason_for(g, ScoredGroup, self.limits, self.learner.version)
                if reason is not None:
                    self.dead.send(rec, reason)
                    self.counters["dead_lettered"] += 1
                    if isinstance(g, ScoredGroup):  # its in-flight slot is free again
                        self.curriculum.pending.pop(Curriculum.key(g.rollout.task), None)
                    continue
                if Curriculum.key(g.rollout.task) not in self.curriculum.pending:
                    self.counters["duplicates"] += 1
                    continue
                with hop("learner.consume", rec.headers):
                    self.buffer.append(g)
            if not recs:
                wait()
        taken, self.buffer = self.buffer[:n], self.buffer[n:]
        return taken

    def _train_step(self, groups: list[ScoredGroup]) -> dict[str, float]:
        stats = self.learner.step(groups)
        self.curriculum.consumed(groups)
        self.scored.commit()
        self._count(stats)
        return stats

    def _log_step(self, stats: dict[str, float], bar: Any, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        return super()._log_step(stats, bar, {"retired_prompts": self.curriculum.retired_count,
                                              "epoch": self.curriculum.epoch, **(extra or {})})

    def _checkpoint(self) -> None:
        state = {"learner": self.learner.state_dict(), "curriculum": self.curriculum.state_dict(),
                 "generator_rngs": [g.engine.rng_state() for g in self.generators],  # type: ignore[attr-defined]
                 "eval_rng": self.eval_engine.rng_state(), "train_s": self.clock.now_s(),
                 "counters": dict(self.counters), "devices": self.ledger.state(self.clock.now_s()),
                 "bus_positions": self.scored.positions()}
        save_checkpoint(self.out.checkpoints, self.learner.version, self.learner.model, self.tokenizer, state,
                        keep=self.spec.train.keep_checkpoints)

    def _check_workers(self) -> None:
        for w in getattr(self, "workers", []):
            if w.error is not None:
                raise RuntimeError(f"{w.name} thread failed: {w.error!r}") from w.error

    # -- the loop ------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        self._build()
        spec = self.spec
        first, _ = self._first_eval()
        last = first
        bar = self.progress.bar("RL", spec.train.steps, unit="step", initial=self.learner.version)
        try:
            if spec.off_policy.mode == "pipeline":
                last = self._run_pipeline(bar) or last
            else:
                last = self._run_phases(bar) or last
        except CurriculumExhausted as exc:
            log.warning("%s; stopping early", exc)
        finally:
            bar.close()
            self._stop_workers()
            for gen in self.generators:
                gen.close()
            self.close_broadcast()
        if last["step"] != self.learner.version:
            last = self._evaluate()
            self._checkpoint()
        elif self.stopped_early is not None:
            self._checkpoint()  # stopped on the forecast right after an eval: keep this step's weights
        return self._finish(first, last)

    def _maybe_eval_and_checkpoint(self, phase_end: bool = True) -> dict[str, Any] | None:
        rec = self._evaluate_paused_clock() if self._eval_due() else None
        if phase_end and self._checkpoint_due():
            self._checkpoint()
        return rec

    def _run_pipeline(self, bar: Any) -> dict[str, Any] | None:
        spec = self.spec
        paused = threading.Event()
        self.workers = [_Worker(g.generator_id, _generate_loop(g), paused) for g in self.generators]
        self.workers.append(_Worker("verifier", lambda: self.verifier_role.run_once(timeout_s=0.02), paused))
        self._top_up()
        self.clock.start()
        for w in self.workers:
            w.start()
        last = None
        k = spec.off_policy.k
        while not self.stop_due():
            groups = self._take_groups(spec.train.prompts_per_step, wait=lambda: time.sleep(0.002))
            # PipelineRL-k: do not get more than k versions ahead of the slowest generator.
            while self.learner.version + 1 - min(g.engine.version for g in self.generators) > k:
                self._check_workers()
                time.sleep(0.002)
            stats = self._train_step(groups)
            self._publish()
            self._top_up()
            self._log_step(stats, bar)
            if self._eval_due():
                paused.set()
                for w in self.workers:
                    w.idle.wait()
            rec = self._maybe_eval_and_checkpoint()
            paused.clear()
            last = rec or last
        self.clock.stop()
        return last

    def _run_phases(self, bar: Any) -> dict[str, Any] | None:
        spec = self.spec
        k, B = spec.off_policy.k, spec.train.prompts_per_step
        last = None
        self.clock.start()
        while not self.stop_due():
            steps = min(k, spec.train.steps - self.learner.version)
            self.generator.sync_policy()
            self._top_up()

            def produce() -> None:  # generate + verify until the scored topic has what we need
                self.generator.run_once(in_flight=False)
                self.verifier_role.run_once()

            for i in range(steps):
                groups = self._take_groups(B, wait=produce)
                stats = self._train_step(groups)
                self._log_step(stats, bar)
                rec = self._maybe_eval_and_checkpoint(phase_end=(i == steps - 1))
                last = rec or last
                if self.stopped_early is not None:
                    break
            self._publish()
        self.clock.stop()
        return last

    def _stop_workers(self) -> None:
        for w in getattr(self, "workers", []):
            w.stop_event.set()
        for w in getattr(self, "workers", []):
            w.join(timeout=30)

    def _finish(self, first: dict[str, Any], last: dict[str, Any]) -> dict[str, Any]:
        swaps = sum(g.engine.swaps_in_flight for g in self.generators)  # type: ignore[attr-defined]
        return self._summary(first, last, in_flight_swaps=swaps, generator_workers=len(self.generators))


def _generate_loop(gen: GeneratorRole) -> Callable[[], Any]:
    return lambda: gen.run_once(timeout_s=0.02)
