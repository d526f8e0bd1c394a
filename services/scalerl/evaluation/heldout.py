"""mean@k on the held-out set (ScaleRL §1.2): k samples per prompt, the mean correctness over all.

Because every prompt gets the same k, mean@k equals the mean over all prompts × k samples (spec §6.2).
The per-prompt pass rates are kept so the curve fit can bootstrap over prompts; so are the verifier's
verdicts (how many samples were `correct`, `wrong`, `truncated`, code's `fail`/`timeout`/…) and the mean over
all samples of each number a task's grades carry (code: `tests_passed`, the fraction of asserts passed).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scalerl.generator.engine import GenerationEngine, LengthControl, SamplingParams
from scalerl.generator.episode import EpisodeRunner
from scalerl.generator.role import encode_prompt
from scalerl.tasks import Problem
from scalerl.verifier.verifier import Verifier


@dataclass(slots=True)
class EvalResult:
    pass_rate: float  # mean@k in [0, 1]
    k: int
    n_prompts: int
    gen_tokens: int
    truncation_rate: float
    prompt_pass_rates: list[float] = field(default_factory=list)
    samples: list[tuple[str, str, bool]] = field(default_factory=list)  # (prompt, completion, correct)
    verdicts: dict[str, int] = field(default_factory=dict)  # samples per verdict (Grade.verdict)
    task_metrics: dict[str, float] = field(default_factory=dict)  # Grade.metrics' means over all k·n samples


def evaluate_mean_at_k(engine: GenerationEngine, tokenizer: Any, problems: list[Problem], verifier: Verifier,
                       *, k: int, sampling: SamplingParams, length: LengthControl, prompts_per_batch: int,
                       on_batch: Callable[[int], None] | None = None, keep_samples: int = 0,
                       episodes: EpisodeRunner | None = None) -> EvalResult:
    """Sample k completions per problem and score them. `on_batch(n_prompts)` reports progress.
    `episodes`: the job's tools (`environment`): multi-turn episodes on prompts with the tools' instructions."""
    generate = engine.generate if episodes is None else episodes.generate
    per_prompt: list[float] = []
    gen_tokens = 0
    samples: list[tuple[str, str, bool]] = []
    verdicts: Counter[str] = Counter()
    metric_sums: defaultdict[str, float] = defaultdict(float)
    for start in range(0, len(problems), prompts_per_batch):
        chunk = problems[start:start + prompts_per_batch]
        ids = [encode_prompt(tokenizer, p.prompt if episodes is None else episodes.prompt(p.prompt)) for p in chunk]
        comps = generate([i for i in ids for _ in range(k)], sampling, length)
        for j, p in enumerate(chunk):
            group = comps[j * k:(j + 1) * k]
            grades = verifier.grade_all([(c.text, p.answer, c.finish_reason) for c in group])
            ok = [g.correct for g in grades]
            for g in grades:
                verdicts[g.verdict] += 1
                for key, value in (g.metrics or {}).items():
                    metric_sums[key] += value
            per_prompt.append(sum(ok) / k)
            gen_tokens += sum(len(c.token_ids) for c in group)
            if len(samples) < keep_samples:
                samples.append((p.prompt, group[0].text, ok[0]))
        if on_batch is not None:
            on_batch(len(chunk))
    n = len(per_prompt)
    return EvalResult(pass_rate=sum(per_prompt) / max(n, 1), k=k, n_prompts=n, gen_tokens=gen_tokens,
                      truncation_rate=verdicts["truncated"] / max(n * k, 1), prompt_pass_rates=per_prompt,
                      samples=samples, verdicts=dict(verdicts),
                      task_metrics={key: total / max(n * k, 1) for key, total in metric_sums.items()})
