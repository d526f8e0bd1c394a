"""What one `scalerl eval` run of one checkpoint works with: its options (`EvalOptions`), the generator it
samples from (`Backend`) and everything bundled for the phases (`Context`), shared by the runner and the
tree search (runner.py, tree_eval.py), and the seed of each generation phase's stream (`stream_seed`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from scalerl.evaluation.scorer_training import ScorerTrainingConfig

if TYPE_CHECKING:
    from scalerl.config import JobSpec
    from scalerl.console import Progress
    from scalerl.generator.engine import LengthControl, SamplingParams
    from scalerl.messages import Completion
    from scalerl.tasks import Task
    from scalerl.verifier.verifier import Verifier


class Backend(Protocol):
    """A generator: n completions for each prompt, prompt-major."""

    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingParams,
                 length: LengthControl) -> list[Completion]: ...

    def use_stream(self, name: str) -> None:
        """Draw what follows from the eval seed's stream `name` (one per generation phase)."""
        ...


def stream_seed(seed: int, name: str) -> int:
    """The torch seed of stream `name` of the eval seed: a 63-bit integer fixed by (seed, name) alone
    (string seeding of `random.Random` hashes with SHA-512, independent of PYTHONHASHSEED)."""
    return random.Random(f"{seed}/{name}").getrandbits(63)


@dataclass(frozen=True, slots=True)
class EvalOptions:
    strategies: tuple[str, ...]
    ks: tuple[int, ...]
    samples: int
    temperature: float
    top_p: float = 1.0
    seed: int = 0
    scorer: str | None = None
    """"train", a folder, or None: the checkpoint's own scorer if it has one, else train one."""
    scorer_training: ScorerTrainingConfig = field(default_factory=ScorerTrainingConfig)
    max_thinking: tuple[int, ...] = ()
    min_thinking: int = 0
    max_waits: int = 0
    wait_text: str = "Wait"
    answer_prefix: str = ""
    tree_widths: tuple[int, ...] = (1, 2, 4)
    tree_expansions: int = 4
    tree_value: str = "scorer"
    """"scorer" (the learned outcome scorer), "prefix" (the value trained on partial states' Monte-Carlo
    labels, `resolve_prefix_value`) or "solver" (diagnostic upper bound: `SolverValue`)."""
    tree_calculator: bool = True
    tree_resample: int = 0
    tree_methods: tuple[str, ...] = ("unique",)
    """"unique" (search without replacement, `unique_search`) and/or "beam" (`tree_search.beam_search`)."""
    tree_budgets: tuple[int, ...] = (64, 128, 256, 512, 1024)
    """Generated tokens per problem at which the unique search is read (it runs to the largest)."""
    tree_prune: float | None = None
    """Unique search: drop states the value rates below this (None: keep every state)."""
    tree_value_weight: float = 0.0
    """Unique search: weigh states' unexplored mass by value^this in later draws (0: the policy alone)."""
    prompts_per_batch: int = 16
    show_progress: bool = True


@dataclass(slots=True)
class Context:
    spec: JobSpec
    task: Task
    verifier: Verifier
    tokenizer: Any
    policy: Any
    """The checkpoint's model (for training a scorer); the backend may serve it or not (grpc)."""
    backend: Backend
    checkpoint: Path
    opts: EvalOptions
    progress: Progress
