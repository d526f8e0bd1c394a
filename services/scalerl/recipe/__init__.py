"""The ScaleRL recipe's pure math: advantages, policy losses and batch/curriculum filters.

Pure functions on tensors (and one small pure-Python history class): no I/O, no logging, no imports
from service code. Which paper component lives where:

- ``advantages``: group-centred advantages, batch-level normalisation (spec §2.5).
- ``losses``: CISPO / GRPO / DAPO / GSPO and token / sample / prompt aggregation (spec §2.2, §2.4, §2.8).
- ``filters``: zero-variance filtering and No-Positive-Resampling (spec §2.6, §2.7).
- ``staleness``: per-token policy-version ages under PipelineRL-k (spec §2.1).
"""

from scalerl.recipe.advantages import NORMALIZATIONS, group_advantages
from scalerl.recipe.filters import NPR_THRESHOLD, PassRateHistory, npr_keep, zero_variance_mask
from scalerl.recipe.losses import AGGREGATIONS, LOSS_TYPES, policy_loss
from scalerl.recipe.staleness import age_stats, merge_age_counts, token_age_counts

__all__ = [
    "AGGREGATIONS",
    "LOSS_TYPES",
    "NORMALIZATIONS",
    "NPR_THRESHOLD",
    "PassRateHistory",
    "age_stats",
    "group_advantages",
    "merge_age_counts",
    "npr_keep",
    "policy_loss",
    "token_age_counts",
    "zero_variance_mask",
]
