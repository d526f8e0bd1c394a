"""Devices as the paper counts them in an operator-run job: the generators' and the learner's devices,
rendered into the job's ConfigMap (pool.json) and status.devices, following the autoscaler's scale
changes; and the learner integrating the pool file piecewise over training time."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from scalerl.runtime.devices import DeviceLedger, DevicePool, read_pool_file
from scalerl.runtime.trainer import TrainerHost
from scalerl_operator.api.spec import RLJobSpec, parse_spec
from scalerl_operator.cluster.rlstatus import LearnerStatus
from scalerl_operator.control.jobstatus import status_patch
from scalerl_operator.control.reconcile import unrealisable
from scalerl_operator.render.children import POOL_PATH, SPEC_HASH_ANNOTATION, desired_replicas, parse_job_yaml, render

GPUS_PER_GENERATOR = 2
LEARNER_NODES, GPUS_PER_LEARNER_POD = 2, 4
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def make_spec(**roles: Any) -> RLJobSpec:
    base: dict[str, Any] = {
        "generator": {"resources": {"limits": {"nvidia.com/gpu": GPUS_PER_GENERATOR, "memory": "16Gi"}},
                      "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 8}},
        "verifier": {"replicas": 3},
        "learner": {"nodes": LEARNER_NODES, "devicesPerNode": GPUS_PER_LEARNER_POD,
                    "resources": {"limits": {"nvidia.com/gpu": GPUS_PER_LEARNER_POD}}},
    }
    base.update(roles)
    return parse_spec({"job": {"train": {"steps": 5}}, "bus": {"bootstrap": "kafka:9092"},
                       "store": {"uri": "s3://bucket/runs", "endpoint": "http://minio:9000",
                                 "credentialsSecret": {"name": "s3", "accessKeyKey": "ak", "secretKeyKey": "sk"}},
                       "roles": base})


def rendered(spec: RLJobSpec, generators_live: int | None) -> tuple[dict[str, Any], dict[str, Any], dict[str, int]]:
    """(ConfigMap, learner StatefulSet, replicas) of one reconcile pass where the autoscaler has set the
    generator Deployment to `generators_live` replicas."""
    replicas = desired_replicas(spec, live={"generator": generators_live}, remembered={})
    objs = {(o["kind"], o["metadata"]["name"]): o for o in render("j", "ns", spec, replicas)}
    return objs[("ConfigMap", "j-spec")], objs[("StatefulSet", "j-learner")], replicas


def test_generators_n_gpus_plus_learner_m_gpus_follow_the_scale_changes() -> None:
    spec = make_spec()
    assert unrealisable(spec) is None
    learner_gpus = LEARNER_NODES * GPUS_PER_LEARNER_POD
    seen = []
    for live in (3, 5, 1):  # the autoscaler's choices over time
        cm, sts, replicas = rendered(spec, live)
        assert replicas["generator"] == live
        pool = json.loads(cm["data"]["pool.json"])
        expected = live * GPUS_PER_GENERATOR + learner_gpus  # verifiers and curriculum ask for no GPU
        assert pool["devices"] == expected
        assert pool["roles"]["generator"] == {"pods": live, "devices_per_pod": 2, "devices": 2 * live}
        assert pool["roles"]["learner"]["devices"] == learner_gpus and pool["roles"]["verifier"]["devices"] == 0
        status = status_patch({"metadata": {"generation": 1}}, spec, learner=LearnerStatus(), now=NOW,
                              roles={r: (n, n) for r, n in replicas.items()}, devices=DevicePool.from_dict(pool))
        assert status["devices"] == {"generator": 2 * live, "verifier": 0, "curriculum": 0,
                                     "learner": learner_gpus, "total": expected}
        seen.append(sts["spec"]["template"]["metadata"]["annotations"][SPEC_HASH_ANNOTATION])
        # the learner reads it: job.yaml points at the mounted key
        assert parse_job_yaml(cm["data"]["job.yaml"])["runtime"]["pool_file"] == POOL_PATH
        items = next(v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "job-spec")
        assert {"key": "pool.json", "path": "pool.json"} in items["configMap"]["items"]
    assert len(set(seen)) == 1  # a scale change rewrites pool.json without rolling the pods


def test_roles_without_accelerators_count_the_jobspec_role_devices() -> None:
    spec = make_spec(generator={"replicas": 2}, learner={"nodes": 1, "devicesPerNode": 3})
    cm, _, _ = rendered(spec, None)
    pool = json.loads(cm["data"]["pool.json"])
    # JobSpec defaults: a generator process 1 device, a learner rank 1, verifier and curriculum 0
    assert pool["roles"]["generator"]["devices"] == 2 and pool["roles"]["learner"]["devices"] == 3
    assert pool["devices"] == 5


def test_a_fractional_gpu_is_rejected_naming_the_field() -> None:
    spec = make_spec(verifier={"replicas": 1, "resources": {"limits": {"nvidia.com/gpu": "500m"}}})
    problem = unrealisable(spec)
    assert problem is not None and problem.startswith("spec.roles.verifier.resources.limits.nvidia.com/gpu")


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now_s(self) -> float:
        return self.t


def test_the_learner_integrates_the_rendered_pool_piecewise(tmp_path: Path) -> None:
    """The learner's own counting path (TrainerHost.current_devices + the ledger), fed the ConfigMap's
    pool.json as kubelet would refresh it: 3 generators for 10 training seconds, then 5 for 20."""
    spec = make_spec()
    pool_file = tmp_path / "pool.json"
    job = parse_job_yaml(rendered(spec, 3)[0]["data"]["job.yaml"])
    from scalerl.config import spec_from_dict

    job["runtime"]["pool_file"] = str(pool_file)
    host = TrainerHost(spec_from_dict(job), tmp_path / "run", show_progress=False)
    host.clock = FakeClock()  # type: ignore[assignment]
    pool_file.write_text(rendered(spec, 3)[0]["data"]["pool.json"])
    host.ledger = DeviceLedger(host.current_devices())
    assert host.ledger.devices == 3 * 2 + 8
    host.clock.t = 10.0  # type: ignore[attr-defined]
    pool_file.write_text(rendered(spec, 5)[0]["data"]["pool.json"])  # the autoscaler added two generators
    host._count({})  # a step: the learner re-reads the pool
    host.clock.t = 30.0  # type: ignore[attr-defined]
    expected_h = (14 * 10 + 18 * 20) / 3600
    assert host.compute_device_hours() == pytest.approx(expected_h, rel=1e-12)
    pool_file.write_text("{not json")  # a half-written or broken file keeps the last count
    host._count({})
    assert host.ledger.devices == 18 and read_pool_file(pool_file) is None
    state = host.ledger.state(30.0)  # checkpointed and resumed: the integral continues
    resumed = DeviceLedger(18, device_s=state["device_s"], at_s=state["at_s"])
    assert resumed.device_hours(40.0) == pytest.approx(expected_h + 18 * 10 / 3600, rel=1e-12)
