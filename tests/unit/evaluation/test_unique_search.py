"""The tree search without replacement (`unique_search`) against a policy whose distribution over whole
chains is written down: the draws are the policy's chains without repeats (exact known-answer
probabilities for the first two draws), every edge of the tree is paid once, the step rules end chains
where the calculator mode of the beam search would, a value prunes states, and the budget and the
per-budget reading behave. Plus the engine's next-token distribution against `generate`'s log-probs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from scalerl.evaluation.scorer import Scores
from scalerl.evaluation.tree_eval import solved_within_chains
from scalerl.evaluation.unique_search import UniqueResult, UniqueSearchConfig, accuracy_at, unique_search
from scalerl.generator.engine import SamplingParams
from scalerl.generator.role import encode_prompt
from scalerl.generator.torch_engine import TorchEngine
from scalerl.tasks import CountdownTask, Problem

PROMPT = "3 5 7 -> 22:"  # 5*3=15, 15+7=22
WIN = "5*3=15,15+7=22</think>5*3+7<eos>"
CHAINS = {  # the policy's whole chains (thinking, results included, then the answer) and their probabilities
    WIN: 0.1,
    "7+5=12,12*3=36": 0.5,  # one number left, not 22: lost
    "9+": 0.1,  # 9 is not in the pool: illegal at the operator
    "7+3=10</think>": 0.1,  # gives up on a pool without 22: lost
    "7*3=21,,": 0.2,  # a second "," where a step should start: malformed
}


class ChainPolicy:
    """Next-token probabilities induced by `chains`: P(t | x) = mass of chains extending x+t / mass of x.
    Forced tokens (results, the forced `</think>`) are in the texts: the search never asks about them."""

    def __init__(self, tokenizer, chains: dict[str, float]):
        self.tok = tokenizer
        self.seqs = [(self.ids(text), p) for text, p in chains.items()]
        self.prefix = len(encode_prompt(tokenizer, PROMPT)) + 1  # + <think>
        self.rows_seen = 0

    def ids(self, text: str) -> list[int]:
        return list(self.tok(text.replace("<eos>", ""), add_special_tokens=False)["input_ids"]) + (
            [self.tok.eos_token_id] if text.endswith("<eos>") else [])

    def __call__(self, rows: list[list[int]]) -> np.ndarray:
        out = np.zeros((len(rows), len(self.tok)))
        for r, row in enumerate(rows):
            x = row[self.prefix:]
            for seq, p in self.seqs:
                if seq[:len(x)] == x and len(seq) > len(x):
                    out[r, seq[len(x)]] += p
            assert out[r].sum() > 0, f"asked about a prefix no chain has: {self.tok.decode(x)!r}"
            out[r] /= out[r].sum()
        self.rows_seen += len(rows)
        return out


def _task():
    return CountdownTask(num_numbers=3, max_number=25, seed=0, train_size=1, eval_size=1)


def _problems(n: int = 1) -> list[Problem]:
    return [Problem(id=f"p{i}", prompt=PROMPT, answer="3 5 7 -> 22", solution="") for i in range(n)]


def test_explores_every_chain_once_and_pays_each_edge_once(tokenizer):
    chains = {k if k != WIN else WIN.replace("5*3+7", "5*3-7"): v for k, v in CHAINS.items()}  # no solution
    policy = ChainPolicy(tokenizer, chains)
    (r,) = unique_search(_problems(), _task(), next_probs=policy, tokenizer=tokenizer,
                         cfg=UniqueSearchConfig(budget=10_000, answer_budget=8))
    assert r.exhausted and r.solved_at is None and r.completion is None
    assert r.chains == 5  # five chains, none drawn twice
    assert r.outcomes == {"wrong_answer": 1, "lost": 2, "illegal": 1, "malformed": 1}
    seqs = [policy.ids(t) for t in chains]
    edges = {tuple(s[:i]) for s in seqs for i in range(1, len(s) + 1)}
    assert r.gen_tokens == len(edges)  # shared prefixes ("7", "7+", "7*"…) once
    # forced: 15, 22 and </think> (the won pool), 12, 36, 10, 21: the calculator's digits
    assert r.forced_tokens == 2 + 2 + 1 + 2 + 2 + 2 + 2
    assert policy.rows_seen == len(edges) - r.forced_tokens - r.chains + 1  # one call per node that has a child
    assert r.prefill_tokens >= policy.rows_seen * policy.prefix


def test_stops_at_the_verified_answer_and_reads_budgets(tokenizer):
    policy = ChainPolicy(tokenizer, {WIN: 1.0})
    (r,) = unique_search(_problems(), _task(), next_probs=policy, tokenizer=tokenizer,
                         cfg=UniqueSearchConfig(budget=1000, answer_budget=8))
    cost = len(policy.ids(WIN))
    assert r.solved_at == cost == r.gen_tokens and r.completion == "<think>" + WIN.removesuffix("<eos>")
    assert accuracy_at([r], cost) == (1.0, cost) and accuracy_at([r], cost - 1) == (0.0, cost - 1)
    (short,) = unique_search(_problems(), _task(), next_probs=policy, tokenizer=tokenizer,
                             cfg=UniqueSearchConfig(budget=cost - 1, answer_budget=8))
    assert short.solved_at is None and short.gen_tokens == cost - 1  # stopped at the budget, not past it
    (tight,) = unique_search(_problems(), _task(), next_probs=policy, tokenizer=tokenizer,
                             cfg=UniqueSearchConfig(budget=1000, answer_budget=4))
    assert tight.outcomes == {"malformed": 1} and tight.exhausted  # "5*3+7" needs 5 answer tokens


def test_draws_follow_the_policy_without_replacement(tokenizer):
    """P(solved by the first chain) = 0.1; by the second = 0.1 + sum over the other chains c of
    p(c) * 0.1 / (1 - p(c)) = 0.1 + 0.5*0.1/0.5 + 2 * 0.1*0.1/0.9 + 0.2*0.1/0.8 (with replacement: 0.19)."""
    n = 2000
    results = unique_search(_problems(n), _task(), next_probs=ChainPolicy(tokenizer, CHAINS), tokenizer=tokenizer,
                            cfg=UniqueSearchConfig(budget=10_000, answer_budget=8, seed=3))
    assert all(r.solved_at is not None for r in results)  # the winner is always found
    first = sum(r.chains == 1 for r in results) / n
    two = sum(r.chains <= 2 for r in results) / n
    p2 = 0.1 + 0.5 * 0.1 / 0.5 + 2 * 0.1 * 0.1 / 0.9 + 0.2 * 0.1 / 0.8
    sigma = math.sqrt(p2 * (1 - p2) / n)
    assert abs(first - 0.1) < 4 * math.sqrt(0.09 / n)
    assert abs(two - p2) < 4 * sigma and two > 0.19 + 4 * sigma
    assert max(r.chains for r in results) <= 5


class ValueOf:
    """Rates a state 0 if its thinking starts with "7", else 1 (the value never sees the answer)."""

    name = "starts-with-7"

    def __init__(self):
        self.rated: list[str] = []

    def score(self, prompts, completions):
        self.rated += list(completions)
        return Scores(values=[0.0 if c.startswith("<think>7") else 1.0 for c in completions],
                      forward_tokens=[len(c) for c in completions])


def test_a_value_prunes_states_and_its_tokens_are_counted_apart(tokenizer):
    chains = {"7+5=12,12*3=36": 0.6, "7*3=21,21-5=16": 0.3, WIN: 0.1}
    value = ValueOf()
    results = unique_search(_problems(50), _task(), next_probs=ChainPolicy(tokenizer, chains), tokenizer=tokenizer,
                            cfg=UniqueSearchConfig(budget=10_000, answer_budget=8, prune_below=0.5), value=value)
    for r in results:  # the 7-states are dropped after their first step: no second step of theirs is paid
        assert r.solved_at is not None
        assert set(r.outcomes) <= {"pruned", "verified"} and r.outcomes["verified"] == 1
    assert set(value.rated) == {"<think>7+5=12", "<think>7*3=21", "<think>5*3=15"}
    assert sum(r.scorer_tokens for r in results) == sum(len(c) for c in value.rated)  # each state rated once
    assert len(value.rated) == sum(r.chains - 1 for r in results) + len(results)  # pruned ones + the winner's
    with pytest.raises(ValueError, match="prune_below and value_weight need a value"):
        unique_search(_problems(), _task(), next_probs=ChainPolicy(tokenizer, chains), tokenizer=tokenizer,
                      cfg=UniqueSearchConfig(budget=100, answer_budget=8, prune_below=0.5))


class LikesFiveTimesThree:
    """Rates the state after "5*3=15" 1 and every other state 0.01."""

    name = "likes-5*3"

    def score(self, prompts, completions):
        return Scores(values=[1.0 if c.startswith("<think>5*3") else 0.01 for c in completions],
                      forward_tokens=[0] * len(completions))


@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_value_weight_reorders_later_draws(tokenizer, beta):
    """Two first steps of 0.5 each; below 5*3=15 a win and a loss (0.25 each), below 7+5=12 two losses.
    The policy alone (beta 0) solves within two chains with probability 0.25 + 3 * 0.25 * 1/3 = 0.5. With
    the value (5*3=15 rated 1, 7+5=12 rated 0.01, beta 1) only revisits change: after the loss below
    5*3=15 the next chain goes back there with 0.25 / 0.75 (7+5=12 is not rated yet); after a loss below
    7+5=12 its remaining 0.25 weighs 0.0025 against 0.5, so P = 0.25 + 0.25/3 + 0.5 * 0.5 * 0.5/0.5025."""
    chains = {WIN: 0.25, "5*3=15,15-7=8": 0.25, "7+5=12,12*3=36": 0.25, "7+5=12,12+3=15": 0.25}
    n = 2000
    results = unique_search(_problems(n), _task(), next_probs=ChainPolicy(tokenizer, chains), tokenizer=tokenizer,
                            cfg=UniqueSearchConfig(budget=10_000, answer_budget=8, seed=5, value_weight=beta),
                            value=LikesFiveTimesThree() if beta else None)
    two = sum(r.solved_at is not None and r.chains <= 2 for r in results) / n
    expected = 0.5 if beta == 0 else 0.25 + 0.25 / 3 + 0.5 * 0.5 * 0.5 / 0.5025
    assert abs(two - expected) < 4 * math.sqrt(expected * (1 - expected) / n)
    assert all(r.solved_at is not None and r.chains <= 4 for r in results)  # still without replacement


def test_accuracy_at_reads_each_budget():
    results = [UniqueResult("a", solved_at=40, gen_tokens=40, chains=3), UniqueResult("b", gen_tokens=300, chains=9),
               UniqueResult("c", gen_tokens=70, exhausted=True, chains=5)]
    assert accuracy_at(results, 100) == (1 / 3, (40 + 100 + 70) / 3)
    assert accuracy_at(results, 30) == (0.0, 30.0)
    # per chain: solved by chain 3; the unsolved searched 5 and 9 chains deep, so k stops at 4
    assert solved_within_chains(results) == {1: 0.0, 2: 0.0, 4: 1 / 3}


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_engine_next_token_probs_match_generate(tiny_model, tokenizer, top_p):
    """The distribution the search draws from is the one `generate` samples from: the log-probability of
    each sampled token under `next_token_probs` (renormalised top-p) equals generate's, and a token outside
    the nucleus has probability 0."""
    from scalerl.generator.engine import LengthControl

    engine = TorchEngine(tiny_model.eval(), tokenizer, seed=0)
    prompts = [encode_prompt(tokenizer, "1 2 3 -> 6:"), encode_prompt(tokenizer, "12 4 -> 3:")]
    length = LengthControl(thinking_budget=6, answer_budget=2, think_close_ids=(5,), eos_id=tokenizer.eos_token_id)
    sampling = SamplingParams(0.7, top_p)
    for prompt, c in zip(prompts, engine.generate(prompts, sampling, length), strict=True):
        rows = [prompt + c.token_ids[:j] for j in range(len(c.token_ids))]
        probs = engine.next_token_probs(rows, sampling)
        assert probs.shape == (len(rows), len(tokenizer)) and torch.allclose(probs.sum(-1), torch.ones(len(rows),
                                                                                                     dtype=probs.dtype))
        chosen = probs[torch.arange(len(rows)), torch.tensor(c.token_ids)]
        assert bool((chosen > 0).all())
        if top_p == 1.0:
            assert torch.allclose(chosen.log().float(), torch.tensor(c.logprobs), atol=1e-4)
        else:
            assert bool((probs == 0).any())  # the nucleus excludes the tail
