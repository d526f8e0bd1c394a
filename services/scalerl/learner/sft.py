"""Supervised warm start on gold chains of thought (RL needs a non-zero starting pass rate).

Each example is BOS + prompt + solution + EOS; the loss is the mean next-token cross-entropy over the
solution and EOS tokens only (the prompt is context). A tool demonstration (`encode_demonstration`) is a
prompt and model turns with the tools' answers between them: the answers are context too, out of the
loss, as they are out of RL's. AdamW with linear warm-up and cosine decay.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import torch

from scalerl.config import SFTConfig
from scalerl.model.factory import sequence_logprobs
from scalerl.model.text import encode_prompt, text_ids

Example = tuple[list[int], list[bool]]
"""(token ids, loss mask): True on the tokens the loss is on (the model's), False on context."""
T = TypeVar("T")


def sft_examples(tokenizer: Any, pairs: list[tuple[str, str]]) -> list[Example]:
    """(prompt, solution) -> (token ids, loss mask on the solution and EOS). The prompt is encoded as the
    generator encodes it (`scalerl.model.text.encode_prompt`: chat template or BOS + text)."""
    return [encode_demonstration(tokenizer, prompt, [solution], observe=_no_calls) for prompt, solution in pairs]


def _no_calls(turn: str) -> list[int]:
    raise AssertionError("a one-turn example has no observation")


def encode_demonstration(tokenizer: Any, prompt: str, turns: Sequence[str],
                         observe: Callable[[str], list[int]]) -> Example:
    """The prompt (context), then each model turn (loss on), each but the last followed by `observe(turn)`:
    the tokens of the answer to the tool call the turn ends with (context), then EOS (loss on).

    Shapes: `turns` has n >= 1 texts; the example has len(prompt) + sum(len(turn_i)) + sum over the first
    n - 1 turns of len(observation_i) + 1 tokens, and a mask of the same length."""
    if not turns:
        raise ValueError("a demonstration needs at least one model turn")
    ids = list(encode_prompt(tokenizer, prompt))
    mask = [False] * len(ids)
    for i, turn in enumerate(turns):
        said = list(text_ids(tokenizer, turn))
        ids += said
        mask += [True] * len(said)
        if i < len(turns) - 1:
            heard = observe(turn)
            ids += heard
            mask += [False] * len(heard)
    ids.append(tokenizer.eos_token_id)
    mask.append(True)
    return ids, mask


class _LazyExamples(Generic[T]):
    """`encode(item)` of the items a step draws, each encoded once when first drawn: a short SFT (a smoke
    run's 5 steps) does not tokenize all 20k training pairs first (9 s of CPU on the quickstart)."""

    def __init__(self, items: Sequence[T], encode: Callable[[T], Example]) -> None:
        self.items, self.encode = items, encode
        self.done: dict[int, Example] = {}

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Example:
        if i not in self.done:
            self.done[i] = self.encode(self.items[i])
        return self.done[i]


def run_sft(model: Any, tokenizer: Any, pairs: Sequence[T], cfg: SFTConfig, *, seed: int,
            fp32_head: bool = True, on_step: Callable[[int, float], None] | None = None,
            encode: Callable[[T], Example] | None = None) -> list[float]:
    """Train in place for `cfg.steps` steps; returns the loss per step (nats/token). `pairs` are
    (prompt, solution) pairs, or any items `encode` turns into examples (`encode_demonstration`)."""
    if not pairs:
        raise ValueError("SFT needs problems with gold solutions (this task provides none)")

    def plain(pair: Any) -> Example:
        return sft_examples(tokenizer, [pair])[0]

    examples = _LazyExamples(pairs, encode or plain)
    device = next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.98))
    warm = max(1, cfg.steps // 20)

    def lr_at(s: int) -> float:
        if s < warm:
            return (s + 1) / warm
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, cfg.steps - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    rng = random.Random(seed)
    pad = tokenizer.pad_token_id
    losses = []
    model.train()
    for step in range(cfg.steps):
        batch = [examples[rng.randrange(len(examples))] for _ in range(cfg.batch_size)]
        L = max(len(ids) for ids, _ in batch) - 1
        inp = torch.full((len(batch), L), pad, dtype=torch.long)
        tgt = torch.full((len(batch), L), pad, dtype=torch.long)
        att = torch.zeros((len(batch), L), dtype=torch.long)
        msk = torch.zeros((len(batch), L), dtype=torch.bool)
        for i, (ids, on) in enumerate(batch):
            n = len(ids) - 1
            inp[i, :n] = torch.tensor(ids[:-1])
            tgt[i, :n] = torch.tensor(ids[1:])
            att[i, :n] = 1
            msk[i, :n] = torch.tensor(on[1:])  # the loss on predicting token t + 1 where it is the model's
        m = msk.to(device)
        logp, _ = sequence_logprobs(model, inp.to(device), att.to(device), tgt.to(device), fp32_head=fp32_head,
                                    where=m)
        loss = -(logp * m).sum() / m.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step, losses[-1])
    model.eval()
    return losses
