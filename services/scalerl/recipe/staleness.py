"""Token ages under PipelineRL-k (spec §2.1): how many policy versions old each trained token is.

age of a token = (learner version at train time) − (policy version whose weights sampled the token).
Under in-flight weight swaps one sequence holds tokens of several versions, so ages are per token.
Pure functions on plain lists: no I/O, no tensors.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence


def token_age_counts(versions: Iterable[Sequence[int]], masks: Iterable[Sequence[bool]],
                     learner_version: int) -> dict[int, int]:
    """{age: number of tokens} over the tokens whose mask is true.

    versions, masks: one [T_i] list per sequence (the sampling version of each completion token, and
    whether the token is trained — interruption-phrase tokens are not)."""
    counts: dict[int, int] = {}
    for vers, mask in zip(versions, masks, strict=True):
        if len(vers) != len(mask):
            raise ValueError(f"versions ({len(vers)}) and mask ({len(mask)}) differ in length")
        for v, trained in zip(vers, mask, strict=True):
            if trained:
                age = learner_version - v
                counts[age] = counts.get(age, 0) + 1
    return counts


def merge_age_counts(parts: Iterable[Mapping[int, int]]) -> dict[int, int]:
    """The sum of several {age: tokens} histograms, keys sorted."""
    total: dict[int, int] = {}
    for part in parts:
        for age, n in part.items():
            total[int(age)] = total.get(int(age), 0) + int(n)
    return dict(sorted(total.items()))


def age_stats(counts: Mapping[int, int]) -> dict[str, float | int | None]:
    """{"tokens", "mean", "max", "share_age_ge_1"} of an {age: tokens} histogram (None when empty).

    mean: token-weighted mean age in versions; share_age_ge_1: fraction of tokens at least one version
    old (0 for a synchronous, on-policy run)."""
    n = sum(counts.values())
    if n == 0:
        return {"tokens": 0, "mean": None, "max": None, "share_age_ge_1": None}
    return {"tokens": n, "mean": sum(a * c for a, c in counts.items()) / n,
            "max": max(a for a, c in counts.items() if c > 0),
            "share_age_ge_1": sum(c for a, c in counts.items() if a >= 1) / n}
