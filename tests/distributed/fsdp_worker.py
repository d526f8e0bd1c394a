"""Run under `torchrun --nproc_per_node N`: one learner step with FSDP2 on CPU (gloo), full weights to argv[1].

With N = 1 no process group is created, so the same script gives the single-process reference.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from scalerl.config import spec_from_dict
from scalerl.generator.engine import SamplingParams
from scalerl.generator.role import encode_prompt, length_control
from scalerl.generator.torch_engine import TorchEngine
from scalerl.learner.learner import Learner
from scalerl.messages import PromptTask, RolloutGroup, ScoredGroup
from scalerl.model.factory import build_tiny_model
from scalerl.model.tokenizer import build_char_tokenizer


def main() -> None:
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("gloo")
    torch.set_num_threads(1)
    spec = spec_from_dict({
        "model": {"tiny": {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2, "num_heads": 2,
                           "max_positions": 96}},
        "generation": {"group_size": 4, "thinking_budget_tokens": 12, "answer_budget_tokens": 4,
                       "interruption": {"window_tokens": [8, 12]}},
        "optim": {"lr": 1e-2, "warmup_steps": 0}, "loss": {"zero_variance_filter": False},
    })
    tok = build_char_tokenizer()
    model = build_tiny_model(spec.model, tok, seed=0)
    # Identical rollouts on every rank: generated from a separate copy with a fixed seed.
    gen = TorchEngine(build_tiny_model(spec.model, tok, seed=0).eval(), tok, seed=11)
    groups = []
    for i in range(5):  # an odd number of groups: ranks get unequal shares
        task = PromptTask(f"p{i}", 0, f"{i}+{i + 1}=", str(2 * i + 1), 4, "addition")
        pids = encode_prompt(tok, task.prompt)
        comps = gen.generate([pids] * 4, SamplingParams(), length_control(spec, tok))
        rewards = [1.0 if (i + j) % 3 == 0 else -1.0 for j in range(4)]
        groups.append(ScoredGroup(RolloutGroup(task, pids, comps), rewards, [r > 0 for r in rewards]))
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    learner = Learner(spec, model, pad_id=tok.pad_token_id)
    stats = learner.step(groups)
    full = learner.full_state_dict()
    if learner.rank == 0:
        torch.save({"state": full, "initial": initial, "loss": stats["loss/value"], "world": learner.world_size},
                   sys.argv[1])
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
