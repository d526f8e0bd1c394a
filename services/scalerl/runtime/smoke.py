"""`scalerl run --smoke`: a few steps of any spec with a tiny evaluation, to check a set-up in about a minute.

The smoke preset caps the settings that multiply the work (steps, batch sizes, samples, held-out prompts)
and keeps those that define the set-up: the model, the task and its held-out split, the token budgets,
the loss and the off-policy bound. So a dataset, a model path, a plugin task or a budget that does not fit
the model fails the smoke run as it would fail the real one, and a passing smoke run says the pieces fit,
not that the policy learns (three steps are not a result).

Choices:

1. Caps, not values: a setting already at or below its cap is left alone (`--set train.steps=1 --smoke`
   runs one step), and each cap that changed something is printed with the old and new value.
2. The step-0 evaluation and the final one run (the trainer evaluates and checkpoints at the last step
   whatever `eval.every_steps` and `train.checkpoint_every` say), on `eval.limit_prompts` held-out
   prompts: the first 8 of the spec's own held-out set, so the split is the real run's.
3. SFT, when the spec asks for it, runs a few small steps: the warm-start path is part of the set-up.
4. `loss.zero_variance_filter` is turned off, so that every step runs the learner's forward, backward and
   optimizer step (the memory a training step needs is part of the set-up): a few steps from a weak start
   often have every group rewarded alike, and the filter would drop them all. Such a group has advantage 0.
5. The run's folder defaults to runs/<name>-smoke, so a smoke run never takes the real run's place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scalerl.config import JobSpec


@dataclass(frozen=True, slots=True)
class Cap:
    field: str
    """Dotted path in the JobSpec."""
    most: int
    unit: str


SMOKE_CAPS: tuple[Cap, ...] = (
    Cap("train.steps", 3, "steps"),
    Cap("train.prompts_per_step", 4, "prompts"),
    Cap("generation.group_size", 4, "samples per prompt"),
    Cap("generation.prompts_per_batch", 4, "prompts"),
    Cap("curriculum.max_inflight_prompts", 12, "prompts"),  # 3 steps x 4 prompts: no sampling ahead of the end
    Cap("sft.steps", 5, "steps"),
    Cap("sft.batch_size", 8, "sequences"),
    Cap("eval.limit_prompts", 8, "prompts"),
    Cap("eval.samples_per_prompt", 2, "samples per prompt"),
    Cap("eval.prompts_per_batch", 8, "prompts"),
)


# Settings a smoke run always sets: (dotted path, value, why).
SMOKE_SETS: tuple[tuple[str, Any, str], ...] = (
    ("loss.zero_variance_filter", False, "every step trains, even when all samples of a group are rewarded alike"),
)


@dataclass(frozen=True, slots=True)
class Override:
    field: str
    old: Any
    new: Any
    unit: str

    def as_set(self) -> str:
        """The `--set` argument that makes this change."""
        return f"{self.field}={_yaml(self.new)}"

    def describe(self) -> str:
        what = f" ({self.unit})" if isinstance(self.new, bool) else f" {self.unit}"
        return f"{self.field}: {_yaml(self.old)} -> {_yaml(self.new)}{what}"


def _yaml(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _get(spec: JobSpec, dotted: str) -> Any:
    node: Any = spec
    for key in dotted.split("."):
        node = getattr(node, key)
    return node


def smoke_overrides(spec: JobSpec) -> list[Override]:
    """The caps of `SMOKE_CAPS` that change `spec` (a null value counts as unbounded), then `SMOKE_SETS`.

    `sft.*` caps apply only when the spec runs SFT (no `model.init_checkpoint`, `sft.steps` > 0)."""
    runs_sft = spec.model.init_checkpoint is None and spec.sft.steps > 0
    out = []
    for cap in SMOKE_CAPS:
        if cap.field.startswith("sft.") and not runs_sft:
            continue
        value = _get(spec, cap.field)
        if value is None or value > cap.most:
            out.append(Override(cap.field, value, cap.most, cap.unit))
    for field, new, why in SMOKE_SETS:
        if _get(spec, field) != new:
            out.append(Override(field, _get(spec, field), new, why))
    return out


def smoke_spec(path: str, sets: list[str], spec: JobSpec) -> tuple[JobSpec, list[Override]]:
    """`spec` (read from `path` with `sets`) with the smoke caps applied, validated again as a whole."""
    from scalerl.config import load_spec

    overrides = smoke_overrides(spec)
    return load_spec(path, [*sets, *(o.as_set() for o in overrides)]), overrides


def smoke_banner(overrides: list[Override]) -> str:
    """What a smoke run prints before it starts: what it is for and each setting it changed."""
    lines = ["smoke run: a few steps and a tiny evaluation to check the set-up (not a result); changed:"]
    lines += [f"  {o.describe()}" for o in overrides] or ["  (none: every setting was already within the caps)"]
    return "\n".join(lines)
