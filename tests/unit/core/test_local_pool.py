"""`scalerl run --distributed` counts every role process it runs: pool.json follows the processes
(real child processes stand in for the roles), and the job file points the learner at it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from scalerl.config import load_spec, spec_from_dict
from scalerl.runtime.devices import read_pool_file
from scalerl.runtime.launcher import LocalCluster, RoleProcess


def _sleeper(cluster: LocalCluster, role: str, role_id: str) -> None:
    popen = subprocess.Popen(["sleep", "120"])
    cluster.procs[role_id] = RoleProcess(role, role_id, popen, cluster.out / "logs" / f"{role_id}.log")
    cluster.update_pool()


def test_pool_file_follows_the_role_processes(tmp_path: Path) -> None:
    spec = spec_from_dict({"runtime": {"role_devices": {"generator": 2, "verifier": 0, "learner_rank": 1}}})
    cluster = LocalCluster(spec, tmp_path, "kafka://unused:9092", "file:///unused", learner_ranks=3)
    try:
        job = load_spec(cluster.job_file)
        assert job.runtime.pool_file == str((tmp_path / "pool.json").resolve())
        assert json.loads((tmp_path / "pool.json").read_text())["devices"] == 0  # nothing runs yet
        _sleeper(cluster, "learner", "learner-0")
        for i in range(2):
            _sleeper(cluster, "generator", f"generator-{i}")
        _sleeper(cluster, "verifier", "verifier-0")
        pool = read_pool_file(tmp_path / "pool.json")
        assert pool is not None and pool.devices == 3 * 1 + 2 * 2 + 0
        assert pool.roles["learner"].devices_per_pod == 3 and pool.roles["generator"].pods == 2
        cluster.kill("generator-1")  # a generator goes: it stops counting
        pool = read_pool_file(tmp_path / "pool.json")
        assert pool is not None and pool.devices == 3 + 2
    finally:
        for p in cluster.procs.values():
            if p.popen.poll() is None:
                p.popen.kill()
                p.popen.wait()
