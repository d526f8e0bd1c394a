"""The one place a generation engine is built from the job spec (`generation.engine`): the embedded
runtime, `scalerl serve generator` and `scalerl eval` all call `make_engine`; `check_engine` runs first,
at the command line, so an engine this environment cannot run is one line and exit 2 before any work.

vLLM lives in its own environment (`make install-vllm` builds it and prints its python; the GPU image
installs CUDA vLLM); it starts from a Hugging Face folder, so an in-memory policy is saved first.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalerl.config import JobSpec, SpecError

if TYPE_CHECKING:
    from scalerl.generator.engine import GenerationEngine

VLLM_MISSING = ("generation.engine: 'vllm' needs the vllm package, which this Python environment lacks; run "
                "scalerl with the vLLM environment's python (`make install-vllm` builds it and prints its path; "
                "the GPU image has CUDA vLLM), or set generation.engine: torch")


def engine_problem(spec: JobSpec) -> str | None:
    """Why the spec's engine cannot run in this environment (one line naming the field), or None. Imports
    nothing heavy: the command line asks before loading torch."""
    if spec.generation.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        return VLLM_MISSING
    return None


def check_engine(spec: JobSpec) -> None:
    """Raise SpecError (one line naming the field) when the spec's engine cannot run here."""
    problem = engine_problem(spec)
    if problem is not None:
        raise SpecError(problem)


def make_engine(spec: JobSpec, model: Any, tokenizer: Any, *, seed: int, workdir: Path,
                model_folder: Path | None = None) -> GenerationEngine:
    """The spec's engine over `model` (torch) or over `model_folder` / `model` saved to `workdir` (vLLM)."""
    check_engine(spec)
    if spec.generation.engine == "torch":
        from scalerl.generator.torch_engine import TorchEngine

        return TorchEngine(model, tokenizer, fp32_head=spec.model.fp32_lm_head, seed=seed)
    import torch

    from scalerl.generator.vllm_engine import VLLMEngine
    from scalerl.model.factory import save_model_and_tokenizer

    if model_folder is None:
        model_folder = workdir
        save_model_and_tokenizer(model, tokenizer, model_folder)
    # On CPU, torch.compile's warm-up costs minutes for no decode speed-up on small batches: eager.
    return VLLMEngine(model_folder, tokenizer, seed=seed, dtype=spec.model.dtype,
                      enforce_eager=not torch.cuda.is_available(), fp32_head=spec.model.fp32_lm_head)
