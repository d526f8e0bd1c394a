"""The limits every consumer's records must fit, for a job (`scalerl.bus.validate`). Light: the CPU roles
(verifier, curriculum) build them at start without importing torch or transformers."""

from __future__ import annotations

from scalerl.bus.validate import Limits
from scalerl.config import JobSpec
from scalerl.model.sources import model_vocab_size
from scalerl.tasks import Task


def job_limits(spec: JobSpec, task: Task, vocab_size: int | None = None) -> Limits:
    """The job's G and budgets, the policy's vocabulary (`vocab_size`, else read from the model's config)
    and the task's training prompt ids (the only ones the curriculum issues)."""
    vocab = vocab_size if vocab_size is not None else model_vocab_size(spec.model)
    return Limits.from_spec(spec, vocab, [p.id for p in task.problems("train")])
