"""Pass rate of the base SmolLM2-135M-Instruct on examples/smollm2-addition.yaml's held-out prompts,
through the project's own path (chat template, torch engine, the example's length rules, the task's
verifier), greedy (T = 0) and sampled (T = 1). Run from the repository root:

    PYTHONPATH=services python scripts/smollm2_base_pass_rate.py
"""

from __future__ import annotations

import time

import torch

from scalerl.config import load_spec
from scalerl.generator.engine import SamplingParams
from scalerl.generator.role import encode_prompt, length_control
from scalerl.generator.torch_engine import TorchEngine
from scalerl.model.factory import load_model_and_tokenizer
from scalerl.parts import make_task, make_verifier


def main() -> None:
    torch.set_num_threads(2)
    spec = load_spec("examples/smollm2-addition.yaml")
    task = make_task(spec)
    verifier = make_verifier(spec, task)
    model, tok = load_model_and_tokenizer(spec.model, spec.seed)
    engine = TorchEngine(model.eval(), tok, seed=0)
    problems = task.problems("eval")
    prompts = [encode_prompt(tok, p.prompt) for p in problems]
    start = time.perf_counter()
    for temperature in (0.0, 1.0):
        comps = engine.generate(prompts, SamplingParams(temperature=temperature), length_control(spec, tok))
        ok = sum(verifier.is_correct(c.text, p.answer, c.finish_reason) for p, c in zip(problems, comps, strict=True))
        print(f"T={temperature}: pass rate {ok}/{len(problems)} = {ok / len(problems):.3f} "
              f"(fraction of held-out prompts answered correctly); {time.perf_counter() - start:.0f} s so far")


if __name__ == "__main__":
    main()
