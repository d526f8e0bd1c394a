"""Sampling n completions per problem through a generation backend and scoring them with the verifier.

The backend is any `generate(prompt_ids, n, sampling, length) -> list[Completion]` (n completions per
prompt, prompt-major): the torch engine in-process (`--engine embedded`) or a generator service
(`--engine grpc`). Both count the same tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from scalerl.evaluation.strategies import ProblemSamples
from scalerl.generator.engine import LengthControl, SamplingParams
from scalerl.generator.role import encode_prompt
from scalerl.messages import Completion
from scalerl.tasks import Problem, Task
from scalerl.verifier.verifier import Verifier

GenerateFn = Callable[[list[list[int]], SamplingParams, LengthControl], list[Completion]]
"""One completion per row (a tree search's expansions)."""
GroupGenerateFn = Callable[[list[list[int]], int, SamplingParams, LengthControl], list[Completion]]
"""n completions per prompt, prompt-major."""


def sample_problems(generate: GroupGenerateFn, tokenizer: Any, problems: Sequence[Problem], task: Task,
                    verifier: Verifier, *, n: int, sampling: SamplingParams, length: LengthControl,
                    prompts_per_batch: int, on_batch: Callable[[int], None] | None = None) -> list[ProblemSamples]:
    """n completions of every problem, with answers, verdicts and token counts.

    A truncated completion (finish "length") is wrong and has no answer (it never finished one), so it
    casts no vote in maj@k.
    """
    out: list[ProblemSamples] = []
    for start in range(0, len(problems), prompts_per_batch):
        chunk = problems[start:start + prompts_per_batch]
        ids = [encode_prompt(tokenizer, p.prompt) for p in chunk]
        comps = generate(ids, n, sampling, length)
        for j, p in enumerate(chunk):
            group = comps[j * n:(j + 1) * n]
            out.append(ProblemSamples(
                problem_id=p.id,
                answers=[None if c.finish_reason == "length" else task.extract_answer(c.text) for c in group],
                correct=[verifier.is_correct(c.text, p.answer, c.finish_reason) for c in group],
                tokens=[len(c.token_ids) for c in group],
                thinking_tokens=[c.thinking_tokens for c in group],
                prompt=p.prompt, reference=p.answer, texts=[c.text for c in group],
                forced_tokens=[c.loss_mask.count(False) for c in group], finish=[c.finish_reason for c in group]))
        if on_batch is not None:
            on_batch(len(chunk))
    return out
