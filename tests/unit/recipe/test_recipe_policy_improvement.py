"""The recipe's update is an ascent direction of the expected reward, checked against the exact gradient.

A tabular policy small enough to enumerate: U prompts, completions of T tokens from a vocabulary of V,
token t drawn from softmax(θ[u, t]) (so π(y | u) = Π_t softmax(θ[u, t])[y_t]). The expected reward
J(θ) = mean_u Σ_y π(y | u) R_u(y) is computed exactly over all V^T completions, and its gradient by
autograd. The estimate comes from the learner's own path: sampled groups -> `assemble` (zero-variance
filter, batch-normalised group advantages) -> `policy_loss` (CISPO, prompt-level aggregation) ->
backward. Averaged over many batches its direction must match the exact gradient, and a step along it
must raise J while a step against it lowers J.

The prompt-level average weights every prompt by 1 / (G·T) here (fixed length), and the batch std is a
positive scalar per batch, so the expected estimate is a positive multiple of ∇J up to the batch-std
weighting: the cosine is close to 1, not exactly 1.

This is the check that found nothing wrong when the tiny model's RL collapsed at lr >= 1e-4 (README,
"Does the forecast hold?"): the direction is right; the step size was too large.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from scalerl.learner.batch import assemble
from scalerl.messages import Completion, PromptTask, RolloutGroup, ScoredGroup
from scalerl.recipe import policy_loss

U, T, V, G = 6, 3, 3, 8  # prompts, completion length, vocabulary, group size
ALL_Y = torch.tensor(list(itertools.product(range(V), repeat=T)))  # (V^T, T) every completion


def rewards_table(seed: int) -> torch.Tensor:
    """(U, V^T) in {+1, −1}: each prompt rewards a random third of the completions."""
    g = torch.Generator().manual_seed(seed)
    return torch.where(torch.rand(U, len(ALL_Y), generator=g) < 1 / 3, 1.0, -1.0)


def expected_reward(theta_UTV: torch.Tensor, reward_UY: torch.Tensor) -> torch.Tensor:
    """J(θ) = mean over prompts of Σ_y π(y|u) R_u(y), exact. Returns a scalar."""
    logp_UTV = torch.log_softmax(theta_UTV, dim=-1)
    # log π(y|u) = Σ_t logp[u, t, y_t]  -> (U, V^T)
    logp_UY = logp_UTV[:, torch.arange(T)[None, :], ALL_Y].sum(-1)
    return (logp_UY.exp() * reward_UY).sum(-1).mean()


def sample_batch(theta_UTV: torch.Tensor, reward_UY: torch.Tensor, gen: torch.Generator) -> list[ScoredGroup]:
    """One group of G completions per prompt, sampled on-policy, with the rewards of `reward_UY`."""
    probs_UTV = torch.softmax(theta_UTV, dim=-1)
    groups = []
    for u in range(U):
        ys = torch.stack([torch.multinomial(probs_UTV[u, t], G, replacement=True, generator=gen)
                          for t in range(T)], dim=1)  # (G, T)
        logps = torch.log(probs_UTV[u, torch.arange(T)[None, :], ys])  # (G, T)
        index = (ys * V ** torch.arange(T - 1, -1, -1)).sum(1)  # row of each completion in ALL_Y
        comps = [Completion(token_ids=[V + int(x) for x in y], logprobs=lp.tolist(), versions=[0] * T,
                            loss_mask=[True] * T, finish_reason="stop", text="")
                 for y, lp in zip(ys, logps, strict=True)]
        task = PromptTask(prompt_id=f"p{u}", epoch=0, prompt="", answer="", group_size=G, task="tabular")
        rewards = [float(reward_UY[u, i]) for i in index]
        groups.append(ScoredGroup(RolloutGroup(task, [u], comps), rewards, [r > 0 for r in rewards]))
    return groups


def recipe_gradient(theta_UTV: torch.Tensor, groups: list[ScoredGroup]) -> torch.Tensor:
    """The gradient of the recipe's objective (−loss) on one batch, through `assemble` and `policy_loss`."""
    asm = assemble(groups, version=0, k=1, pad_id=0, zero_variance_filter=True, normalization="batch")
    theta = theta_UTV.detach().requires_grad_(True)
    if asm.batch is None:
        return torch.zeros_like(theta)
    b = asm.batch
    # prompt u is input position 0; the completion's token t (vocabulary id V + y) is target position t
    u_N = b.input_ids[:, 0]
    logp_all = torch.log_softmax(theta, dim=-1)  # (U, T, V)
    logp_NT = logp_all[u_N[:, None], torch.arange(T)[None, :], b.targets - V]  # (N, T): L = T here
    loss, stats = policy_loss(logp_NT, b.logp_gen, b.advantages, b.loss_mask, b.group_ids)
    assert stats["loss/ratio_mean"] == pytest.approx(1.0, abs=1e-5)  # on-policy: the recorded log-probs agree
    (-loss).backward()
    assert theta.grad is not None
    return theta.grad


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recipe_update_is_an_ascent_direction_of_the_exact_expected_reward(seed: int) -> None:
    gen = torch.Generator().manual_seed(100 + seed)
    theta = torch.randn(U, T, V, generator=gen)
    reward = rewards_table(seed)

    exact = theta.clone().requires_grad_(True)
    expected_reward(exact, reward).backward()
    assert exact.grad is not None
    true_grad = exact.grad

    estimate = torch.stack([recipe_gradient(theta, sample_batch(theta, reward, gen)) for _ in range(200)]).mean(0)
    cosine = torch.nn.functional.cosine_similarity(estimate.flatten(), true_grad.flatten(), dim=0)
    assert cosine > 0.95, f"the recipe's mean update points {float(cosine):.3f} (cosine) along the exact gradient"

    j0 = float(expected_reward(theta, reward))
    step = 0.05 * estimate / estimate.norm()
    assert float(expected_reward(theta + step, reward)) > j0  # ascent
    assert float(expected_reward(theta - step, reward)) < j0  # and the opposite sign descends


def test_single_batch_estimate_agrees_in_sign_more_often_than_not() -> None:
    """One batch of U·G = 48 completions: noisy, but positively correlated with the exact gradient on
    average (a sign error in advantages or loss would make it negatively correlated)."""
    gen = torch.Generator().manual_seed(7)
    theta = torch.randn(U, T, V, generator=gen)
    reward = rewards_table(7)
    exact = theta.clone().requires_grad_(True)
    expected_reward(exact, reward).backward()
    assert exact.grad is not None
    cosines = torch.stack([
        torch.nn.functional.cosine_similarity(recipe_gradient(theta, sample_batch(theta, reward, gen)).flatten(),
                                              exact.grad.flatten(), dim=0) for _ in range(100)])
    assert float(cosines.mean()) > 0.2 and float((cosines > 0).float().mean()) > 0.7
