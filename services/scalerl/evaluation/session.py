"""Running a validated `scalerl eval` plan: load each checkpoint, evaluate it, fit, build the frontier.

Returns the JSON record (every number) and the text report; commands.py writes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from scalerl.console import Progress, quiet_third_party_bars
from scalerl.evaluation.checkpoints import CheckpointRef
from scalerl.evaluation.frontier import CheckpointCurve, frontier_report
from scalerl.evaluation.output import (
    budget_table,
    fit_curve,
    fit_lines,
    fit_strategies,
    frontier_lines,
    strategy_table,
    tree_table,
    unique_run_line,
)
from scalerl.evaluation.runner import Context, EmbeddedBackend, evaluate_checkpoint
from scalerl.evaluation.strategies import StrategyPoint
from scalerl.generator.engine import LengthControl, SamplingParams, budget_forcing_of
from scalerl.messages import Completion
from scalerl.tasks import Problem, Task, read_jsonl


class GrpcBackend:
    """A generator service (`scalerl.rpc.client.GeneratorClient`); it serves the policy it has loaded."""

    def __init__(self, target: str, seed: int) -> None:
        from scalerl.rpc.client import GeneratorClient
        from scalerl.rpc.security import RpcSecurity

        self.client = GeneratorClient(target, security=RpcSecurity.from_env())
        self.client.wait_ready()
        self.seed = seed
        self._restart: int | None = None  # the stream seed the next request starts from

    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingParams,
                 length: LengthControl) -> list[Completion]:
        return self.client.generate(prompt_ids, n, temperature=sampling.temperature, top_p=sampling.top_p,
                                    thinking_budget_tokens=length.thinking_budget,
                                    answer_budget_tokens=length.answer_budget,
                                    interruption=length.interruption_ids is not None,
                                    budget_forcing=budget_forcing_of(length), seed=self._take_restart())

    def use_stream(self, name: str) -> None:
        """The next request restarts the service's stream from the eval seed's stream `name` (the request's
        `seed` field); later ones continue it, as the embedded engine does. Reproducible while no other
        client samples from the same service in between."""
        from scalerl.evaluation.runner import stream_seed

        self._restart = stream_seed(self.seed, name)

    def _take_restart(self) -> int | None:
        seed, self._restart = self._restart, None
        return seed


def _problems(plan: Any, task: Task) -> tuple[list[Problem], str]:
    """(problems, a description). A JSONL file's problems are checked by the run's own verifier (its
    task's `is_correct` on the file's answers), so they must be in that task's answer format."""
    if plan.tasks in ("eval", "train"):
        problems, what = task.problems(plan.tasks), f"{task.name} {plan.tasks} split"
    else:
        problems = [Problem(id=r.id or f"L{r.line}", prompt=r.prompt, answer=r.answer, solution="")
                    for r in read_jsonl(plan.tasks)]
        what = f"{plan.tasks} (verified as {task.name})"
    return (problems[:plan.limit] if plan.limit else problems), what


def _evaluate_ref(plan: Any, ref: CheckpointRef, task: Task, problems: list[Problem], backend: Any,
                  progress: Progress) -> tuple[dict[str, Any], list[StrategyPoint]]:
    """The checkpoint's JSON record, and its strategy points (for the text report)."""
    from scalerl.generator.factory import make_engine
    from scalerl.model.factory import load_model_and_tokenizer, resolve_device
    from scalerl.parts import make_verifier

    spec = plan.spec
    model, tok = load_model_and_tokenizer(spec.model, spec.seed, ref.folder)
    model.to(resolve_device(spec.model.device)).eval()
    if backend is None:
        backend = EmbeddedBackend(make_engine(spec, model, tok, seed=plan.opts.seed, workdir=Path(ref.folder),
                                              model_folder=Path(ref.folder)), seed=plan.opts.seed)
    ctx = Context(spec=spec, task=task, verifier=make_verifier(spec, task), tokenizer=tok, policy=model,
                  backend=backend, checkpoint=ref.folder, opts=plan.opts, progress=progress)
    record = evaluate_checkpoint(ctx, problems)
    points = record.pop("points")
    record = {"step": ref.step, "checkpoint": str(ref.folder), "rl_compute_device_hours": ref.rl_device_hours,
              **record, "points": [p.to_dict() for p in points], "fits": fit_strategies(points)}
    forced = [r for r in record.get("budget_forcing", []) if r["max_thinking"] is not None]
    if forced:
        record["budget_fit"] = fit_curve([r["thinking_tokens_per_sample"] for r in forced],
                                         [r["accuracy"] for r in forced], x_name="thinking tokens per sample")
    unique = [r for r in record.get("tree", []) if r["method"] == "unique"]
    if unique:
        record["tree_unique_fit"] = fit_curve([r["gen_tokens_per_problem"] for r in unique],
                                              [r["accuracy"] for r in unique], x_name="generated tokens per problem")
    return record, points


def _text(record: dict[str, Any], points: list[StrategyPoint], what: str) -> list[str]:
    lines = [f"\ncheckpoint {record['checkpoint']} (step {record['step']}, RL compute "
             + (f"{record['rl_compute_device_hours']:.4f} device-hours" if record["rl_compute_device_hours"]
                is not None else "unknown") + f"); {record['problems']} problems of {what}"]
    if points:
        lines += [strategy_table(points), "", "Saturating fits (accuracy vs samples, R0 = 0):",
                  *fit_lines(record["fits"])]
    if "inference" in record:
        inf = record["inference"]
        lines.append(f"  inference: {inf['tokens_per_s']:,.0f} generated tokens/s, "
                     f"{inf['device_hours_per_token']:.3g} device-hours per token")
    if "scorer" in record:
        s = record["scorer"]
        auc = s.get("heldout_auc")
        lines.append(f"  scorer: {s.get('source')}" + (f"; held-out AUC {auc:.3f}" if auc is not None else ""))
    if record.get("budget_forcing"):
        lines += ["", "Budget forcing (n samples per problem at each budget):", budget_table(record["budget_forcing"])]
        if "budget_fit" in record:
            lines += fit_lines({"budget forcing": record["budget_fit"]})
    if record.get("tree"):
        lines += ["", "Tree search vs sampling with the verifier (Countdown, per problem):", tree_table(record["tree"])]
        if record.get("tree_unique_run"):
            lines.append(unique_run_line(record["tree_unique_run"]))
            lines += fit_lines({"tree (unique)": record["tree_unique_fit"]})
    return lines


def run_plan(plan: Any) -> tuple[dict[str, Any], str]:
    from scalerl.parts import configure_threads, make_task, seed_everything

    quiet_third_party_bars()
    seed_everything(plan.opts.seed)
    configure_threads(plan.spec)
    progress = Progress(plan.opts.show_progress)
    task = make_task(plan.spec)
    problems, what = _problems(plan, task)
    backend = GrpcBackend(plan.grpc_target, plan.opts.seed) if plan.engine == "grpc" else None
    result: dict[str, Any] = {"target": str(plan.run or plan.refs[0].folder), "task": what, "engine": plan.engine,
                              "strategies": list(plan.opts.strategies), "ks": list(plan.opts.ks),
                              "samples_per_problem": plan.opts.samples, "temperature": plan.opts.temperature,
                              "checkpoints": []}
    lines = [f"scalerl eval {result['target']}: {', '.join(plan.opts.strategies)}; k = "
             f"{','.join(map(str, plan.opts.ks))} of {plan.opts.samples} samples per problem; temperature "
             f"{plan.opts.temperature:g}; engine {plan.engine}"]
    outer = progress.bar("checkpoints", len(plan.refs), unit="checkpoint") if len(plan.refs) > 1 else None
    for ref in plan.refs:
        record, points = _evaluate_ref(plan, ref, task, problems, backend, progress)
        result["checkpoints"].append(record)
        lines += _text(record, points, what)
        if outer is not None:
            outer.update(1, step=ref.step)
    if outer is not None:
        outer.close()
    if len(plan.refs) > 1:
        result["frontiers"] = _frontiers(plan, result["checkpoints"], len(problems))
        for front in result["frontiers"]:
            lines += ["", *frontier_lines(front)]
    return result, "\n".join(lines)


def _frontiers(plan: Any, records: list[dict[str, Any]], n_problems: int) -> list[dict[str, Any]]:
    """One frontier per number of problems served, for the main strategy: majority if run, else best-of-n,
    else sample."""
    names = [s for s in ("majority", "best-of-n", "sample") if s in plan.opts.strategies]
    usable = [r for r in records if r["rl_compute_device_hours"] is not None and "inference" in r]
    if not names or len(usable) < 2:
        return []
    # Every checkpoint has the same architecture, so a token costs the same: one cost per token, the median
    # of the measurements (wall-clock measurements on a shared machine are noisy).
    per_token = float(np.median([r["inference"]["device_hours_per_token"] for r in usable]))
    curves = []
    for r in usable:
        pts = sorted((p for p in r["points"] if p["strategy"] == names[0]), key=lambda p: p["k"])
        curves.append(CheckpointCurve(step=r["step"], rl_device_hours=r["rl_compute_device_hours"],
                                      device_hours_per_token=per_token,
                                      ks=tuple(p["k"] for p in pts), accuracy=tuple(p["accuracy"] for p in pts),
                                      gen_tokens_per_problem=tuple(p["gen_tokens_per_problem"] for p in pts)))
    reports = []
    for served in plan.problems_served or (n_problems,):
        report = frontier_report(curves, problems=served, budgets=plan.budgets)
        report["strategy"] = names[0]
        reports.append(report)
    return reports

