"""Building a training run's parts from its spec: curriculum, model (with SFT warm start); records' limits are
in `runtime/limits.py`.
The parts `scalerl eval` builds too (seeds, threads, task, verifier) are in `scalerl/parts.py`.

What the spec points at (datasets, model files, budgets against the model's positions, the engine) is
checked before this module and its torch are imported: `runtime/preflight.py`, called by the command line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scalerl.config import JobSpec
from scalerl.curriculum.curriculum import Curriculum
from scalerl.tasks import Problem, Task

log = logging.getLogger(__name__)


def make_curriculum(spec: JobSpec, problems: list[Problem], *, steps_in_flight: int = 1) -> Curriculum:
    """The job's curriculum over `problems`; at least `steps_in_flight` optimizer steps' worth of prompts
    may be issued and not yet consumed (PPO-off-policy-k generates k steps' worth at once)."""
    c = spec.curriculum
    return Curriculum(problems, task_name=spec.task.kind, group_size=spec.generation.group_size, seed=spec.seed,
                      max_inflight=max(spec.max_inflight_prompts, steps_in_flight * spec.train.prompts_per_step),
                      npr=c.no_positive_resampling, npr_threshold=c.npr_threshold, limit_prompts=c.limit_prompts)


def initial_model(spec: JobSpec, task: Task, out_dir: Path,
                  on_sft_step: Callable[[int, float], None] | None = None) -> tuple[Any, Any, dict[str, Any]]:
    """The policy RL starts from: `init_checkpoint`, else SFT on the task's gold solutions.

    SFT results are saved to `<out>/sft` and reused when present. Returns (model, tokenizer, info).
    """
    # here, not at the top: the curriculum service imports this module and never loads a model
    from scalerl.learner.sft import run_sft
    from scalerl.model.factory import load_model_and_tokenizer, resolve_device, save_model_and_tokenizer

    device = resolve_device(spec.model.device)
    info: dict[str, Any] = {}
    if spec.model.init_checkpoint is not None:
        model, tok = load_model_and_tokenizer(spec.model, spec.seed, spec.model.init_checkpoint)
        info["init"] = spec.model.init_checkpoint
        return model.to(device), tok, info
    sft_dir = out_dir / "sft"
    if (sft_dir / "config.json").is_file():
        model, tok = load_model_and_tokenizer(spec.model, spec.seed, sft_dir)
        info["init"] = str(sft_dir)
        return model.to(device), tok, info
    model, tok = load_model_and_tokenizer(spec.model, spec.seed)
    model.to(device)
    pairs = [(p.prompt, p.solution) for p in task.problems("train") if p.solution]
    if spec.sft.steps > 0 and pairs:
        losses = run_sft(model, tok, pairs, spec.sft, seed=spec.seed, fp32_head=spec.model.fp32_lm_head,
                         on_step=on_sft_step)
        info.update(sft_steps=len(losses), sft_final_loss=losses[-1])
        save_model_and_tokenizer(model, tok, sft_dir)
        info["init"] = str(sft_dir)
    elif spec.sft.steps > 0:
        log.warning("task %s has no gold solutions: skipping SFT", spec.task.kind)
    return model, tok, info

