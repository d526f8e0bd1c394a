"""Semantic validation of the records the roles consume: a well-typed record can still hold values that
would crash or corrupt a consumer (a token id past the vocabulary, arrays of different lengths, a NaN
log-prob, a policy version from the future). Every consumer checks what it reads with these rules before
using it; a record that fails goes to the dead-letter topic with the reason (`scalerl.bus.dlq`).

A reason is machine-readable: "<code>: <what was wrong>", where <code> is one of `REASON_CODES` (the part
before ":" is stable; the rest names the field, the value and what is allowed). Rules, in order:

- unknown_prompt: the prompt id is not one of the job's training/eval prompts;
- group_size: a group holds G completions (`generation.group_size`; `PromptTask.group_size` must equal G too);
- reward_count: a scored group has one reward and one correctness flag per completion;
- array_lengths: a completion's token_ids, logprobs, versions and loss_mask have equal lengths;
- too_long: a completion is at most `Limits.max_completion_tokens` long (and a prompt leaves room for a
  completion under the engine's positions: checked by the generator, which holds the tokenizer);
- token_out_of_range: every prompt and completion token id is in [0, vocab_size);
- non_finite_logprob / non_finite_reward: log-probs and rewards are finite;
- version_out_of_range: every token's policy version is in [0, current] (current: the newest version
  the consumer knows to exist; skipped when the consumer cannot know it, e.g. the verifier).

Pure logic (no I/O); `Limits.from_spec` builds the limits from the job spec and the vocabulary size.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from scalerl.messages import Completion, PromptTask, RolloutGroup, ScoredGroup

REASON_CODES = ("wrong_type", "unknown_prompt", "group_size", "reward_count", "array_lengths", "too_long",
                "token_out_of_range", "non_finite_logprob", "non_finite_reward", "version_out_of_range",
                "undecodable", "step_failed")


class InvalidRecord(ValueError):
    """A record that breaks one of the rules; `code` is one of `REASON_CODES`, str(exc) the full reason."""

    def __init__(self, code: str, detail: str) -> None:
        if code not in REASON_CODES:
            raise ValueError(f"unknown reason code {code!r}")
        super().__init__(f"{code}: {detail}")
        self.code = code


@dataclass(frozen=True, slots=True)
class Limits:
    """What a valid record must fit. vocab_size: token ids allowed, [0, vocab_size); group_size: G;
    max_completion_tokens: thinking + answer budget + the injected interruption phrase + (with tools) the
    observations of `environment.max_turns` calls (tokens);
    prompt_ids: the known prompt ids (None = not checked)."""

    vocab_size: int
    group_size: int
    max_completion_tokens: int
    prompt_ids: Collection[str] | None = None

    @classmethod
    def from_spec(cls, spec: Any, vocab_size: int, prompt_ids: Collection[str] | None = None) -> Limits:
        """The job's limits. The interruption phrase is bounded by its UTF-8 byte count (no tokenizer
        makes more tokens than bytes, byte-level BPE included)."""
        g, env = spec.generation, spec.environment
        phrase = len(g.interruption.phrase.encode("utf-8"))
        observations = env.max_turns * env.max_observation_tokens if env.tools else 0  # multi-turn episodes
        return cls(vocab_size=vocab_size, group_size=g.group_size,
                   max_completion_tokens=g.thinking_budget_tokens + g.answer_budget_tokens + phrase + observations,
                   prompt_ids=frozenset(prompt_ids) if prompt_ids is not None else None)


def check_prompt(task: PromptTask, limits: Limits) -> None:
    """The rules for a prompt task: known prompt id, group size G, an issue number ≥ 0."""
    if task.seq < 0:
        raise InvalidRecord("seq", f"task.seq = {task.seq}: an issue number is 1, 2, 3, ... (0: none)")
    if limits.prompt_ids is not None and task.prompt_id not in limits.prompt_ids:
        raise InvalidRecord("unknown_prompt", f"prompt_id {task.prompt_id[:80]!r} is not one of the job's prompts")
    if task.group_size != limits.group_size:
        raise InvalidRecord("group_size", f"task.group_size = {task.group_size}, the job's G is {limits.group_size}")


def _check_tokens(ids: list[int], vocab: int, where: str) -> None:
    for i, t in enumerate(ids):
        if not 0 <= t < vocab:
            raise InvalidRecord("token_out_of_range", f"{where} token {i} = {t}, allowed [0, {vocab})")


def check_completion(c: Completion, limits: Limits, where: str, current_version: int | None = None) -> None:
    """The rules for one completion (`where` names it in the reason, e.g. "completion 3")."""
    n = len(c.token_ids)
    lengths = {"logprobs": len(c.logprobs), "versions": len(c.versions), "loss_mask": len(c.loss_mask)}
    if any(v != n for v in lengths.values()):
        raise InvalidRecord("array_lengths", f"{where}: token_ids has {n} entries, "
                            + ", ".join(f"{k} {v}" for k, v in lengths.items()))
    if n > limits.max_completion_tokens:
        raise InvalidRecord("too_long", f"{where}: {n} tokens, allowed at most {limits.max_completion_tokens}")
    _check_tokens(c.token_ids, limits.vocab_size, where)
    for i, lp in enumerate(c.logprobs):
        if not math.isfinite(lp):
            raise InvalidRecord("non_finite_logprob", f"{where} logprob {i} = {lp}, allowed finite")
    hi = current_version if current_version is not None else math.inf
    for i, v in enumerate(c.versions):
        if not 0 <= v <= hi:
            raise InvalidRecord("version_out_of_range",
                                f"{where} token {i} has policy version {v}, allowed [0, {current_version}]")


def check_rollout(group: RolloutGroup, limits: Limits, current_version: int | None = None) -> None:
    """The rules for a rollout group (see the module docstring); raises InvalidRecord."""
    check_prompt(group.task, limits)
    if len(group.completions) != limits.group_size:
        raise InvalidRecord("group_size", f"{len(group.completions)} completions, the job's G is {limits.group_size}")
    _check_tokens(group.prompt_token_ids, limits.vocab_size, "prompt")
    for i, c in enumerate(group.completions):
        check_completion(c, limits, f"completion {i}", current_version)


def check_scored(group: ScoredGroup, limits: Limits, current_version: int | None = None) -> None:
    """The rules for a scored group: its rollout's, one finite reward and one flag per completion."""
    n = len(group.rollout.completions)
    if len(group.rewards) != n or len(group.correct) != n:
        raise InvalidRecord("reward_count", f"{len(group.rewards)} rewards and {len(group.correct)} correct flags "
                            f"for {n} completions")
    for i, r in enumerate(group.rewards):
        if not math.isfinite(r):
            raise InvalidRecord("non_finite_reward", f"reward {i} = {r}, allowed finite")
    check_rollout(group.rollout, limits, current_version)


def reason_for(value: Any, expected: type, limits: Limits, current_version: int | None = None) -> str | None:
    """None when `value` is a valid `expected` record, else the reason it is not (see the module docstring)."""
    if not isinstance(value, expected):
        return f"wrong_type: expected {expected.__name__}, got {type(value).__name__}"
    try:
        if isinstance(value, ScoredGroup):
            check_scored(value, limits, current_version)
        elif isinstance(value, RolloutGroup):
            check_rollout(value, limits, current_version)
        elif isinstance(value, PromptTask):
            check_prompt(value, limits)
    except InvalidRecord as exc:
        return str(exc)
    return None
