"""Building a training run's parts from its spec: curriculum, model (with SFT warm start); records' limits are
in `runtime/limits.py`.
The parts `scalerl eval` builds too (seeds, threads, task, verifier) are in `scalerl/parts.py`.

What the spec points at (datasets, model files, budgets against the model's positions, the engine) is
checked before this module and its torch are imported: `runtime/preflight.py`, called by the command line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalerl.config import JobSpec
from scalerl.curriculum.curriculum import Curriculum
from scalerl.tasks import Problem, Task

if TYPE_CHECKING:  # the curriculum service imports this module; torch (under learner.sft) only when SFT runs
    from scalerl.learner.sft import Example

Demonstration = tuple[str, list[str]]
"""A prompt and the model's turns of a gold episode (one turn: a gold solution)."""

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
    examples, encode = sft_demonstrations(spec, task, tok)
    if spec.sft.steps > 0 and examples:
        t0 = time.perf_counter()
        losses = run_sft(model, tok, examples, spec.sft, seed=spec.seed, fp32_head=spec.model.fp32_lm_head,
                         on_step=on_sft_step, encode=encode)
        info.update(sft_steps=len(losses), sft_final_loss=losses[-1], sft_wall_s=time.perf_counter() - t0,
                    sft_tool_demonstrations=sum(len(turns) > 1 for _, turns in examples))
        save_model_and_tokenizer(model, tok, sft_dir)
        info["init"] = str(sft_dir)
    elif spec.sft.steps > 0:
        log.warning("task %s has no gold solutions: skipping SFT", spec.task.kind)
    return model, tok, info


def sft_demonstrations(spec: JobSpec, task: Task, tokenizer: Any) -> tuple[
        list[Demonstration], Callable[[Demonstration], Example]]:
    """What SFT imitates, as (prompt, model turns) per train problem, and how one is encoded.

    Without `environment.tools`: each problem's gold solution, one turn. With tools: the prompt carries the
    tools' instructions, as the generator's episodes do, and a problem the task can demonstrate the tools on
    (`Task.tool_demonstration`) is that episode; its tools' answers are computed by running the calls
    (this process's toolbox) and enter as the same observation tokens an episode holds, out of the loss.
    Other problems keep their gold solution."""
    from scalerl.environment.tools import Toolbox, parse_call, tool_limits
    from scalerl.generator.episode import ObservationTokens
    from scalerl.learner.sft import encode_demonstration

    env = spec.environment
    box = Toolbox(tuple(env.tools), tool_limits(env.tool_wall_s, env.tool_memory_mb)) if env.tools else None
    examples: list[Demonstration] = []
    for p in task.problems("train"):
        turns = (box and task.tool_demonstration(p, box.names)) or [p.solution]
        if all(turns):  # a problem without a gold solution is not demonstrated
            examples.append((p.prompt + box.instructions() if box else p.prompt, turns))
    observation = ObservationTokens(tokenizer, env.max_observation_tokens)

    def observe(turn: str) -> list[int]:
        assert box is not None  # only demonstrations of several turns call tools
        return observation(box.execute(parse_call(turn)).text)

    return examples, lambda ex: encode_demonstration(tokenizer, ex[0], ex[1], observe)
