"""Every role in one process: the quickstart and the reference behaviour of the distributed system.

Two off-policy modes (ScaleRL §2.1), both over the same bus/store interfaces as distributed mode:

- `pipeline` (PipelineRL-k): a generator thread and a verifier thread stream rollouts while the main
  thread (curriculum + learner) trains; each new policy version is published to the store and
  announced on `policy`, and the generator swaps it in between decode steps. The learner waits while it
  is more than k versions ahead of the generator and drops (and counts) groups older than k versions.
- `ppo` (PPO-off-policy-k): phases. Generate k·B prompts with the current weights, then take k
  optimizer steps of B prompts each, then publish the weights.

Compute is counted in device-hours: devices × wall hours of training (evaluation excluded).
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
from scalerl.bus.dlq import dead_letter
from scalerl.config import JobSpec, dump_spec
from scalerl.curriculum.curriculum import Curriculum, CurriculumExhausted
from scalerl.evaluation import evaluate_mean_at_k
from scalerl.generator.engine import SamplingParams
from scalerl.generator.role import GeneratorRole, length_control
from scalerl.generator.torch_engine import TorchEngine
from scalerl.learner.checkpoint import latest_checkpoint, load_trainer_state, save_checkpoint, set_rng_state
from scalerl.learner.learner import Learner
from scalerl.messages import ScoredGroup
from scalerl.model.factory import load_model_and_tokenizer, resolve_device
from scalerl.runtime.outputs import RunOutputs
from scalerl.runtime.progress import Progress
from scalerl.runtime.setup import configure_threads, initial_model, make_task, make_verifier, seed_everything
from scalerl.store import open_store
from scalerl.store.weights import publish_weights
from scalerl.verifier.role import VerifierRole

log = logging.getLogger(__name__)


class TrainClock:
    """Wall seconds spent training (pausable around evaluation)."""

    def __init__(self, elapsed_s: float = 0.0) -> None:
        self.elapsed_s = elapsed_s
        self._since: float | None = None

    def start(self) -> None:
        if self._since is None:
            self._since = time.perf_counter()

    def stop(self) -> None:
        if self._since is not None:
            self.elapsed_s += time.perf_counter() - self._since
            self._since = None

    def now_s(self) -> float:
        return self.elapsed_s + (time.perf_counter() - self._since if self._since is not None else 0.0)


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


class EmbeddedRun:
    def __init__(self, spec: JobSpec, out_dir: Path, *, resume: bool = False, show_progress: bool = True) -> None:
        self.spec = spec
        self.out = RunOutputs(out_dir)
        self.resume = resume
        self.progress = Progress(enabled=show_progress)
        self.topics = TopicNames(spec.name)
        self.last_fit: dict[str, Any] | None = None

    # -- assembly ----------------------------------------------------------------------------------
    def _build(self) -> None:
        spec = self.spec
        seed_everything(spec.seed)
        self.threads = configure_threads(spec)
        self.task = make_task(spec)
        self.train_problems = self.task.problems("train")
        self.eval_problems = self.task.problems("eval")
        self.verifier = make_verifier(spec, self.task)
        self.out.root.mkdir(parents=True, exist_ok=True)
        (self.out.root / "spec.yaml").write_text(dump_spec(spec))
        ckpt = latest_checkpoint(self.out.checkpoints) if self.resume else None
        if self.resume and ckpt is None:
            log.warning("--resume: no checkpoint in %s, starting fresh", self.out.checkpoints)
        self.init_info: dict[str, Any] = {}
        if ckpt is not None:
            model, tok = load_model_and_tokenizer(spec.model, spec.seed, ckpt)
            model.to(resolve_device(spec.model.device))
        else:
            bar = self.progress.bar("SFT", spec.sft.steps, unit="step")
            model, tok, self.init_info = initial_model(
                spec, self.task, self.out.root, on_sft_step=lambda s, loss: bar.update(1, loss=f"{loss:.3f}"))
            bar.close()
        self.tokenizer = tok
        self.learner = Learner(spec, model, pad_id=tok.pad_token_id)
        self.gen_model = copy.deepcopy(model).eval()
        self.bus: Bus = open_bus(spec.runtime.bus)
        self.bus.ensure_topics(self.topics.all())
        self.store = open_store(spec.runtime.store or str(self.out.root / "store"))
        engine = TorchEngine(self.gen_model, tok, fp32_head=spec.model.fp32_lm_head, seed=spec.seed + 1)
        self.generator = GeneratorRole(spec, engine, tok, self.bus, self.store, self.topics)
        self.verifier_role = VerifierRole(self.verifier, self.bus, self.topics)
        self.eval_engine = TorchEngine(model, tok, fp32_head=spec.model.fp32_lm_head, seed=spec.seed + 2)
        k_factor = spec.off_policy.k if spec.off_policy.mode == "ppo" else 1
        self.curriculum = Curriculum(
            self.train_problems, task_name=spec.task.kind, group_size=spec.generation.group_size, seed=spec.seed,
            max_inflight=max(spec.max_inflight_prompts, k_factor * spec.train.prompts_per_step),
            npr=spec.curriculum.no_positive_resampling, npr_threshold=spec.curriculum.npr_threshold,
            limit_prompts=spec.curriculum.limit_prompts)
        self.scored: Consumer = self.bus.consumer([self.topics.scored], "learner")
        self.clock = TrainClock()
        self.counters = {"gen_tokens": 0, "train_tokens": 0, "dropped_stale": 0, "duplicates": 0}
        self.buffer: list[ScoredGroup] = []
        if ckpt is not None:
            self._restore(ckpt)
        self._publish()

    def _restore(self, ckpt: Path) -> None:
        state = load_trainer_state(ckpt)
        self.learner.load_state_dict(state["learner"])
        self.curriculum.load_state_dict(state["curriculum"])
        self.generator.engine.set_rng_state(state["generator_rng"])  # type: ignore[attr-defined]
        self.eval_engine.set_rng_state(state["eval_rng"])
        self.clock = TrainClock(state["train_s"])
        self.counters.update(state["counters"])
        self.generator.engine.load_weights(self.learner.full_state_dict(), self.learner.version)
        set_rng_state(state["rng"])
        self.out.truncate_after(self.learner.version)
        log.info("resumed from %s at step %d", ckpt, self.learner.version)

    # -- pieces of the loop ----------------------------------------------------------------------------
    def _publish(self) -> None:
        pv = publish_weights(self.store, self.learner.version, self.learner.full_state_dict())
        self.bus.publish(self.topics.policy, pv, key="policy")
        self.bus.flush()

    def _top_up(self) -> None:
        for task in self.curriculum.next_tasks():
            self.bus.publish(self.topics.prompts, task, key=task.prompt_id,
                             headers={"policy_version": str(self.learner.version)})
        self.bus.flush()

    def _take_groups(self, n: int, wait: Callable[[], None]) -> list[ScoredGroup]:
        """The next n scored groups; duplicates of consumed groups are dropped, never double-counted."""
        while len(self.buffer) < n:
            self._check_workers()
            recs = self.scored.poll(timeout_s=0.02)
            for rec in recs:
                g = rec.value
                if not isinstance(g, ScoredGroup):
                    dead_letter(self.bus, self.topics.dlq, rec, f"expected ScoredGroup, got {type(g).__name__}")
                    continue
                if Curriculum.key(g.rollout.task) not in self.curriculum.pending:
                    self.counters["duplicates"] += 1
                    continue
                self.buffer.append(g)
            if not recs:
                wait()
        taken, self.buffer = self.buffer[:n], self.buffer[n:]
        return taken

    def _train_step(self, groups: list[ScoredGroup]) -> dict[str, float]:
        stats = self.learner.step(groups)
        self.curriculum.consumed(groups)
        self.scored.commit()
        self.counters["gen_tokens"] += int(stats.get("tokens/gen", 0))
        self.counters["train_tokens"] += int(stats.get("tokens/train", 0))
        self.counters["dropped_stale"] += int(stats.get("batch/dropped_stale", 0))
        return stats

    def compute_device_hours(self) -> float:
        return self.spec.runtime.devices * self.clock.now_s() / 3600.0

    def _log_step(self, stats: dict[str, float], bar: Any) -> None:
        rec = {"kind": "step", "step": self.learner.version, "compute": self.compute_device_hours(),
               "loss": stats.get("loss/value"), "effective_batch": stats.get("batch/effective"),
               "dropped_stale": stats.get("batch/dropped_stale"),
               "dropped_zero_variance": stats.get("batch/dropped_zero_variance"),
               "truncation_rate": stats.get("rollout/truncation_rate"),
               "interruption_rate": stats.get("rollout/interruption_rate"),
               "entropy": stats.get("policy/entropy"), "clip_frac": stats.get("loss/clip_frac"),
               "ratio_mean": stats.get("loss/ratio_mean"), "ratio_max": stats.get("loss/ratio_max"),
               "staleness_mean": stats.get("offpolicy/age_mean"), "staleness_max": stats.get("offpolicy/age_max"),
               "train_pass_rate": stats.get("rollout/pass_rate"), "lr": stats.get("optim/lr"),
               "step_time_s": stats.get("time/step_s"), "gen_tokens": self.counters["gen_tokens"],
               "train_tokens": self.counters["train_tokens"], "retired_prompts": self.curriculum.retired_count,
               "epoch": self.curriculum.epoch}
        self.out.train_record(rec)
        bar.update(1, loss=f"{rec['loss'] or 0:.3f}", train_pass=f"{rec['train_pass_rate'] or 0:.2f}",
                   stale=f"{rec['staleness_mean'] or 0:.1f}")

    def _evaluate(self) -> dict[str, Any]:
        spec = self.spec
        t0 = time.perf_counter()
        bar = self.progress.bar(f"eval@{self.learner.version}", len(self.eval_problems), unit="prompt", leave=False)
        self.learner.model.eval()
        res = evaluate_mean_at_k(
            self.eval_engine, self.tokenizer, self.eval_problems, self.verifier, k=spec.eval.samples_per_prompt,
            sampling=SamplingParams(spec.eval.temperature, spec.generation.top_p),
            length=length_control(spec, self.tokenizer), prompts_per_batch=spec.generation.prompts_per_batch,
            on_batch=bar.update)
        bar.close()
        rec = {"step": self.learner.version, "compute": self.compute_device_hours(),
               "gen_tokens": self.counters["gen_tokens"], "train_tokens": self.counters["train_tokens"],
               "pass_rate": res.pass_rate, "k": res.k, "n_prompts": res.n_prompts,
               "eval_truncation_rate": res.truncation_rate, "wall_s": time.perf_counter() - t0,
               "prompt_pass_rates": res.prompt_pass_rates}
        self.out.eval_record(rec)
        self._refit()
        return rec

    def _refit(self) -> None:
        """Refit the scaling curve on the evals so far; the fit goes to train.jsonl."""
        try:
            from scalerl.report import fit_run_metrics
        except ImportError:  # pragma: no cover - report package is part of the install
            return
        fit = fit_run_metrics(self.out.read(self.out.metrics_path))
        if fit is not None:
            self.out.train_record({"kind": "fit", "step": self.learner.version,
                                   "compute": self.compute_device_hours(), **fit})
            self.last_fit = fit

    def _checkpoint(self) -> None:
        state = {"learner": self.learner.state_dict(), "curriculum": self.curriculum.state_dict(),
                 "generator_rng": self.generator.engine.rng_state(),  # type: ignore[attr-defined]
                 "eval_rng": self.eval_engine.rng_state(), "train_s": self.clock.now_s(),
                 "counters": dict(self.counters), "bus_positions": self.scored.positions()}
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
        first = self._evaluate() if self.learner.version == 0 else self.out.read(self.out.metrics_path)[0]
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
        if last["step"] != self.learner.version:
            last = self._evaluate()
            self._checkpoint()
        return self._finish(first, last)

    def _eval_due(self) -> bool:
        v = self.learner.version
        return v % self.spec.eval.every_steps == 0 or v == self.spec.train.steps

    def _maybe_eval_and_checkpoint(self, phase_end: bool = True) -> dict[str, Any] | None:
        v = self.learner.version
        rec = None
        if self._eval_due():
            self.clock.stop()
            rec = self._evaluate()
            self.clock.start()
        if phase_end and (v % self.spec.train.checkpoint_every == 0 or v == self.spec.train.steps):
            self._checkpoint()
        return rec

    def _run_pipeline(self, bar: Any) -> dict[str, Any] | None:
        spec = self.spec
        paused = threading.Event()
        self.workers = [
            _Worker("generator", lambda: self.generator.run_once(timeout_s=0.02), paused),
            _Worker("verifier", lambda: self.verifier_role.run_once(timeout_s=0.02), paused),
        ]
        self._top_up()
        self.clock.start()
        for w in self.workers:
            w.start()
        last = None
        k = spec.off_policy.k
        while self.learner.version < spec.train.steps:
            groups = self._take_groups(spec.train.prompts_per_step, wait=lambda: time.sleep(0.002))
            # PipelineRL-k: do not get more than k versions ahead of the generator.
            while self.learner.version + 1 - self.generator.engine.version > k:
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
        while self.learner.version < spec.train.steps:
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
            self._publish()
        self.clock.stop()
        return last

    def _stop_workers(self) -> None:
        for w in getattr(self, "workers", []):
            w.stop_event.set()
        for w in getattr(self, "workers", []):
            w.join(timeout=30)

    def _finish(self, first: dict[str, Any], last: dict[str, Any]) -> dict[str, Any]:
        summary = {"name": self.spec.name, "initial_pass_rate": first["pass_rate"],
                   "final_pass_rate": last["pass_rate"], "steps": self.learner.version,
                   "compute": self.compute_device_hours(), "compute_unit": "device-hours",
                   "train_wall_s": self.clock.now_s(), "gen_tokens": self.counters["gen_tokens"],
                   "train_tokens": self.counters["train_tokens"], "dropped_stale": self.counters["dropped_stale"],
                   "duplicates_dropped": self.counters["duplicates"], "mode": self.spec.off_policy.mode,
                   "k": self.spec.off_policy.k, "threads": self.threads, "in_flight_swaps":
                   self.generator.engine.swaps_in_flight,  # type: ignore[attr-defined]
                   "fit": self.last_fit, **self.init_info}
        for key in ("A", "B", "C_mid"):
            summary[key] = (self.last_fit or {}).get(key)
        self.out.write_summary(summary)
        try:
            from scalerl.report import write_report

            summary["report"] = str(write_report(self.out.root))
        except Exception as exc:  # the run's numbers are already on disk; a plot failure is not fatal
            log.warning("report failed: %r", exc)
        return summary
