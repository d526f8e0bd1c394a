"""The generation-engine interface shared by the torch and vLLM engines.

An engine samples completions for already-tokenised prompts and returns, per completion, the token
ids, the log-prob of each token under the weights that sampled it (FP32 head), the policy version of
each token, and a loss mask that is False on tokens the policy did not choose (the injected
interruption phrase, budget forcing's delimiter and "Wait" tokens). Weight updates arrive through
`policy_source`, polled between decode steps: a PipelineRL engine swaps weights in flight and keeps its
KV cache (ScaleRL §2.1).

Budget forcing (s1, spec §7.3) is the training-time interruption with other settings, not a second
mechanism (`budget_forcing`): the maximum is an interruption whose phrase is the end-of-thinking
delimiter (plus an optional answer prefix) and whose cut is fixed at the budget; the minimum replaces
a sampled `</think>` that comes too early by forced "Wait" tokens, through the same forced-token phase.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

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
    think_close_ids: the token sequence of `</think>`: one id where the tokenizer has it as a special
        token (Qwen3-style), several where it is ordinary text (SmolLM2's BPE: "</", "think", ">").
        Thinking ends on the token that completes it (the generated suffix equals the sequence); it is
        also what budget forcing's maximum forces.
    think_close_alts: further spellings of `</think>` that also end thinking (a BPE tokenizer spells it
        differently after a space, e.g. " </", "think", ">"); see `scalerl.model.text`.
    eos_id: the end-of-sequence id; end_ids: further ids that end a sequence like it (end-of-turn
        tokens of a chat model, e.g. `<|im_end|>`, `<|endoftext|>`).
    min_thinking: budget forcing's minimum: a sampled `</think>` after fewer thinking tokens than this
        is replaced by `wait_ids` (forced, loss-masked), at most `max_waits` times per sequence.
    wait_ids: the tokens forced in place of an early `</think>` (s1: "Wait").
    max_waits: m, the most suppressions per sequence (0 = the minimum is off).
    stop_ids: thinking tokens that end a sequence (finish "stop"), e.g. the step separator when a
        tree search samples one reasoning step at a time.
    stop_sequences: token sequences that end a sequence in thinking (finish "stop") on the token that
        completes one, matched like a multi-token `</think>`: the spellings of a tool call's closing tag
        (`scalerl.environment`: the episode runs the call and continues the sequence with `Resume`).

    Thinking tokens count every token before the answer phase, forced "Wait" tokens included (the
    `</think>` that closes thinking is counted too, as before). Budget forcing's minimum with a
    multi-token `</think>` replaces the token that would complete it; the tokens before it stay.
    """

    thinking_budget: int
    answer_budget: int
    think_close_ids: tuple[int, ...]
    eos_id: int
    end_ids: tuple[int, ...] = ()
    think_close_alts: tuple[tuple[int, ...], ...] = ()
    interruption_ids: tuple[int, ...] | None = None
    window: tuple[int, int] = (1, 1)
    min_thinking: int = 0
    wait_ids: tuple[int, ...] = ()
    max_waits: int = 0
    stop_ids: tuple[int, ...] = ()
    stop_sequences: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        lo, hi = self.window
        if not 0 <= lo <= hi:
            raise ValueError(f"window must satisfy 0 <= lo <= hi, got {self.window}")
        if self.min_thinking < 0 or self.max_waits < 0:
            raise ValueError(f"min_thinking and max_waits must be >= 0, got {self.min_thinking}, {self.max_waits}")
        if self.max_waits > 0 and not self.wait_ids:
            raise ValueError("max_waits > 0 needs wait_ids (the tokens forced in place of an early </think>)")
        if not self.think_close_ids or any(not alt for alt in self.think_close_alts):
            raise ValueError("think_close_ids and every think_close_alts entry need at least one token id")
        if any(not seq for seq in self.stop_sequences):
            raise ValueError("every stop_sequences entry needs at least one token id")

    @property
    def close_sequences(self) -> tuple[tuple[int, ...], ...]:
        """Every token sequence that ends thinking, the canonical `think_close_ids` first."""
        return (self.think_close_ids, *(a for a in self.think_close_alts if a != self.think_close_ids))

    @property
    def all_end_ids(self) -> tuple[int, ...]:
        """EOS and the end-of-turn ids: any of them ends a sequence."""
        return (self.eos_id, *(i for i in self.end_ids if i != self.eos_id))

    @property
    def forces_minimum(self) -> bool:
        return self.min_thinking > 0 and self.max_waits > 0


@dataclass(frozen=True, slots=True)
class Resume:
    """Where a sequence continues from (an episode's next turn, `scalerl.generator.episode`): the
    thinking tokens its earlier turns counted and the cut point drawn for it at its first turn (the
    thinking token at which it is interrupted, or truncated without interruption). The engine's own
    draw of the cut is still made, so the sampling stream does not depend on it."""

    thinking_used: int
    cut: int

    def __post_init__(self) -> None:
        if self.thinking_used < 0 or self.cut < 0:
            raise ValueError(f"need thinking_used >= 0 and cut >= 0, got {self.thinking_used}, {self.cut}")


def ends_with_any(token_ids: Sequence[int], sequences: Sequence[Sequence[int]]) -> bool:
    """`token_ids` ends with one of `sequences`."""
    return any(0 < len(seq) <= len(token_ids) and tuple(token_ids[-len(seq):]) == tuple(seq) for seq in sequences)


def close_end(token_ids: Sequence[int], length: LengthControl) -> int | None:
    """The index just after the first `</think>` (any spelling) in `token_ids`, or None."""
    for end in range(1, len(token_ids) + 1):
        if any(tuple(token_ids[max(0, end - len(seq)):end]) == seq for seq in length.close_sequences):
            return end
    return None


def budget_forcing(base: LengthControl, *, max_thinking: int | None = None, answer_prefix_ids: Sequence[int] = (),
                   min_thinking: int = 0, wait_ids: Sequence[int] = (), max_waits: int = 0) -> LengthControl:
    """s1 budget forcing expressed as length rules (spec §7.3).

    Maximum: after `max_thinking` thinking tokens the delimiter `</think>` (then `answer_prefix_ids`,
    e.g. "Final Answer:") is forced: an interruption whose phrase is the delimiter and whose cut is
    fixed at `max_thinking` instead of drawn from a window; the answer budget then applies as after
    a training-time interruption. Without `max_thinking` the base rules (the job's interruption
    window and budget) stay. Minimum: `min_thinking`, `wait_ids`, `max_waits` (see LengthControl).
    """
    out = base
    if max_thinking is not None:
        if max_thinking < 1:
            raise ValueError(f"max_thinking must be >= 1, got {max_thinking}")
        out = replace(out, thinking_budget=max_thinking, window=(max_thinking, max_thinking),
                      interruption_ids=(*base.think_close_ids, *answer_prefix_ids))
    return replace(out, min_thinking=min_thinking, wait_ids=tuple(wait_ids), max_waits=max_waits)


def budget_forcing_of(length: LengthControl) -> dict[str, Any] | None:
    """The `budget_forcing` arguments that made `length` from its base rules (the inverse of
    `budget_forcing`, for sending the rules to a generator service), or None when it has none: a
    maximum is an interruption whose phrase starts with `</think>` at a fixed cut."""
    phrase = length.interruption_ids or ()
    close = length.think_close_ids
    forced_max = phrase[:len(close)] == close and length.window[0] == length.window[1]
    if not forced_max and not (length.min_thinking or length.wait_ids or length.max_waits):
        return None
    return {"max_thinking": length.window[0] if forced_max else None,
            "answer_prefix_ids": tuple(phrase[len(close):]) if forced_max else (),
            "min_thinking": length.min_thinking, "wait_ids": tuple(length.wait_ids), "max_waits": length.max_waits}


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """temperature 0 means greedy decoding (argmax; the recorded log-prob is that of the T = 1
    distribution)."""

    temperature: float = 1.0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got {self.temperature}, {self.top_p}")


class GenerationEngine(ABC):
    """Samples completions; `version` is the policy version of the weights currently loaded;
    `swaps_in_flight` counts weight swaps that happened inside a generate() call."""

    version: int
    swaps_in_flight: int

    @property
    @abstractmethod
    def max_positions(self) -> int:
        """The longest sequence (prompt + completion, tokens) the engine's model takes."""

    @abstractmethod
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams, length: LengthControl,
                 *, policy_source: PolicySource | None = None,
                 resume: Sequence[Resume] | None = None) -> list[Completion]:
        """One completion per prompt (repeat a prompt G times for a group). `resume`, one per prompt:
        each prompt ends with earlier turns of its sequence, whose thinking count and cut carry on."""

    @abstractmethod
    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Swap in new weights (between decode steps when called from `policy_source`)."""

    @abstractmethod
    def reseed(self, seed: int) -> None:
        """Restart the engine's sampling stream from `seed` (what the constructor's seed does)."""

    @abstractmethod
    def decode(self, token_ids: list[int]) -> str:
        """Token ids -> text (special tokens kept, so `</think>` stays visible to the verifier)."""

    def completion_text(self, token_ids: list[int], end_ids: Sequence[int]) -> str:
        """The text the verifier reads: the completion without its closing EOS / end-of-turn token."""
        return self.decode(token_ids[:-1] if token_ids and token_ids[-1] in end_ids else token_ids)
