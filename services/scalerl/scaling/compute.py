"""The two compute axes of a run (pure; no I/O).

- **device-hours** (column `compute`, the paper's axis, default everywhere): the devices the job holds
  (learner ranks + generators + any other role with an accelerator) integrated over training wall time
  (evaluation excluded), as the paper counts GB200 GPU-hours. Depends on the hardware.
- **FLOPs** (column `compute_flops`): machine-independent, from token counts and the parameter count N
  (every parameter of the policy, embeddings and LM head included; a tied embedding counted once):

      compute_flops = 2·N·(prefill_tokens + generated_tokens) + 6·N·trained_tokens

  `prefill_tokens`: prompt tokens the generators run through the model, counted once per sampled
  sequence (G per prompt: each of the G samples prefills its prompt); `generated_tokens`: sampled
  completion tokens (one forward each; the injected interruption phrase included, as it is fed
  through the model). Both count every group the learner received, trained or not (groups dropped as
  stale or as zero-variance cost generation too). `trained_tokens`: tokens of the sequences the learner
  runs forward and backward (prompt + completion, unpadded, minus the last token that predicts nothing)
  — 2·N forward + 4·N backward per token. Attention's sequence-length term and evaluation are left out.
"""

from __future__ import annotations

AXES = {"device-hours": "compute", "flops": "compute_flops"}
"""`--axis` name → the metrics column it plots and fits."""
UNITS = {"compute": "device-hours", "compute_flops": "FLOPs"}
FORWARD_FLOPS_PER_PARAM_TOKEN = 2
"""Multiply–adds of one token through a dense model: 2 FLOPs per parameter (forward only)."""
TRAIN_FLOPS_PER_PARAM_TOKEN = 6
"""Forward (2) + backward (4) FLOPs per parameter per trained token."""


def axis_column(axis: str) -> str:
    """The metrics column of an axis name; ValueError naming the allowed ones."""
    try:
        return AXES[axis]
    except KeyError:
        raise ValueError(f"--axis {axis!r}: expected one of {', '.join(AXES)}") from None


def column_unit(column: str) -> str:
    """The unit of a compute column (`compute` → device-hours, `compute_flops` → FLOPs; else its name)."""
    return UNITS.get(column, column)


def axis_label(column: str) -> str:
    """Plot label of a compute column: 'compute (device-hours)', 'compute (FLOPs)' or the column name."""
    return f"compute ({UNITS[column]})" if column in UNITS else column


def rl_flops(n_params: int, *, prefill_tokens: int, generated_tokens: int, trained_tokens: int) -> float:
    """FLOPs of RL training as the module docstring defines them (a float: it passes 2**53 quickly)."""
    if n_params < 0 or min(prefill_tokens, generated_tokens, trained_tokens) < 0:
        raise ValueError("rl_flops: parameter and token counts must be >= 0")
    gen = FORWARD_FLOPS_PER_PARAM_TOKEN * float(n_params) * (prefill_tokens + generated_tokens)
    return gen + TRAIN_FLOPS_PER_PARAM_TOKEN * float(n_params) * trained_tokens
