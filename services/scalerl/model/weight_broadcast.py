"""Weights from the learner to generators by a collective broadcast instead of through the store.

The wire protocol of the vLLM weight-transfer backend `scalerl_broadcast`
(`scalerl.generator.vllm_weight_transfer`), pure torch so that the learner's environment needs no vLLM:

1. Rendezvous. The learner (rank 0) opens a `torch.distributed.TCPStore` at `address:port` (port 0: the
   OS picks one, read back as `WeightBroadcaster.port`) and a process group of `world_size` ranks over it;
   each generator joins as rank 1.. with `BroadcastEndpoint.rank`. The group is made directly on the
   store (`ProcessGroupGloo` on CPU, `ProcessGroupNCCL` on GPUs), not through `init_process_group`, so it
   lives beside the default group that vLLM or torchrun already hold in those processes.
2. Each update. The learner sends the metadata of its state dict (`update_info`: names, dtype names,
   shapes) over the control plane (whatever tells the generators a new version exists), then broadcasts
   the tensors from rank 0 in that order; each receiver allocates them from the metadata
   (`receive_tensors`) and loads them one at a time, so no second copy of the model is held.

Checked across torch versions: the learner's environment (torch 2.15) sends to the vLLM CPU environment
(torch 2.13) over gloo (tests/vllm_cpu/test_vllm_weight_transfer.py).
"""

from __future__ import annotations

import datetime
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo, TCPStore  # typed here, not in torch.distributed

BACKENDS = ("gloo", "nccl")
STORE_PREFIX = "scalerl-weights"


@dataclass(frozen=True)
class BroadcastEndpoint:
    """Where the learner's broadcast group meets and who this process is in it."""

    address: str
    port: int
    world_size: int
    rank: int = 0
    backend: str = "gloo"
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if not self.address:
            raise ValueError("address: give the learner's host name or IP address")
        if not 0 <= self.port <= 65535 or (self.port == 0 and self.rank != 0):
            raise ValueError(f"port: 1..65535 (0 only on the learner, rank 0: the OS picks one), got {self.port}")
        if self.world_size < 2:
            raise ValueError(f"world_size: the learner and at least one generator (>= 2), got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank: 0 (the learner) .. world_size-1 = {self.world_size - 1}, got {self.rank}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend: one of {list(BACKENDS)} (gloo on CPU, nccl on GPUs), got {self.backend!r}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s: a positive number of seconds, got {self.timeout_s}")


def open_store(endpoint: BroadcastEndpoint) -> TCPStore:
    """The rendezvous store: served by rank 0 (returns at once), joined by the others (at most `timeout_s`)."""
    return TCPStore(endpoint.address, endpoint.port, endpoint.world_size, is_master=endpoint.rank == 0,
                    timeout=datetime.timedelta(seconds=endpoint.timeout_s), wait_for_workers=False)


def join_group(endpoint: BroadcastEndpoint, store: TCPStore, prefix: str = STORE_PREFIX) -> Any:
    """This process's member of the broadcast group over `store` (keep the store alive with it), its keys
    under `prefix`. Blocks until all `world_size` ranks have joined, at most `timeout_s`."""
    timeout = datetime.timedelta(seconds=endpoint.timeout_s)
    prefixed = PrefixStore(prefix, store)
    if endpoint.backend == "gloo":
        return ProcessGroupGloo(prefixed, endpoint.rank, endpoint.world_size, timeout)
    from torch._C._distributed_c10d import ProcessGroupNCCL  # only in CUDA builds of torch

    options = ProcessGroupNCCL.Options()
    options._timeout = timeout
    return ProcessGroupNCCL(prefixed, endpoint.rank, endpoint.world_size, options)


def update_info(state_dict: Mapping[str, torch.Tensor]) -> dict[str, list[Any]]:
    """The metadata receivers allocate from, in broadcast order: names, dtype names ("float32"), shapes."""
    return {"names": list(state_dict),
            "dtype_names": [str(t.dtype).removeprefix("torch.") for t in state_dict.values()],
            "shapes": [list(t.shape) for t in state_dict.values()]}


def receive_tensors(group: Any, info: Mapping[str, list[Any]], device: torch.device | str,
                    root: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) as each broadcast from `root` arrives, allocated from `info` on `device`."""
    names, dtypes, shapes = info["names"], info["dtype_names"], info["shapes"]
    if not len(names) == len(dtypes) == len(shapes):
        raise ValueError(f"update info: names, dtype_names and shapes differ in length "
                         f"({len(names)}, {len(dtypes)}, {len(shapes)})")
    for name, dtype_name, shape in zip(names, dtypes, shapes, strict=True):
        dtype = getattr(torch, dtype_name, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"update info: {name!r} has dtype {dtype_name!r}, which is not a torch dtype")
        tensor = torch.empty(shape, dtype=dtype, device=device)
        group.broadcast(tensor, root).wait()
        yield name, tensor


class WeightBroadcaster:
    """The learner's end (rank 0). Made: the store serves `port`; `connect()` waits for the generators to
    join; `send(state_dict)` broadcasts every tensor to them."""

    def __init__(self, endpoint: BroadcastEndpoint) -> None:
        if endpoint.rank != 0:
            raise ValueError(f"rank: the learner's broadcaster is rank 0, got {endpoint.rank}")
        self.endpoint = endpoint
        self.device = torch.device("cuda" if endpoint.backend == "nccl" else "cpu")
        self.store = open_store(endpoint)
        self.group: Any = None

    @property
    def port(self) -> int:
        """The port the generators join on (the one the OS picked when the endpoint said 0)."""
        return int(self.store.port)

    def connect(self) -> None:
        """Wait (at most the endpoint's timeout) until every generator has joined the group."""
        if self.group is None:
            self.group = join_group(self.endpoint, self.store)

    def send(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Broadcast the tensors in `update_info(state_dict)` order (each call returns when its tensors are sent)."""
        self.connect()
        for tensor in state_dict.values():
            self.group.broadcast(tensor.detach().to(self.device).contiguous(), 0).wait()


def start_learner_process(python: str, state_dicts: Sequence[str | Path],
                          rounds: int = 1) -> tuple[subprocess.Popen[str], int, str]:
    """`python -m scalerl.model.weight_broadcast --rounds R FILES...` as its own process (stdout and stderr
    piped); returns it, the port it serves (127.0.0.1) and its torch version, read from its first line."""
    proc = subprocess.Popen([python, "-m", __name__, "--rounds", str(rounds), *map(str, state_dicts)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    first = proc.stdout.readline().split()
    if len(first) != 2:
        proc.kill()
        raise RuntimeError(f"the learner process exited before serving: {proc.communicate()[1].strip()}")
    return proc, int(first[0]), first[1]


def main(argv: list[str] | None = None) -> int:
    """`python -m scalerl.model.weight_broadcast [--rounds N] STATE_DICT.pt...`: a learner's end on its own
    (tests, benchmarks, checking a generator's connection): prints the port it serves, waits for one
    generator, then broadcasts each saved state dict `--rounds` times in turn and prints "sent K"."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m scalerl.model.weight_broadcast", description=main.__doc__)
    ap.add_argument("state_dicts", nargs="+", help="files written by torch.save(model.state_dict(), ...)")
    ap.add_argument("--address", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0: the OS picks one (printed)")
    ap.add_argument("--rounds", type=int, default=1, help="times each file is sent, in turn")
    ap.add_argument("--timeout-s", type=float, default=120.0)
    args = ap.parse_args(argv)
    try:
        endpoint = BroadcastEndpoint(args.address, args.port, world_size=2, timeout_s=args.timeout_s)
    except ValueError as e:
        ap.exit(2, f"{ap.prog}: error: --{e}\n")
    sender = WeightBroadcaster(endpoint)
    print(sender.port, torch.__version__, flush=True)
    states = [torch.load(path) for path in args.state_dicts]
    for _ in range(args.rounds):
        for state in states:
            sender.send(state)
    print("sent", args.rounds * len(states), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
