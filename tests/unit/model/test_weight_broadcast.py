"""The learner → generator broadcast protocol (scalerl.model.weight_broadcast) over real gloo groups:
one learner and two receivers as threads of this process, on an OS-picked port."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from scalerl.model.weight_broadcast import (
    BroadcastEndpoint,
    WeightBroadcaster,
    join_group,
    open_store,
    receive_tensors,
    update_info,
)


def state() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {"embed.weight": torch.randn(7, 3, generator=gen),
            "layers.0.norm.weight": torch.randn(3, generator=gen).to(torch.bfloat16),
            "layers.0.proj.weight": torch.randn(3, 5, generator=gen).t(),  # not contiguous
            "step": torch.tensor(12, dtype=torch.int64)}


def test_update_info_lists_names_dtypes_and_shapes_in_order() -> None:
    assert update_info(state()) == {
        "names": ["embed.weight", "layers.0.norm.weight", "layers.0.proj.weight", "step"],
        "dtype_names": ["float32", "bfloat16", "float32", "int64"],
        "shapes": [[7, 3], [3], [5, 3], []]}


def test_two_receivers_get_every_tensor_of_two_rounds() -> None:
    sender = WeightBroadcaster(BroadcastEndpoint("127.0.0.1", 0, world_size=3, timeout_s=60))
    rounds = [state(), {k: v * 2 for k, v in state().items()}]
    got: dict[int, list[dict[str, torch.Tensor]]] = {1: [], 2: []}
    errors: list[BaseException] = []

    def receiver(rank: int) -> None:
        try:
            endpoint = BroadcastEndpoint("127.0.0.1", sender.port, world_size=3, rank=rank, timeout_s=60)
            store = open_store(endpoint)
            group = join_group(endpoint, store)
            for sd in rounds:
                got[rank].append(dict(receive_tensors(group, update_info(sd), "cpu")))
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=receiver, args=(r,)) for r in (1, 2)]
    for t in threads:
        t.start()
    for sd in rounds:
        sender.send(sd)
    for t in threads:
        t.join(timeout=60)
    assert not errors and not any(t.is_alive() for t in threads)
    for rank in (1, 2):
        for sent, received in zip(rounds, got[rank], strict=True):
            assert list(received) == list(sent)
            for name, tensor in sent.items():
                assert received[name].dtype == tensor.dtype and torch.equal(received[name], tensor), (rank, name)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"port": 70000}, "port"), ({"port": 0, "rank": 1}, "port"), ({"world_size": 1}, "world_size"),
    ({"rank": 2}, "rank"), ({"backend": "mpi"}, "backend"), ({"timeout_s": 0}, "timeout_s"),
    ({"address": ""}, "address")])
def test_malformed_endpoints_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    args = {"address": "127.0.0.1", "port": 1234, "world_size": 2, **kwargs}
    with pytest.raises(ValueError, match=rf"^{field}: "):
        BroadcastEndpoint(**args)


def test_the_broadcaster_is_rank_0() -> None:
    with pytest.raises(ValueError, match=r"^rank: the learner's broadcaster is rank 0"):
        WeightBroadcaster(BroadcastEndpoint("127.0.0.1", 1234, world_size=2, rank=1))


@pytest.mark.parametrize(("info", "message"), [
    ({"names": ["a", "b"], "dtype_names": ["float32"], "shapes": [[1], [1]]}, "differ in length"),
    ({"names": ["a"], "dtype_names": ["floaty"], "shapes": [[1]]}, "'floaty', which is not a torch dtype")])
def test_malformed_update_info_is_refused_before_any_receive(info: dict[str, list[Any]], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        next(receive_tensors(object(), info, "cpu"))
