"""The learner across several processes (`torchrun`): rank 0 is the service, the other ranks follow it.

Rank 0 does everything that touches the outside world: it reads `scored`, uploads weights and
checkpoints, announces policies, evaluates, writes the run folder and binds the gRPC and side ports.
Ranks 1..N-1 hold their FSDP shards and take part in the collectives, nothing else. Every optimizer
step, weight gather and optimizer-state gather is a collective, so before each one rank 0 broadcasts
what comes next, and the followers do the same call in the same order:

    ("step", groups)   Learner.step(groups)      each rank trains on its share of whole groups
    ("weights", None)  Learner.full_state_dict() gathered onto rank 0 (publish, eval copy, checkpoint)
    ("state", None)    Learner.state_dict()      the full optimizer state onto rank 0 (checkpoint)
    ("stop", done)     the followers leave their loop (`done`: the run finished, not stopped)

Start-up is collective too (`start_learner`): rank 0's policy (checkpoint or SFT result) is broadcast
before sharding, then rank 0's trainer state (step, LR schedule, optimizer) if it resumed.

If rank 0 dies, the followers block in the next broadcast until torchrun sees the failed rank and
stops them all; the pod (or the local launcher) restarts the group, which resumes from the checkpoint.
With one process (no process group) every call is a plain method call.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from scalerl.config import JobSpec
from scalerl.learner.learner import Learner, broadcast_weights, world
from scalerl.learner.lineage import Lineage
from scalerl.messages import ScoredGroup

log = logging.getLogger(__name__)

STOP = "stop"


def init_process_group_from_env(device: str) -> tuple[int, int]:
    """Join the process group torchrun describes (WORLD_SIZE > 1 in the environment): gloo on CPU, nccl
    with one GPU per local rank. Returns (rank, world size); (0, 1) and nothing joined otherwise."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1 or (dist.is_available() and dist.is_initialized()):
        return world()
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, size = world()
    log.info("learner rank %d of %d joined (%s)", rank, size, "nccl" if cuda else "gloo")
    return rank, size


def _broadcast(obj: Any) -> Any:
    """Rank 0's `obj` on every rank (pickled; fine for a batch of groups and small state)."""
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class Ranks:
    """Rank 0's handle on the learner: each collective is announced to the followers, then joined."""

    def __init__(self, learner: Learner) -> None:
        self.learner = learner
        self.rank, self.world_size = world()
        if self.rank != 0:
            raise RuntimeError(f"Ranks is rank 0's side; rank {self.rank} runs follow()")
        self._weights: tuple[int, dict[str, torch.Tensor]] | None = None  # (version, full weights)

    def _tell(self, command: str, payload: Any = None) -> None:
        if self.world_size > 1:
            _broadcast((command, payload))

    def step(self, groups: list[ScoredGroup]) -> dict[str, float]:
        self._tell("step", groups)
        return self.learner.step(groups)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The full weights of the current version, gathered once per version (publishing, the evaluation
        copy and the checkpoint of one step share them; the followers are told only when a gather runs)."""
        if self._weights is None or self._weights[0] != self.learner.version:
            self._tell("weights")
            self._weights = (self.learner.version, self.learner.full_state_dict())
        return self._weights[1]

    def state_dict(self) -> dict[str, Any]:
        self._tell("state")
        return self.learner.state_dict()

    def stop(self, finished: bool = False) -> None:
        """Release the followers (once, at the end of the run or on shutdown); `finished`: the run is done."""
        if self.world_size > 1:
            self._tell(STOP, finished)
            self.world_size = 1  # nobody is listening any more: no collective may follow


def start_learner(spec: JobSpec, model: Any, pad_id: int, resume_state: dict[str, Any] | None,
                  lineage: Lineage | None = None) -> Learner:
    """On every rank, in the same order: rank 0's weights to all, shard (FSDP when a process group
    exists), then rank 0's trainer state and version lineage to all (`resume_state` and `lineage` are
    read on rank 0 only; the others pass None). `lineage` replaces the checkpoint's (see
    `scalerl.learner.lineage.resume_lineage`)."""
    broadcast_weights(model)
    learner = Learner(spec, model, pad_id=pad_id)
    if learner.world_size > 1:
        small = None if resume_state is None else {k: v for k, v in resume_state.items() if k != "optimizer"}
        small, lineage = _broadcast((small, lineage))
        if small is not None:
            optim = resume_state["optimizer"] if resume_state is not None else {}
            learner.load_state_dict({**small, "optimizer": optim})
    elif resume_state is not None:
        learner.load_state_dict(resume_state)
    if lineage is not None:
        learner.lineage = lineage
    return learner


class FollowerStatus:
    """What a follower's side port shows: alive, ready once it holds its shard, steps taken."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.steps = 0
        self.joined = False
        self.finished = False  # rank 0 said stop because the run is done

    def ready(self) -> bool:
        return self.joined

    def status(self) -> dict[str, Any]:
        return {"role": "learner", "id": f"learner-rank-{self.rank}", "ready": self.joined, "step": self.steps,
                "policy_version": self.steps, "finished": self.finished}


def follow(learner: Learner, status: FollowerStatus | None = None) -> int:
    """Ranks > 0: do what rank 0 announces until it says stop. Returns the number of steps taken."""
    status = status or FollowerStatus(learner.rank)
    status.joined = True
    steps = 0
    while True:
        command, payload = _broadcast(None)
        if command == "step":
            learner.step(payload)
            steps += 1
            status.steps = learner.version
        elif command == "weights":
            learner.full_state_dict()
        elif command == "state":
            learner.state_dict()
        elif command == STOP:
            status.finished = payload is True
            return steps
        else:
            raise RuntimeError(f"rank {learner.rank}: unknown command {command!r} from rank 0")


def run_follower(spec: JobSpec, http_port: int | None = None, stop: threading.Event | None = None) -> int:
    """`scalerl serve learner` on a rank > 0: build the same model (weights come from rank 0), follow.

    The first rank of each other node (LOCAL_RANK 0) serves the side port (/healthz, /readyz once it
    holds its shard, /metrics), so every learner pod passes its probes; no rank but 0 serves gRPC.
    `stop` given: when the run finished, wait for it (SIGTERM) with the side port up, as rank 0 does."""
    from scalerl.model.factory import load_model_and_tokenizer, resolve_device
    from scalerl.parts import configure_threads, seed_everything

    seed_everything(spec.seed)
    configure_threads(spec)
    init = spec.model.init_checkpoint  # the architecture rank 0 loads; its weights come by broadcast
    model, tok = load_model_and_tokenizer(spec.model, spec.seed, init if init and Path(init).is_dir() else None)
    model = model.to(resolve_device(spec.model.device))
    status = FollowerStatus(world()[0])
    stop_side = None
    if http_port is not None and os.environ.get("LOCAL_RANK", "0") == "0":
        from scalerl.runtime.telemetry_glue import start_sideport

        _, stop_side = start_sideport("learner", status, http_port)
    try:
        learner = start_learner(spec, model, tok.pad_token_id, None)
        steps = follow(learner, status)
        if stop is not None and status.finished:  # as rank 0 (scalerl.runtime.serve.wait_finished)
            log.info("learner rank %d finished: staying up until SIGTERM", status.rank)
            stop.wait()
    finally:
        if stop_side is not None:
            stop_side()
    log.info("learner rank %d: done after %d steps", learner.rank, steps)
    dist.destroy_process_group()
    return 0
