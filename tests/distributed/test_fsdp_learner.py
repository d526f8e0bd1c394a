"""FSDP2 (`fully_shard`) under torchrun on CPU/gloo gives the same step as one process."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("fsdp_worker.py")


def run_worker(nproc: int, out: Path, device: str = "cpu", mode: str = "fsdp") -> dict:
    """One learner step under torchrun (see fsdp_worker.py); returns what rank 0 saved."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(WORKER), str(out), device, mode]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    return torch.load(out)


def run_plain_here(out: Path) -> dict:
    """fsdp_worker.py's single-process reference (no process group), run in this process: it needs no
    launcher, and a process of its own cost ~20 CPU-s of imports (torch, transformers) on our machines."""
    argv, threads = sys.argv, torch.get_num_threads()
    try:
        sys.argv = [str(WORKER), str(out), "cpu", "plain"]
        runpy.run_path(str(WORKER), run_name="__main__")
    finally:
        sys.argv = argv
        torch.set_num_threads(threads)
    return torch.load(out)


@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_fsdp_matches_single_process(tmp_path):
    """Two ranks, each holding half of every parameter (a world of one shards nothing and ran the same code
    path: dropped, 68 s of a loaded CI run for nothing the two-rank case does not check)."""
    single = run_plain_here(tmp_path / "one.pt")
    sharded = run_worker(2, tmp_path / "fsdp.pt", mode="fsdp")
    assert_same_step(single, sharded, world=2)


def assert_same_step(single: dict, sharded: dict, *, world: int, rtol: float = 1e-4, atol: float = 1e-6) -> None:
    assert (single["world"], single["sharded"]) == (1, False)
    assert (sharded["world"], sharded["sharded"]) == (world, True)
    assert sharded["loss"] == pytest.approx(single["loss"], abs=1e-5)
    assert set(single["state"]) == set(sharded["state"])
    for name, ref in single["state"].items():
        torch.testing.assert_close(sharded["state"][name], ref, rtol=rtol, atol=atol, msg=name)
    # The step changed the weights, so the comparison above is not between two untouched models.
    assert not torch.equal(single["state"]["lm_head.weight"], single["initial"]["lm_head.weight"])
