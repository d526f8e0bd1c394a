"""Shared by the vLLM tests here."""

from __future__ import annotations

import copy
from typing import Any

import torch

TOL = 1e-4
"""nats: the |log ρ| bound in fp32 (the learner's and vLLM's kernels differ in summation order)."""


def perturbed(model: Any, seed: int) -> Any:
    """A copy of `model` with N(0, 0.05²) noise added to every parameter: new weights to send."""
    new = copy.deepcopy(model)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed)
        for p in new.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return new
