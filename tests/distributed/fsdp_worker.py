"""Run under `torchrun --nproc_per_node N`: one learner step, full weights to argv[1].

argv[2] is the device (`cpu`: gloo, `cuda`: nccl, one GPU per rank) and argv[3] is `fsdp` (create a
process group, so the learner shards with FSDP2 even when N = 1) or `plain` (no process group: the
single-process reference). Rollouts are generated on CPU with a fixed seed, identical on every rank.
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
    out, device, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    if mode == "fsdp":
        dist.init_process_group("nccl" if device == "cuda" else "gloo")
        if device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
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
    model.to(device)
    learner = Learner(spec, model, pad_id=tok.pad_token_id)
    stats = learner.step(groups)
    full = learner.full_state_dict()
    if learner.rank == 0:
        torch.save({"state": full, "initial": initial, "loss": stats["loss/value"], "world": learner.world_size,
                    "sharded": learner.sharded}, out)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
