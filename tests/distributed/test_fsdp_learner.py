"""FSDP2 (`fully_shard`) under torchrun on CPU/gloo gives the same step as one process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("fsdp_worker.py")


def _run(nproc: int, out: Path) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(WORKER), str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    return torch.load(out)


@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_fsdp_two_ranks_match_single_process(tmp_path):
    single = _run(1, tmp_path / "one.pt")
    sharded = _run(2, tmp_path / "two.pt")
    assert (single["world"], sharded["world"]) == (1, 2)
    assert sharded["loss"] == pytest.approx(single["loss"], abs=1e-5)
    assert set(single["state"]) == set(sharded["state"])
    for name, ref in single["state"].items():
        torch.testing.assert_close(sharded["state"][name], ref, rtol=1e-4, atol=1e-6, msg=name)
    # The step changed the weights, so the comparison above is not between two untouched models.
    assert not torch.equal(single["state"]["lm_head.weight"], single["initial"]["lm_head.weight"])
