"""The learner side of a run, shared by embedded mode (every role in one process) and the distributed
learner service: policy loading (checkpoint or SFT warm start), the `Learner`, the held-out evaluator,
the training clock, the run files (metrics.jsonl, train.jsonl, summary.json, report) and the curve fit.

Compute is counted on two axes (`scalerl.scaling.compute`): `compute`, device-hours — every device the job
holds (`runtime.devices`, or the pool file the launcher/operator keeps current: `runtime.devices` module)
integrated over training wall time, evaluation excluded, as the paper counts GPU-hours — and
`compute_flops`, FLOPs from the token counts and the parameter count.
"""

from __future__ import annotations

import copy
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalerl.bus import Bus, TopicNames
from scalerl.config import JobSpec, dump_spec
from scalerl.console import Progress
from scalerl.evaluation import evaluate_mean_at_k, paired_gain
from scalerl.faults.points import crash_point
from scalerl.generator.engine import SamplingParams
from scalerl.generator.episode import episode_runner
from scalerl.generator.role import length_control
from scalerl.generator.torch_engine import TorchEngine
from scalerl.learner.learner import world
from scalerl.learner.lineage import Lineage
from scalerl.model.factory import embedding_rows, load_model_and_tokenizer, resolve_device
from scalerl.parts import configure_threads, make_task, make_verifier, seed_everything
from scalerl.recipe import age_stats, merge_age_counts
from scalerl.runtime.devices import DeviceLedger, DevicePool, read_pool_file
from scalerl.runtime.learner_ranks import Ranks, start_learner
from scalerl.runtime.limits import job_limits
from scalerl.runtime.outputs import RunOutputs
from scalerl.runtime.setup import initial_model
from scalerl.scaling.compute import rl_flops
from scalerl.store import Store
from scalerl.tasks import problem_set_fingerprint
from scalerl.weightsync.factory import make_hub, make_publisher

if TYPE_CHECKING:
    from scalerl.messages import PolicyVersion
    from scalerl.scaling import CurveAnalysis
    from scalerl.weightsync.broadcast import BroadcastHub
    from scalerl.weightsync.publisher import Parts, WeightPublisher

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


IDLE_STEPS_WARNING = 5
"""Consecutive RL steps that train on no group before the run warns (terminal, summary.json, report)."""


class IdleSteps:
    """Counts RL steps whose every group was dropped (zero-variance, or stale): the policy did not move."""

    def __init__(self, warn_after: int = IDLE_STEPS_WARNING) -> None:
        self.warn_after = warn_after
        self.streak = self.longest = self.total = 0
        self.zero_variance = 0  # groups dropped as zero-variance during idle steps
        self.pass_rates: list[float] = []  # the rollouts' pass rate of each idle step that has one
        self.warned = False

    def observe(self, kept_groups: float | None, dropped_zero_variance: float | None,
                pass_rate: float | None = None) -> bool:
        """Record one step (`pass_rate`: its rollouts' pass rate, when known); True when a streak of idle
        steps has just reached `warn_after`."""
        if kept_groups:
            self.streak = 0
            return False
        self.streak, self.total = self.streak + 1, self.total + 1
        self.longest = max(self.longest, self.streak)
        self.zero_variance += int(dropped_zero_variance or 0)
        if pass_rate is not None:
            self.pass_rates.append(pass_rate)
        if self.streak == self.warn_after:
            self.warned = True
            return True
        return False

    def warning(self) -> str:
        """Why nothing trained: mostly prompts the policy always gets right (a dropped group is all right or
        all wrong, so the idle steps' pass rate is the share of the first), or mostly always wrong."""
        head = (f"{self.longest} consecutive RL steps trained on nothing ({self.total} steps in all; "
                f"{self.zero_variance} groups dropped as zero-variance, i.e. all samples of a prompt equally "
                "rewarded)")
        solved = sum(self.pass_rates) / len(self.pass_rates) if self.pass_rates else 0.0
        if solved >= 0.5:
            return (f"{head}: the policy already gets these prompts right (pass rate {solved:.2f} on those "
                    "steps), so they teach nothing: give it a harder task (task.digits, another task), or stop "
                    "here")
        return (f"{head}: the policy is not learning. Start from a stronger policy (sft.steps), an easier "
                "task, or a larger generation.group_size; or set loss.zero_variance_filter: false")


def step_postfix(rec: dict[str, Any]) -> dict[str, str]:
    """The progress bar's numbers for one step record, "—" where the step has none (no loss when every group
    was dropped: a 0.000 would read as a converged loss)."""

    def shown(key: str, fmt: str) -> str:
        value = rec.get(key)
        return "—" if value is None else format(value, fmt)

    return {"loss": shown("loss", ".3f"), "train_pass": shown("train_pass_rate", ".2f"),
            "stale": shown("staleness_mean", ".1f")}


class TrainerHost:
    """Owns the learner, the evaluator and the run folder. Subclasses bring the rollouts, and the bus and
    store the policy is published to."""

    bus: Bus
    store: Store
    topics: TopicNames

    def __init__(self, spec: JobSpec, out_dir: Path, *, resume: bool = False, show_progress: bool = True) -> None:
        self.spec = spec
        self.out = RunOutputs(out_dir)
        self.resume = resume
        self.progress = Progress(enabled=show_progress)
        self.last_fit: dict[str, Any] | None = None
        self.last_analysis: CurveAnalysis | None = None
        self.stopped_early: dict[str, Any] | None = None
        """Set by `_refit` when `spec.stop_policy` stops the run on its forecast: the decision and its numbers."""
        self.init_info: dict[str, Any] = {}
        self.clock = TrainClock()
        self.ledger = DeviceLedger(spec.runtime.devices)
        self.pool: DevicePool | None = None
        self.n_params = 0
        self.counters = {"gen_tokens": 0, "train_tokens": 0, "prefill_tokens": 0, "train_seq_tokens": 0,
                         "dropped_stale": 0, "duplicates": 0,
                         "dead_lettered": 0, "dropped_lost_lineage": 0}
        self.idle = IdleSteps()
        self.publisher: WeightPublisher | None = None  # made at the first publish (rank 0 only publishes)
        self.broadcast: BroadcastHub | None = None  # with runtime.weight_sync.broadcast: made with the publisher

    # -- assembly ----------------------------------------------------------------------------------
    def _setup_common(self) -> None:
        spec = self.spec
        seed_everything(spec.seed)
        self.threads = configure_threads(spec)
        self.task = make_task(spec)
        self.train_problems = self.task.problems("train")
        self.eval_problems = self.task.problems("eval")[:spec.eval.limit_prompts]  # None: all
        self.heldout_set = problem_set_fingerprint(self.eval_problems)
        self.verifier = make_verifier(spec, self.task)
        self.out.root.mkdir(parents=True, exist_ok=True)
        (self.out.root / "spec.yaml").write_text(dump_spec(spec))

    def _load_policy(self, ckpt: Path | None) -> tuple[Any, Any]:
        """(model, tokenizer): from the checkpoint folder, else the initial policy (SFT warm start)."""
        spec = self.spec
        if ckpt is not None:
            model, tok = load_model_and_tokenizer(spec.model, spec.seed, ckpt)
            return model.to(resolve_device(spec.model.device)), tok
        bar = (self.progress if spec.sft.steps else Progress(enabled=False)).bar("SFT", spec.sft.steps, unit="step")
        model, tok, self.init_info = initial_model(
            spec, self.task, self.out.root, on_sft_step=lambda s, loss: bar.update(1, loss=f"{loss:.3f}"))
        bar.close()
        return model, tok

    def _setup_learner(self, model: Any, tok: Any, resume_state: dict[str, Any] | None = None,
                       lineage: Lineage | None = None) -> None:
        """The learner over `model` (on every rank of a torchrun group: see `learner_ranks`), resumed from
        `resume_state` (a checkpoint's learner state) when given, and the evaluation engine. Sharded over
        several ranks, rank 0 evaluates on an unsharded copy refreshed before each evaluation."""
        spec = self.spec
        self.tokenizer = tok
        self.n_params = sum(p.numel() for p in model.parameters())  # before any sharding
        self.limits = job_limits(spec, self.task, embedding_rows(model))
        self.eval_copy = copy.deepcopy(model) if world()[1] > 1 else None
        self.learner = start_learner(spec, model, tok.pad_token_id, resume_state, lineage)
        self.ranks = Ranks(self.learner)
        self.ledger = DeviceLedger(self.current_devices())
        self.eval_engine = TorchEngine(self.eval_copy if self.eval_copy is not None else model, tok,
                                       fp32_head=spec.model.fp32_lm_head, seed=spec.seed + 2)
        self.eval_episodes = episode_runner(spec, self.eval_engine, tok)  # None without environment.tools

    # -- per step ----------------------------------------------------------------------------------
    def current_devices(self) -> int:
        """Devices the job holds now: the pool file's total (`runtime.pool_file`; the last count while it is
        unreadable), else max(runtime.devices, learner ranks)."""
        path = self.spec.runtime.pool_file
        if path is None:
            return max(self.spec.runtime.devices, self.learner.world_size)
        pool = read_pool_file(path)
        if pool is None:
            return self.ledger.devices if self.pool is not None else max(self.spec.runtime.devices,
                                                                         self.learner.world_size)
        self.pool = pool
        return pool.devices

    def _restore_compute(self, state: dict[str, Any]) -> None:
        """Resume the clock, the counters and the device integral of a checkpoint (one written before the
        integral was kept counts its training time at today's count)."""
        self.clock = TrainClock(state["train_s"])
        self.counters.update(state["counters"])
        saved = state.get("devices") or {"device_s": state["train_s"] * self.ledger.devices, "at_s": state["train_s"]}
        self.ledger = DeviceLedger(self.ledger.devices, device_s=saved["device_s"], at_s=saved["at_s"])

    def compute_device_hours(self) -> float:
        """Every device the job holds, integrated over training wall time (`runtime.devices` module)."""
        return self.ledger.device_hours(self.clock.now_s())

    def compute_flops(self) -> float:
        """Training FLOPs so far (`scalerl.scaling.compute`: 2·N per prefilled/generated token, 6·N per
        trained token)."""
        c = self.counters
        return rl_flops(self.n_params, prefill_tokens=c["prefill_tokens"], generated_tokens=c["gen_tokens"],
                        trained_tokens=c["train_seq_tokens"])

    def _compute_fields(self) -> dict[str, Any]:
        """The compute columns of a record: device-hours, FLOPs and the devices counted now."""
        return {"compute": self.compute_device_hours(), "compute_flops": self.compute_flops(),
                "devices": self.ledger.devices}

    def _count(self, stats: dict[str, float]) -> None:
        self.ledger.observe(self.clock.now_s(), self.current_devices())
        self.counters["gen_tokens"] += int(stats.get("tokens/gen", 0))
        self.counters["prefill_tokens"] += int(stats.get("tokens/prefill", 0))
        self.counters["train_seq_tokens"] += int(stats.get("tokens/train_seq", 0))
        self.counters["train_tokens"] += int(stats.get("tokens/train", 0))
        self.counters["dropped_stale"] += int(stats.get("batch/dropped_stale", 0))
        self.counters["dropped_lost_lineage"] += int(stats.get("batch/dropped_lost_lineage", 0))

    def _log_step(self, stats: dict[str, float], bar: Any, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        rec = {"kind": "step", "step": self.learner.version, **self._compute_fields(),
               "loss": stats.get("loss/value"), "effective_batch": stats.get("batch/effective"),
               "policy_version": self.learner.policy_version, "dropped_stale": stats.get("batch/dropped_stale"),
               "dropped_lost_lineage": stats.get("batch/dropped_lost_lineage"),
               "dropped_zero_variance": stats.get("batch/dropped_zero_variance"),
               "truncation_rate": stats.get("rollout/truncation_rate"),
               "interruption_rate": stats.get("rollout/interruption_rate"),
               "entropy": stats.get("policy/entropy"), "clip_frac": stats.get("loss/clip_frac"),
               "ratio_mean": stats.get("loss/ratio_mean"), "ratio_max": stats.get("loss/ratio_max"),
               "staleness_mean": stats.get("offpolicy/age_mean"), "staleness_max": stats.get("offpolicy/age_max"),
               "train_pass_rate": stats.get("rollout/pass_rate"), "lr": stats.get("optim/lr"),
               "step_time_s": stats.get("time/step_s"), "gen_tokens": self.counters["gen_tokens"],
               "train_tokens": self.counters["train_tokens"], "token_age": _token_age_record(stats),
               **(extra or {})}
        self.out.train_record(rec)
        if self.idle.observe(rec["effective_batch"], rec["dropped_zero_variance"], rec["train_pass_rate"]):
            log.warning("%s", self.idle.warning())
        bar.update(1, **step_postfix(rec))
        return rec

    def _publish(self) -> None:
        """Upload the current weights, then announce them on `policy`. With broadcast
        (`weightsync.broadcast`): encode them, push them to the generators' group, announcing them as soon as
        their manifest has gone (a snapshot's goes first), then upload."""
        if self.publisher is None:
            self.publisher = make_publisher(self.spec, self.store)
            self.broadcast = make_hub(self.spec)
        hub, state = self.broadcast, self.ranks.full_state_dict()
        if hub is None:
            self._announce_policy(self.publisher.publish(self.learner.policy_version, state))
            return

        def push_and_announce(pv: PolicyVersion, parts: Parts) -> None:
            # bounded by its timeouts; a member that misses the version pulls it from the store
            hub.send_and_announce(pv.version, parts, lambda: self._announce_policy(pv))

        self.publisher.publish(self.learner.policy_version, state, before_upload=push_and_announce)

    def _announce_policy(self, pv: PolicyVersion) -> None:
        self.announced = pv
        crash_point("learner.announce")
        self.bus.publish(self.topics.policy, pv, key="policy", headers=self._policy_headers())
        self.bus.flush()

    def close_broadcast(self) -> None:
        """Stop the broadcast hub (its rendezvous port and thread), if there is one."""
        if self.broadcast is not None:
            self.broadcast.close()
            self.broadcast = None

    def broadcast_counters(self) -> dict[str, Any]:
        """The hub's counters for status() and the metrics (empty when broadcast is off)."""
        b = self.broadcast
        if b is None:
            return {}
        return {"broadcast_sent": b.sent, "broadcast_skipped": b.skipped, "broadcast_failed": b.failed,
                "broadcast_members": b.members, "broadcast_stuck": dict(b.stuck)}

    def _policy_headers(self) -> dict[str, str]:
        """What travels with an announcement: the learner's step (it differs from the version after a resume:
        `scalerl.learner.lineage`)."""
        return {"learner_step": str(self.learner.version)}

    def _eval_due(self) -> bool:
        v = self.learner.version
        return v % self.spec.eval.every_steps == 0 or v == self.spec.train.steps

    def _checkpoint_due(self) -> bool:
        v = self.learner.version
        return v % self.spec.train.checkpoint_every == 0 or v == self.spec.train.steps

    # -- evaluation --------------------------------------------------------------------------------
    def _evaluate(self) -> dict[str, Any]:
        spec = self.spec
        t0 = time.perf_counter()
        bar = self.progress.bar(f"eval@{self.learner.version}", len(self.eval_problems), unit="prompt", leave=False)
        if self.eval_copy is not None:  # sharded learner: evaluate rank 0's copy of the current weights
            self.eval_copy.load_state_dict(self.ranks.full_state_dict())
            self.eval_copy.eval()
        else:
            self.learner.model.eval()
        res = evaluate_mean_at_k(
            self.eval_engine, self.tokenizer, self.eval_problems, self.verifier, k=spec.eval.samples_per_prompt,
            sampling=SamplingParams(spec.eval.temperature, spec.generation.top_p),
            length=length_control(spec, self.tokenizer), prompts_per_batch=spec.eval_prompts_per_batch,
            on_batch=bar.update, episodes=self.eval_episodes)
        bar.close()
        rec = {"step": self.learner.version, **self._compute_fields(),
               "gen_tokens": self.counters["gen_tokens"], "train_tokens": self.counters["train_tokens"],
               "pass_rate": res.pass_rate, "k": res.k, "n_prompts": res.n_prompts,
               "eval_truncation_rate": res.truncation_rate, "wall_s": time.perf_counter() - t0,
               "heldout_set": self.heldout_set, "prompt_pass_rates": res.prompt_pass_rates,
               "verdicts": res.verdicts, "task_metrics": res.task_metrics}
        self.out.eval_record(rec)
        self._refit()
        return rec

    def _evaluate_paused_clock(self) -> dict[str, Any]:
        """Evaluate with the training clock stopped (evaluation is not training compute)."""
        self.clock.stop()
        try:
            return self._evaluate()
        finally:
            self.clock.start()

    def _refit(self) -> None:
        """Refit the scaling curve on the evals so far with the job's `fit` settings (the one procedure:
        `scalerl.report.online`); the fit goes to train.jsonl, and is what summary.json, the report, the
        status and the metrics topic show (None while the data cannot support one)."""
        from scalerl.report.online import analyse_run, fit_record, stop_decision

        self.last_analysis = analyse_run(self.out.read(self.out.metrics_path), self.spec.fit,
                                         total_steps=self.spec.train.steps)
        self.last_fit = None if self.last_analysis is None else fit_record(self.last_analysis, budget=True)
        if self.last_fit is not None:
            self.out.train_record({"kind": "fit", "step": self.learner.version,
                                   "compute": self.compute_device_hours(), **self.last_fit})
        decision = stop_decision(self.last_analysis, self.spec.stop_policy)
        if decision is not None and self.stopped_early is None:
            self.stopped_early = {"step": self.learner.version, **decision}
            self.out.train_record({"kind": "stop", **self.stopped_early})
            log.warning("stopping early at step %d (%s): %s", self.learner.version, decision["reason"],
                        decision["message"])

    def stop_due(self) -> bool:
        """Whether the training loop ends now: the planned steps are done, or the forecast stopped the run."""
        return self.learner.version >= self.spec.train.steps or self.stopped_early is not None

    # -- end of run --------------------------------------------------------------------------------
    def _first_eval(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the step-0 evaluation, the newest one): run it on a fresh start, read both back on resume."""
        if self.learner.version == 0:
            first = self._evaluate()
            return first, first
        evals = self.out.read(self.out.metrics_path)
        if not evals:
            raise RuntimeError(f"resumed at step {self.learner.version} but {self.out.metrics_path} has no eval")
        stops = [r for r in self.out.read(self.out.train_path) if r.get("kind") == "stop"]
        if stops and self.stopped_early is None:  # the forecast had stopped this run: it stays stopped
            self.stopped_early = {k: v for k, v in stops[-1].items() if k != "kind"}
        return evals[0], evals[-1]

    def _gain(self, first: dict[str, Any], last: dict[str, Any]) -> dict[str, Any]:
        """The held-out gain of the run, final − initial mean@k, with its paired bootstrap interval over
        the held-out prompts (fit.bootstrap resamples at fit.level; no interval when that is 0)."""
        before, after = first.get("prompt_pass_rates") or [], last.get("prompt_pass_rates") or []
        same_prompts = len(before) == len(after) and first.get("heldout_set") == last.get("heldout_set")
        if last is first or not before or not same_prompts:
            return {"gain": None}
        fit = self.spec.fit
        if not fit.bootstrap:  # no resampling asked for: the gain alone
            return {"gain": last["pass_rate"] - first["pass_rate"], "gain_interval": None, "gain_prompts": len(before)}
        gain, lo, hi = paired_gain(before, after, n_resamples=fit.bootstrap, seed=fit.seed, level=fit.level)
        return {"gain": gain, "gain_interval": [lo, hi], "gain_level": fit.level, "gain_prompts": len(before)}

    def _summary(self, first: dict[str, Any], last: dict[str, Any], **extra: Any) -> dict[str, Any]:
        summary = {"name": self.spec.name, "initial_pass_rate": first["pass_rate"],
                   "final_pass_rate": last["pass_rate"], **self._gain(first, last), "steps": self.learner.version,
                   "compute": self.compute_device_hours(), "compute_unit": "device-hours",
                   "compute_flops": self.compute_flops(), "compute_flops_unit": "FLOPs", "n_params": self.n_params,
                   "devices": self.ledger.devices, "pool": None if self.pool is None else self.pool.to_dict(),
                   "train_wall_s": self.clock.now_s(), "gen_tokens": self.counters["gen_tokens"],
                   "train_tokens": self.counters["train_tokens"], "dropped_stale": self.counters["dropped_stale"],
                   "duplicates_dropped": self.counters["duplicates"],
                   "dead_lettered": self.counters["dead_lettered"],
                   "dropped_lost_lineage": self.counters["dropped_lost_lineage"],
                   "policy_version": self.learner.policy_version, "mode": self.spec.off_policy.mode,
                   "k": self.spec.off_policy.k, "threads": self.threads, "heldout_set": self.heldout_set,
                   "data_seed": self.spec.task.data_seed,
                   "token_age": summarise_token_ages(self.out.read(self.out.train_path)), **extra,
                   "fit": self.last_fit, "stopped_early": self.stopped_early, **self.init_info,
                   "steps_without_training": self.idle.total}
        if self.idle.warned:
            summary["warnings"] = [self.idle.warning()]
        for key in ("A", "B", "C_mid"):
            summary[key] = (self.last_fit or {}).get(key)
        self.out.write_summary(summary)
        try:
            from scalerl.report import write_report

            summary["report"] = str(write_report(self.out.root, analysis=self.last_analysis))
        except Exception as exc:  # the run's numbers are already on disk; a plot failure is not fatal
            log.warning("report failed: %r", exc)
        return summary


_AGE_KEY = "offpolicy/token_age_tokens/"


def _token_age_record(stats: dict[str, float]) -> dict[str, Any]:
    """train.jsonl's `token_age` of one step: {"hist": {age: trained tokens}, "mean", "max", ...} where age
    = the version the learner trained (step − 1) − the version that sampled the token (versions)."""
    hist = {int(key[len(_AGE_KEY):]): int(n) for key, n in stats.items() if key.startswith(_AGE_KEY)}
    return {"hist": {str(a): n for a, n in sorted(hist.items())}, **age_stats(hist)}


def summarise_token_ages(train_records: list[dict[str, Any]]) -> dict[str, Any]:
    """summary.json's `token_age`: the step histograms of train.jsonl summed over the run, with its
    token-weighted mean and max (versions), and the largest per-step mean."""
    steps = [r["token_age"] for r in train_records if r.get("kind") == "step" and r.get("token_age")]
    hist = merge_age_counts({int(a): n for a, n in s["hist"].items()} for s in steps)
    step_means = [s["mean"] for s in steps if s.get("mean") is not None]
    return {"hist": {str(a): n for a, n in hist.items()}, **age_stats(hist),
            "step_mean_max": max(step_means) if step_means else None, "unit": "policy versions"}
