"""Scorers for best-of-N and tree search: rate a (prompt, completion) pair without the reference answer.

`Scorer` is the interface (text in, one score per pair out, plus the tokens it read), so a real
reward model plugs in beside ours:

- `OutcomeScorer`: the learned outcome scorer, a small value head on the (frozen) policy model
  (`ValueHeadModel`: one logit per position from the hidden state and the policy's log-probs of the
  tokens read), trained on the policy's own rollouts labelled by the rule verifier
  (`scorer_training.train_outcome_scorer`). The logit at position t estimates P(correct | prompt,
  completion[:t]), as in Cobbe et al. 2021's token-level verifier, so the same scorer rates finished
  completions (best-of-N) and partial ones (the value of a tree-search state). It never sees the
  reference answer: its input is the prompt and the completion only.
- `SequenceClassifierScorer`: any local Hugging Face `*ForSequenceClassification` reward model
  (num_labels 1: the logit; 2: logit of label 1 minus label 0).

`load_scorer(folder)` opens either kind. An outcome scorer lives in `<checkpoint>/scorer/`:
`config.json` + `model.safetensors` (the frozen policy, a causal LM) + the tokenizer,
`value_head.safetensors`, and `scorer.json` (how it was trained and how well it separates held-out
rollouts).

Legend: N = sequences, L = padded length, H = hidden size.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import load_file, save_file

from scalerl.evaluation.checkpoints import SCORER_META, is_sequence_classifier
from scalerl.generator.role import encode_prompt
from scalerl.model.factory import lm_head_logits, save_model_and_tokenizer, trunk_of

HEAD_FILE = "value_head.safetensors"


@dataclass(slots=True)
class Scores:
    values: list[float]
    """One score per pair; higher means more likely correct (a probability for `OutcomeScorer`)."""
    forward_tokens: list[int]
    """Tokens the scorer read per pair (its cost, reported apart from generated tokens)."""


class Scorer(Protocol):
    """Rates (prompt, completion) pairs; must not use the reference answer."""

    name: str

    def score(self, prompts: Sequence[str], completions: Sequence[str]) -> Scores:
        """One score per pair (`completions` may be partial: a tree search scores prefixes)."""
        ...


N_LOGP_FEATURES = 3  # log-prob of the token just read, running min and running mean over the completion


class ValueHeadModel(torch.nn.Module):
    """A frozen causal LM (the policy) with a small trained value head.

    At every position t the head reads the LM's last hidden state h_t together with the policy's own
    confidence in what it has read: log π(token_t | prefix), and the running min and mean of that
    log-prob over the completion so far (0 before the first completion token). Copy or arithmetic
    slips are low-probability tokens under the policy that made them, so these features carry most of
    the signal; h_t carries the problem and the position. Output: logits [N, L].
    """

    def __init__(self, lm: Any, *, width: int = 32) -> None:
        super().__init__()
        self.lm = lm.eval().requires_grad_(False)
        hidden = int(lm.config.hidden_size)
        self.head = torch.nn.Sequential(torch.nn.Linear(hidden + N_LOGP_FEATURES, width), torch.nn.GELU(),
                                        torch.nn.Linear(width, 1))

    @torch.no_grad()
    def features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 prompt_lens: torch.Tensor) -> torch.Tensor:
        """[N, L, H + 3] float32 from right-padded ids/mask [N, L] and prompt lengths [N] (BOS included)."""
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        out = trunk_of(self.lm)(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                                use_cache=False)
        hidden_NLH = out.last_hidden_state.float()
        logp_NLV = torch.log_softmax(lm_head_logits(self.lm, hidden_NLH[:, :-1], True).float(), dim=-1)
        read_NL = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
        read_NL[:, 1:] = logp_NLV.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # log π(token_t | <t)
        t_L = torch.arange(input_ids.shape[1], device=input_ids.device)
        completion_NL = (t_L >= prompt_lens.unsqueeze(1)) & attention_mask.bool()
        read_NL = torch.where(completion_NL, read_NL, 0.0)
        count_NL = completion_NL.long().cumsum(-1)
        mean_NL = read_NL.cumsum(-1) / count_NL.clamp(min=1)
        run_min_NL = torch.cummin(torch.where(completion_NL, read_NL, torch.inf), dim=-1).values
        run_min_NL = torch.where(count_NL > 0, run_min_NL, 0.0)
        return torch.cat([hidden_NLH, torch.stack([read_NL, run_min_NL, mean_NL], dim=-1)], dim=-1)

    def forward(self, features_NLF: torch.Tensor) -> torch.Tensor:
        logits_NL: torch.Tensor = self.head(features_NLF).squeeze(-1)
        return logits_NL


def encode_pair(tokenizer: Any, prompt: str, completion: str) -> tuple[list[int], int]:
    """BOS + prompt + completion token ids, and the number of prompt tokens (BOS included)."""
    head = encode_prompt(tokenizer, prompt)
    c = list(tokenizer(completion, add_special_tokens=False)["input_ids"]) if completion else []
    return [*head, *c], len(head)


def right_pad(seqs: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [N, L] right-padded with `pad`, attention mask [N, L]."""
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), L), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(list(s), dtype=torch.long)
        mask[i, :len(s)] = 1
    return ids, mask


class OutcomeScorer:
    """The learned outcome scorer (see the module docstring). Score = sigmoid(value at the last token)."""

    name = "outcome-scorer"

    def __init__(self, model: ValueHeadModel, tokenizer: Any, *, meta: dict[str, Any] | None = None,
                 batch_size: int = 64) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.meta = dict(meta or {})
        self.batch_size = batch_size
        self.device = next(model.parameters()).device

    @torch.no_grad()
    def score(self, prompts: Sequence[str], completions: Sequence[str]) -> Scores:
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions")
        pairs = [encode_pair(self.tokenizer, p, c) for p, c in zip(prompts, completions, strict=True)]
        values: list[float] = []
        for start in range(0, len(pairs), self.batch_size):
            chunk = pairs[start:start + self.batch_size]
            ids, mask = right_pad([seq for seq, _ in chunk], self.tokenizer.pad_token_id)
            prompt_lens = torch.tensor([n for _, n in chunk], device=self.device)
            feats_NLF = self.model.features(ids.to(self.device), mask.to(self.device), prompt_lens)
            logits_NL = self.model(feats_NLF)
            last_N = mask.sum(-1).to(self.device) - 1
            values += torch.sigmoid(logits_NL.gather(-1, last_N.unsqueeze(-1)).squeeze(-1)).tolist()
        return Scores(values=values, forward_tokens=[len(seq) for seq, _ in pairs])

    def save(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        save_model_and_tokenizer(self.model.lm, self.tokenizer, folder)
        save_file({k: v.detach().cpu().contiguous() for k, v in self.model.head.state_dict().items()},
                  str(folder / HEAD_FILE))
        first: Any = self.model.head[0]
        width = int(first.out_features)
        meta = {"kind": "outcome", "head_width": width, **self.meta}
        (folder / SCORER_META).write_text(json.dumps(meta, indent=2) + "\n")
        return folder


class SequenceClassifierScorer:
    """A Hugging Face sequence-classification reward model read from a local folder."""

    name = "sequence-classifier"

    def __init__(self, folder: str | Path, *, batch_size: int = 32, device: str | None = None) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(folder))
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        if device is not None:
            self.model.to(device)
        self.device = next(self.model.parameters()).device
        self.batch_size = batch_size

    @torch.no_grad()
    def score(self, prompts: Sequence[str], completions: Sequence[str]) -> Scores:
        seqs = [encode_pair(self.tokenizer, p, c)[0] for p, c in zip(prompts, completions, strict=True)]
        values: list[float] = []
        for start in range(0, len(seqs), self.batch_size):
            ids, mask = right_pad(seqs[start:start + self.batch_size], self.tokenizer.pad_token_id)
            logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits.float()
            col = logits[:, 0] if logits.shape[-1] == 1 else logits[:, 1] - logits[:, 0]
            values += col.tolist()
        return Scores(values=values, forward_tokens=[len(s) for s in seqs])


def load_scorer(folder: Path, *, device: torch.device | None = None) -> Scorer:
    """An `OutcomeScorer` (folder with scorer.json) or a `SequenceClassifierScorer`; ValueError otherwise."""
    if (folder / SCORER_META).is_file():
        from transformers import AutoModelForCausalLM, AutoTokenizer

        meta = json.loads((folder / SCORER_META).read_text())
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        lm = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, attn_implementation="sdpa")
        model = ValueHeadModel(lm, width=int(meta.get("head_width", 32)))
        model.head.load_state_dict(load_file(str(folder / HEAD_FILE)))
        if device is not None:
            model.to(device)
        return OutcomeScorer(model, tokenizer, meta=meta)
    if is_sequence_classifier(folder):
        return SequenceClassifierScorer(folder, device=None if device is None else str(device))
    raise ValueError(f"--scorer: {folder} is neither a scalerl outcome scorer (no {SCORER_META}) nor a Hugging "
                     "Face *ForSequenceClassification model folder")
