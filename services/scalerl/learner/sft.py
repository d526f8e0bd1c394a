"""Supervised warm start on gold chains of thought (RL needs a non-zero starting pass rate).

Each example is BOS + prompt + solution + EOS; the loss is the mean next-token cross-entropy over the
solution and EOS tokens only (the prompt is context). AdamW with linear warm-up and cosine decay.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import torch

from scalerl.config import SFTConfig
from scalerl.model.factory import sequence_logprobs
from scalerl.model.text import encode_prompt, text_ids


def sft_examples(tokenizer: Any, pairs: list[tuple[str, str]]) -> list[tuple[list[int], int]]:
    """(prompt, solution) -> (token ids, index of the first solution token). The prompt is encoded as
    the generator encodes it (`scalerl.model.text.encode_prompt`: chat template or BOS + text)."""
    eos = tokenizer.eos_token_id
    out = []
    for prompt, solution in pairs:
        head = encode_prompt(tokenizer, prompt)
        out.append(([*head, *text_ids(tokenizer, solution), eos], len(head)))
    return out


class _LazyExamples:
    """`sft_examples` of the pairs a step draws, each encoded once when first drawn: a short SFT (a smoke
    run's 5 steps) does not tokenize all 20k training pairs first (9 s of CPU on the quickstart)."""

    def __init__(self, tokenizer: Any, pairs: list[tuple[str, str]]) -> None:
        self.tokenizer, self.pairs = tokenizer, pairs
        self.done: dict[int, tuple[list[int], int]] = {}

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> tuple[list[int], int]:
        if i not in self.done:
            self.done[i] = sft_examples(self.tokenizer, [self.pairs[i]])[0]
        return self.done[i]


def run_sft(model: Any, tokenizer: Any, pairs: list[tuple[str, str]], cfg: SFTConfig, *, seed: int,
            fp32_head: bool = True, on_step: Callable[[int, float], None] | None = None) -> list[float]:
    """Train in place for `cfg.steps` steps; returns the loss per step (nats/token)."""
    examples = _LazyExamples(tokenizer, pairs)
    if not pairs:
        raise ValueError("SFT needs problems with gold solutions (this task provides none)")
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
        for i, (ids, start) in enumerate(batch):
            n = len(ids) - 1
            inp[i, :n] = torch.tensor(ids[:-1])
            tgt[i, :n] = torch.tensor(ids[1:])
            att[i, :n] = 1
            msk[i, start - 1:n] = True
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
