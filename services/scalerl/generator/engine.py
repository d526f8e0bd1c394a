"""The generation-engine interface shared by the torch and vLLM engines.

An engine samples completions for already-tokenised prompts and returns, per completion, the token
ids, the log-prob of each token under the weights that sampled it (FP32 head), the policy version of
each token, and a loss mask that is False on tokens the policy did not choose (the injected
interruption phrase). Weight updates arrive through `policy_source`, polled between decode steps: a
PipelineRL engine swaps weights in flight and keeps its KV cache (ScaleRL §2.1).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch

from scalerl.messages import Completion

# Called between decode steps; returns (version, state_dict) when newer weights exist, else None.
PolicySource = Callable[[], "tuple[int, dict[str, torch.Tensor]] | None"]


@dataclass(frozen=True, slots=True)
class LengthControl:
    """Per-request length rules (ScaleRL §2.9), in tokens.

    thinking_budget: thinking tokens allowed before `</think>` (hard cap when not interrupting).
    answer_budget: tokens allowed after `</think>` (or after the injected phrase).
    interruption_ids: the phrase injected at the cut (ends with `</think>`); None = no interruption
        (length-penalty mode: a sequence that exceeds the budgets is truncated, finish "length").
    window: [lo, hi] thinking tokens; each sequence's cut point is uniform in it.
    think_close_id / eos_id: token ids of `</think>` and end of sequence.
    """

    thinking_budget: int
    answer_budget: int
    think_close_id: int
    eos_id: int
    interruption_ids: tuple[int, ...] | None = None
    window: tuple[int, int] = (1, 1)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0


class GenerationEngine(ABC):
    """Samples completions; `version` is the policy version of the weights currently loaded."""

    version: int

    @abstractmethod
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams, length: LengthControl,
                 *, policy_source: PolicySource | None = None) -> list[Completion]:
        """One completion per prompt (repeat a prompt G times for a group)."""

    @abstractmethod
    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Swap in new weights (between decode steps when called from `policy_source`)."""

    @abstractmethod
    def decode(self, token_ids: list[int]) -> str:
        """Token ids -> text (special tokens kept, so `</think>` stays visible to the verifier)."""

    def completion_text(self, token_ids: list[int], eos_id: int) -> str:
        """The text the verifier reads: the completion without its closing EOS token."""
        return self.decode(token_ids[:-1] if token_ids and token_ids[-1] == eos_id else token_ids)
