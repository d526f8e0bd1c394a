"""A warm start whose groups have mixed rewards by construction, on any CPU's kernels.

The runs that compare training steps (resume = uninterrupted, two learner ranks = one process, the
distributed run) need groups with mixed rewards, or every group is filtered and the comparison is
vacuous. A plain SFT warm start gets them by luck: its pass rate (about 0.3 on the 2-digit sums these
tests used) is wherever the kernels' rounding lands it, and on another CPU the groups of the compared
steps came out all equal.

Construction: SFT on every training problem twice, once with its gold solution and once with the same
chain of thought ending in a wrong answer (the last digit plus one). The SFT optimum is a 50/50 answer
at that digit, so a policy that has learned the (1-digit) chain is right about half the time on every
prompt, not on some prompts always and on others never: a group of 4 is mixed with probability about
1 - 2 * 0.5^4 = 0.875. `mixed_reward_warm_start` checks it on sampled groups before returning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scalerl.evaluation.rollouts import sample_problems
from scalerl.evaluation.runner import EmbeddedBackend
from scalerl.generator.engine import SamplingParams
from scalerl.generator.role import length_control
from scalerl.generator.torch_engine import TorchEngine
from scalerl.learner.sft import run_sft
from scalerl.model.factory import load_model_and_tokenizer, save_model_and_tokenizer
from scalerl.parts import configure_threads, make_task, make_verifier

CHECK_PROMPTS = 48
"""Training prompts sampled (a group each) to check the warm start."""
MIN_MIXED_FRACTION = 0.5
"""At least this fraction of the checked groups must have mixed rewards (expected about 0.875)."""


def wrong_answer_solution(solution: str) -> str:
    """The gold solution with its answer's last digit changed (plus one, mod 10): wrong, same length."""
    chain, close, answer = solution.rpartition("</think>")
    return f"{chain}{close}{answer[:-1]}{(int(answer[-1]) + 1) % 10}"


def mixed_reward_fraction(spec: Any, model: Any, tokenizer: Any) -> float:
    """Fraction of `CHECK_PROMPTS` groups (`spec.generation.group_size` samples at temperature 1) whose
    samples are neither all right nor all wrong."""
    task = make_task(spec)
    backend = EmbeddedBackend(TorchEngine(model, tokenizer, seed=spec.seed), seed=spec.seed)
    backend.use_stream("warm start check")
    groups = sample_problems(backend.generate, tokenizer, task.problems("train")[:CHECK_PROMPTS], task,
                             make_verifier(spec, task), n=spec.generation.group_size, sampling=SamplingParams(1.0),
                             length=length_control(spec, tokenizer), prompts_per_batch=CHECK_PROMPTS)
    return sum(0 < sum(g.correct) < g.n for g in groups) / len(groups)


def mixed_reward_warm_start(spec: Any, out_dir: Path) -> str:
    """SFT the spec's model on gold and wrong-answer solutions (see the module docstring), save it to
    `<out_dir>/sft` and return that folder, after checking its groups have mixed rewards."""
    configure_threads(spec)  # as the runs do: more threads than free cores crawl
    task = make_task(spec)
    model, tokenizer = load_model_and_tokenizer(spec.model, spec.seed)
    gold = [(p.prompt, p.solution) for p in task.problems("train")]
    pairs = gold + [(prompt, wrong_answer_solution(solution)) for prompt, solution in gold]
    run_sft(model, tokenizer, pairs, spec.sft, seed=spec.seed, fp32_head=spec.model.fp32_lm_head)
    model.eval()
    mixed = mixed_reward_fraction(spec, model, tokenizer)
    assert mixed >= MIN_MIXED_FRACTION, (
        f"the warm start's groups are mixed in only {mixed:.2f} of {CHECK_PROMPTS} (need {MIN_MIXED_FRACTION})")
    folder = out_dir / "sft"
    save_model_and_tokenizer(model, tokenizer, folder)
    return str(folder)


def addition_spec(name: str, init: str | None, *, steps: int, off_policy: dict[str, Any], checkpoint_every: int,
                  eval_every: int, **runtime: Any) -> Any:
    """The small addition job the end-to-end runs and the chaos bench share (a 64-wide tiny model, 1-digit
    sums). Runs that need groups with mixed rewards start from `mixed_reward_warm_start(spec, dir)` (right
    about half the time on every prompt, by construction), not from the job's own SFT, whose pass rate
    depends on the CPU's kernels. `runtime` keys go to the spec's runtime section.

    RL lr 1e-4: from that warm start, 40 steps at 1e-3 (PipelineRL-2, an eval after every step) collapsed
    the held-out pass rate to about 0.1 on AVX-512 and to 0 on AVX2 kernels (every group then all wrong:
    nothing trained, no eval above R0, so no fit); at 1e-4 it rose from about 0.5 to 0.6-0.7 on both."""
    from scalerl.config import spec_from_dict

    return spec_from_dict({
        "name": name, "seed": 3,
        "model": {"tiny": {"hidden_size": 64, "intermediate_size": 192, "num_layers": 2, "num_heads": 2,
                           "max_positions": 96}, "init_checkpoint": init},
        "task": {"kind": "addition", "digits": 1, "train_size": 400, "eval_size": 8},
        "sft": {"steps": 300, "batch_size": 32, "lr": 0.003},
        "generation": {"group_size": 4, "thinking_budget_tokens": 32, "answer_budget_tokens": 6,
                       "interruption": {"window_tokens": [28, 32]}, "prompts_per_batch": 4},
        "off_policy": off_policy,
        "optim": {"lr": 1e-4, "warmup_steps": 2},
        "train": {"prompts_per_step": 4, "steps": steps, "checkpoint_every": checkpoint_every},
        "eval": {"every_steps": eval_every, "samples_per_prompt": 2},
        "runtime": {"threads": 1, **runtime},
    })
