"""Training the learned outcome scorer on the policy's own rollouts (labels from the rule verifier).

Recipe (an outcome verifier in the style of Cobbe et al. 2021, at toy scale):

1. Rollouts: the policy samples `samples_per_prompt` completions for `prompts` *training* problems
   (never the held-out ones the scorer is evaluated on); the rule verifier labels each correct (1) or
   not (0). The reference answer is used here, for labels only.
2. Model: the policy, frozen, with a small MLP value head (`scorer.ValueHeadModel`); the head's
   inputs are computed once per rollout (one forward pass of the policy), so training is cheap.
3. Loss: binary cross-entropy of the value logit against the label at every position from the last
   prompt token to the last completion token (a token-level value), averaged per sequence, then over
   the batch. AdamW, linear warm-up then cosine decay.
4. Held-out check: a `heldout_fraction` of the prompts (all their rollouts) is kept out of training;
   the AUC and accuracy of the final-token score on them are reported in `scorer.json`.

Partial-state value (`train_prefix_value`, for the tree search): the same head, trained on search
states rather than whole completions. The policy's own chains (with the search's calculator) on training
problems give the states; each state prefix is labelled with the fraction of that problem's chains through
it that the verifier accepted (`prefix_value_labels`: Monte-Carlo value labels from outcomes, as
Math-Shepherd's soft estimate; no solver, no reference answer beyond the outcome), and the loss is taken
at the state's last token only, the position the search scores.

Why a frozen policy and not a fine-tuned copy: on the quickstart, a fine-tuned copy (trunk + linear
head, 300 steps on ~3k rollouts) learned only which prompts are hard: its scores barely moved within
a problem, so best-of-16 picked the one distinct wrong answer among identical right ones and fell
below random selection. The policy's log-probs of the tokens it read separate right from wrong
samples of the same problem (the slips are low-probability tokens), and the head learns how.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import torch

from scalerl.evaluation.scorer import OutcomeScorer, ValueHeadModel, encode_pair, right_pad

_R = TypeVar("_R", "LabelledRollout", "LabelledPrefix")


class ScorerDataError(ValueError):
    """The policy's own samples give a scorer nothing to learn from (one-line message)."""


@dataclass(frozen=True, slots=True)
class ScorerTrainingConfig:
    prompts: int = 384
    """Training problems the policy samples for the scorer's data."""
    samples_per_prompt: int = 8
    steps: int = 300
    batch_size: int = 64
    lr: float = 3e-3
    heldout_fraction: float = 0.1
    seed: int = 0


@dataclass(frozen=True, slots=True)
class LabelledRollout:
    prompt_id: str
    prompt: str
    completion: str
    correct: bool


@dataclass(frozen=True, slots=True)
class LabelledPrefix:
    """A partial completion (a search state) with its Monte-Carlo value label in [0, 1]."""

    prompt_id: str
    prompt: str
    prefix: str
    value: float


def prefix_value_labels(chains: Sequence[tuple[str, str, Sequence[str], bool]]) -> list[LabelledPrefix]:
    """Monte-Carlo value labels for every state prefix of the policy's own chains, from outcomes only.

    `chains`: (prompt id, prompt, the chain's state prefixes in order, whether it was verified correct).
    A prefix's label is the fraction of that problem's chains through it that ended correct (Math-Shepherd's
    soft estimate, with the policy's own chains as the completions); no solver, no reference answer
    beyond the outcome. One example per distinct (problem, prefix), in first-seen order.
    """
    tally: dict[tuple[str, str], list[int]] = {}
    prompts: dict[str, str] = {}
    for pid, prompt, states, ok in chains:
        prompts[pid] = prompt
        for prefix in dict.fromkeys(states):
            hits = tally.setdefault((pid, prefix), [0, 0])
            hits[0] += int(ok)
            hits[1] += 1
    return [LabelledPrefix(pid, prompts[pid], prefix, ok / n) for (pid, prefix), (ok, n) in tally.items()]


def auc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """Area under the ROC curve (Mann–Whitney, ties count 1/2); None without both classes."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    if not pos or not neg:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def within_problem_auc(scores: Sequence[float], labels: Sequence[bool],
                       groups: Sequence[str]) -> tuple[float | None, int]:
    """The mean AUC within a group (problem), over the groups with both labels, and how many those are."""
    by_group: dict[str, list[tuple[float, bool]]] = {}
    for s, y, g in zip(scores, labels, groups, strict=True):
        by_group.setdefault(g, []).append((s, y))
    within = [a for pairs in by_group.values() if (a := auc([s for s, _ in pairs], [y for _, y in pairs])) is not None]
    return (sum(within) / len(within) if within else None), len(within)


def _split(rollouts: Sequence[_R], fraction: float, seed: int) -> tuple[list[_R], list[_R]]:
    ids = sorted({r.prompt_id for r in rollouts})
    random.Random(seed).shuffle(ids)
    held = set(ids[:round(fraction * len(ids))])
    return [r for r in rollouts if r.prompt_id not in held], [r for r in rollouts if r.prompt_id in held]


def _loss(model: ValueHeadModel, feats_NLF: torch.Tensor, valued_NL: torch.Tensor,
          labels_N: torch.Tensor) -> torch.Tensor:
    """Token-level BCE: every valued position predicts the sequence's label; mean per sequence, then batch."""
    logits_NL = model(feats_NLF)
    bce_NL = torch.nn.functional.binary_cross_entropy_with_logits(
        logits_NL, labels_N.unsqueeze(1).expand_as(logits_NL), reduction="none")
    per_seq_N = (bce_NL * valued_NL).sum(-1) / valued_NL.sum(-1)
    return per_seq_N.mean()


def _featurise(model: ValueHeadModel, tokenizer: Any, items: Sequence[tuple[str, str, float]], device: torch.device,
               *, last_only: bool = False, batch: int = 128) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per (prompt, completion, label): (features [T, F] for the valued positions, none padded: every
    position from the last prompt token, or only the last one) and the label as a tensor."""
    out = []
    for start in range(0, len(items), batch):
        chunk = items[start:start + batch]
        pairs = [encode_pair(tokenizer, prompt, completion) for prompt, completion, _ in chunk]
        ids, mask = right_pad([seq for seq, _ in pairs], tokenizer.pad_token_id)
        feats_NLF = model.features(ids.to(device), mask.to(device), torch.tensor([n for _, n in pairs], device=device))
        for i, ((seq, n_prompt), (_, _, label)) in enumerate(zip(pairs, chunk, strict=True)):
            first = len(seq) - 1 if last_only else n_prompt - 1
            out.append((feats_NLF[i, first:len(seq)].cpu(), torch.tensor(float(label))))
    return out


def _stack(examples: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """features [N, T, F] (zero-padded), valued mask [N, T], labels [N]."""
    T = max(f.shape[0] for f, _ in examples)
    feats = torch.zeros((len(examples), T, examples[0][0].shape[1]))
    valued = torch.zeros((len(examples), T))
    for i, (f, _) in enumerate(examples):
        feats[i, :f.shape[0]] = f
        valued[i, :f.shape[0]] = 1.0
    return feats, valued, torch.stack([y for _, y in examples])


def train_outcome_scorer(policy: Any, tokenizer: Any, rollouts: Sequence[LabelledRollout], cfg: ScorerTrainingConfig,
                         *, on_step: Callable[[int, float], None] | None = None) -> OutcomeScorer:
    """Fit a value head on a frozen copy of the policy to the rollouts' labels (every position)."""
    if not rollouts:
        raise ScorerDataError("the outcome scorer needs rollouts to train on (the policy produced none)")
    train, held = _split(rollouts, cfg.heldout_fraction, cfg.seed)
    model, losses = _fit(policy, tokenizer, [(r.prompt, r.completion, float(r.correct)) for r in train], cfg,
                         last_only=False, on_step=on_step)
    scorer = OutcomeScorer(model, tokenizer, meta={
        "training": asdict(cfg), "rollouts": len(rollouts), "train_rollouts": len(train),
        "positive_rate": sum(r.correct for r in rollouts) / len(rollouts),
        "final_loss_nats": sum(losses[-20:]) / len(losses[-20:]) if losses else None})
    if held:
        scorer.meta.update(heldout_metrics(scorer, held))
    return scorer


def train_prefix_value(policy: Any, tokenizer: Any, prefixes: Sequence[LabelledPrefix], cfg: ScorerTrainingConfig,
                       *, on_step: Callable[[int, float], None] | None = None
                       ) -> tuple[OutcomeScorer, list[LabelledPrefix]]:
    """Fit a value head on a frozen copy of the policy to partial states' Monte-Carlo labels
    (`prefix_value_labels`), the loss at the state's last token only: the position the search scores.
    Returns the scorer and the held-out prefixes (a `heldout_fraction` of the problems)."""
    if not prefixes:
        raise ScorerDataError("the prefix value needs labelled prefixes to train on: the policy wrote no legal "
                              "step in its chains (try --tree-value scorer or solver)")
    train, held = _split(prefixes, cfg.heldout_fraction, cfg.seed)
    model, losses = _fit(policy, tokenizer, [(x.prompt, x.prefix, x.value) for x in train], cfg, last_only=True,
                         on_step=on_step)
    scorer = OutcomeScorer(model, tokenizer, meta={
        "kind": "outcome", "value": "prefix-monte-carlo", "training": asdict(cfg), "prefixes": len(prefixes),
        "train_prefixes": len(train), "mean_label": sum(x.value for x in prefixes) / len(prefixes),
        "final_loss_nats": sum(losses[-20:]) / len(losses[-20:]) if losses else None})
    if held:
        values = scorer.score([x.prompt for x in held], [x.prefix for x in held]).values
        scorer.meta.update({
            "heldout_prefixes": len(held), "heldout_auc_vs_mc_label": auc(values, [x.value >= 0.5 for x in held]),
            "heldout_mse_vs_mc_label": sum((v - x.value) ** 2 for v, x in zip(values, held, strict=True)) / len(held)})
    return scorer, held


def _fit(policy: Any, tokenizer: Any, items: Sequence[tuple[str, str, float]], cfg: ScorerTrainingConfig, *,
         last_only: bool, on_step: Callable[[int, float], None] | None) -> tuple[ValueHeadModel, list[float]]:
    """The value head's training loop (see the module docstring); the model in eval mode and the losses."""
    device = next(policy.parameters()).device
    torch.manual_seed(cfg.seed)
    model = ValueHeadModel(copy.deepcopy(policy)).to(device)
    examples = _featurise(model, tokenizer, items, device, last_only=last_only)
    opt = torch.optim.AdamW(model.head.parameters(), lr=cfg.lr, weight_decay=0.01)
    warm = max(1, cfg.steps // 20)

    def lr_at(s: int) -> float:
        return (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, cfg.steps - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    rng = random.Random(cfg.seed)
    losses: list[float] = []
    for step in range(cfg.steps):
        feats, valued, labels = _stack([examples[rng.randrange(len(examples))] for _ in range(cfg.batch_size)])
        loss = _loss(model, feats.to(device), valued.to(device), labels.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step, losses[-1])
    model.eval()
    return model, losses


def heldout_metrics(scorer: OutcomeScorer, held: Sequence[LabelledRollout]) -> dict[str, Any]:
    """Pooled AUC and accuracy at 0.5 of the final score, and the mean AUC within a problem (what
    best-of-N needs: ranking one problem's samples, not telling easy problems from hard ones)."""
    values = scorer.score([r.prompt for r in held], [r.completion for r in held]).values
    labels = [r.correct for r in held]
    within, problems = within_problem_auc(values, labels, [r.prompt_id for r in held])
    return {"heldout_rollouts": len(held), "heldout_auc": auc(values, labels),
            "heldout_accuracy": sum((v >= 0.5) == y for v, y in zip(values, labels, strict=True)) / len(held),
            "heldout_within_problem_auc": within, "heldout_problems_with_both_labels": problems}
