"""The parts every command builds from a spec the same way: the process's seeds and threads, the task and
its verifier. Below `runtime` (the trainer, the roles) and `evaluation` (`scalerl eval`, the trainer's
held-out eval), which both build them, so neither imports the other for it; what only a training run
builds (the curriculum, the initial model, the records' limits) stays in `runtime/setup.py`.

Imports torch: the command line reaches it after the spec is checked (`runtime/preflight.py`).
"""

from __future__ import annotations

import os
import random

import numpy as np

from scalerl.config import JobSpec
from scalerl.tasks import Task
from scalerl.tasks.registry import task_from_config
from scalerl.verifier.verifier import Verifier


def seed_python(seed: int) -> None:
    """Python's and NumPy's generators (what a role that never imports torch draws from)."""
    random.seed(seed)
    np.random.seed(seed)


def seed_everything(seed: int) -> None:
    seed_python(seed)
    import torch

    torch.manual_seed(seed)


def configure_threads(spec: JobSpec) -> int:
    import torch

    n = spec.runtime.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(n)
    return n


def make_task(spec: JobSpec) -> Task:
    """The spec's task; its problems and split depend on `task.data_seed` only (not on the run's `seed`)."""
    return task_from_config(spec.task)


def make_verifier(spec: JobSpec, task: Task) -> Verifier:
    return Verifier.from_spec(spec, task)
