"""The environment service as a run serves it: `scalerl run --distributed` with tools has its two verifier
processes execute the tool calls; one is SIGKILLed while calls run on it, they are retried on the other,
and the run finishes with nothing lost or double-counted.

The tiny model never writes `</tool>`, so the run's own episodes make no call; the calls here come from
this process, as the `client` identity the launcher issues (mutual TLS, authorized for Execute), through
the same `RemoteToolbox` and the same `environment.service` target the generators are given.
"""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from distributed_checks import assert_committed_have_output, steps_of, wait_step
from scalerl.bus.kafka import KafkaBus
from scalerl.config import spec_from_dict
from scalerl.environment.remote import RemoteToolbox
from scalerl.environment.tools import ToolCall, tool_limits
from scalerl.messages import MetricRecord
from scalerl.rpc.convert import decode_envelope
from scalerl.rpc.gen.scalerl.v1 import services_pb2 as spb
from scalerl.rpc.gen.scalerl.v1 import services_pb2_grpc as sgrpc
from scalerl.rpc.security import RpcSecurity
from scalerl.runtime.launcher import LocalCluster

pytestmark = [pytest.mark.infra, pytest.mark.distributed]

STEPS = 2
CALLS = 12


def _spec(unique: str, addition_run_spec):
    tree = addition_run_spec(unique, None, steps=STEPS, off_policy={"mode": "pipeline", "k": 2}, checkpoint_every=STEPS,
                             eval_every=STEPS).model_dump()
    tree["model"]["tiny"]["max_positions"] = 384  # the tools' instructions are appended to every prompt
    tree["sft"]["steps"] = 10
    tree["loss"] = {"zero_variance_filter": False}  # a barely trained model: train on every group anyway
    tree["environment"] = {"tools": ["python", "calculator"], "max_turns": 2, "max_observation_tokens": 64}
    return spec_from_dict(tree)


@pytest.mark.timeout(900)
def test_a_killed_environment_replicas_calls_are_retried_on_the_other(infra, s3_env, unique, tmp_path,
                                                                     addition_run_spec):
    spec = _spec(unique, addition_run_spec)
    out = tmp_path / "run"
    cluster = LocalCluster(spec, out, f"kafka://{infra.kafka_bootstrap}", f"s3://{unique}/job", generators=1,
                           verifiers=2, env=infra.s3_env())
    target = cluster.spec.environment.service
    assert target == "ipv4:" + ",".join(f"127.0.0.1:{p}" for p in cluster.verifier_ports)
    security = RpcSecurity(str(out / "tls" / "client"))
    bus = KafkaBus(infra.kafka_bootstrap)
    try:
        cluster.start_all()
        limits = tool_limits(spec.environment.tool_wall_s, spec.environment.tool_memory_mb)
        with RemoteToolbox(("python", "calculator"), target, security=security, limits=limits, attempts=8) as tools, \
                ThreadPoolExecutor(CALLS) as pool:
            assert tools.execute(ToolCall("calculator", "6*7")).text == "42"  # waits for the verifiers to serve
            _wait_serving(target, security)
            deadline = time.monotonic() + 120
            while len(tools.served_by) < 2:  # until this channel reaches both (a replica late to start is in backoff)
                assert time.monotonic() < deadline, f"calls reached only {tools.served_by}"
                tools.execute(ToolCall("calculator", "1+1"))
                time.sleep(0.2)
            before = dict(tools.served_by)
            futures = [pool.submit(tools.execute, ToolCall("python", f"import time\ntime.sleep(2)\nprint({i} * {i})"))
                       for i in range(CALLS)]
            _wait_running(cluster.verifier_ports[1], security)
            cluster.kill("verifier-1")  # SIGKILL while it executes calls; not restarted
            got = [f.result(timeout=120) for f in futures]
            retries, served = tools.retries, dict(tools.served_by)
        assert [o.text for o in got] == [str(i * i) for i in range(CALLS)] and {o.verdict for o in got} == {"ok"}
        assert retries >= 1 and served["verifier-1"] == before["verifier-1"]  # what it held, verifier-0 answered
        assert served["verifier-0"] == before["verifier-0"] + CALLS
        wait_step(cluster, out, 1)
        assert cluster.wait_learner(timeout_s=480) == 0, cluster.tail("learner-0")
        codes = cluster.stop_all()
    finally:
        cluster.stop_all(timeout_s=30)
    assert codes["verifier-1"] == -signal.SIGKILL
    assert {rid: rc for rid, rc in codes.items() if rid != "verifier-1"} == {
        "learner-0": 0, "curriculum-0": 0, "verifier-0": 0, "generator-0": 0}
    steps = steps_of(out)
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    trained = [gid for r in steps for gid in r["group_ids"]]
    assert len(trained) == len(set(trained)) == STEPS * spec.train.prompts_per_step  # none twice, none missing
    # every rollout the verifiers committed has a score (the killed one's uncommitted ones were scored again)
    assert_committed_have_output(bus, f"{unique}.rollouts", f"{unique}.verifiers", f"{unique}.scored",
                                  lambda m: f"{m.task.prompt_id}@{m.task.epoch}", lambda m: m.group_id)
    # the verifiers reported their load for the operator's autoscaler (the sleeps kept verifier-0's slots busy)
    reports = [m for r in bus.read_raw(f"{unique}.metrics")
               if (m := decode_envelope(r.value, MetricRecord)).kind == "environment"]
    assert {m.source for m in reports} <= {"verifier-0", "verifier-1"} and reports
    assert max(m.values["busy_fraction"] for m in reports if m.source == "verifier-0") > 0.1
    assert all(m.values["slots"] == 4 for m in reports)
    bus.delete_topics([f"{unique}.{k}" for k in ("prompts", "rollouts", "scored", "policy", "metrics", "dlq")])
    bus.close()


def _status(port: int, security: RpcSecurity) -> object:
    channel = security.channel(f"127.0.0.1:{port}")
    try:
        return sgrpc.EnvironmentStub(channel).Status(spb.StatusRequest(), timeout=5)
    finally:
        channel.close()


def _wait_serving(target: str, security: RpcSecurity, timeout_s: float = 120) -> None:
    """Until every replica of `target` answers Status (the verifiers start at their own pace)."""
    deadline = time.monotonic() + timeout_s
    for address in target.removeprefix("ipv4:").split(","):
        while True:
            try:
                _status(int(address.rsplit(":", 1)[1]), security)
                break
            except grpc.RpcError:
                assert time.monotonic() < deadline, f"{address} never served Environment"
                time.sleep(0.5)


def _wait_running(port: int, security: RpcSecurity, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while _status(port, security).running == 0:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, "no call ever ran on that replica"
        time.sleep(0.05)
