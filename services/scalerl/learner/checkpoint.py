"""Checkpoints: `checkpoints/step_000050/` = a Hugging Face model folder (weights + tokenizer, loadable
by `from_pretrained`) plus `trainer_state.pt` (optimizer, scheduler, step, RNG states, curriculum
state, bus offsets, compute clock, counters).

Written into a temporary folder and renamed into place, so a crash never leaves half a checkpoint;
only the newest `keep` are kept.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scalerl.model.factory import save_model_and_tokenizer

STATE_FILE = "trainer_state.pt"


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(root: Path, step: int, model: Any, tokenizer: Any, state: dict[str, Any],
                    *, keep: int = 2, state_dict: dict[str, torch.Tensor] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    if state_dict is not None:  # FSDP: the gathered full weights
        model.save_pretrained(str(tmp), state_dict=state_dict)
        tokenizer.save_pretrained(str(tmp))
    else:
        save_model_and_tokenizer(model, tokenizer, tmp)
    torch.save({**state, "step": step, "rng": rng_state()}, tmp / STATE_FILE)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in list_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step_*") if (p / STATE_FILE).is_file())


def latest_checkpoint(root: Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


def load_trainer_state(folder: Path) -> dict[str, Any]:
    return torch.load(folder / STATE_FILE, weights_only=False)  # type: ignore[no-any-return]
