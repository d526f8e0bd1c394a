"""The environment service over real gRPC servers in this process: what a call returns, its limits, the
backpressure of a full replica, retries to another replica when one fails or goes away, Prometheus."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from scalerl.environment.remote import EnvironmentUnavailable, RemoteToolbox
from scalerl.environment.service import EnvironmentServicer
from scalerl.environment.tools import Toolbox, ToolCall
from scalerl.rpc.security import RpcSecurity
from scalerl.rpc.server import serve_grpc
from scalerl.sandbox import Limits

PLAIN = RpcSecurity.development()
LIMITS = Limits(wall_s=5.0, cpu_s=5, memory_bytes=256 << 20, output_bytes=4096)


def sleeper(seconds: float, value: int) -> ToolCall:
    return ToolCall("python", f"import time\ntime.sleep({seconds})\nprint({value})")


@pytest.fixture
def replicas():
    started = []

    def start(n: int = 1, **kw):
        out = []
        for i in range(n):
            registry = CollectorRegistry()
            servicer = EnvironmentServicer(Toolbox(("python", "calculator"), LIMITS), replica_id=f"env-{i}",
                                           registry=registry, **kw)
            server, port = serve_grpc(0, servicer, security=PLAIN, host="127.0.0.1")
            started.append(server)
            out.append((servicer, server, port, registry))
        return out

    yield start
    for server in started:
        server.stop(grace_s=0)


def test_a_call_returns_what_the_local_toolbox_returns(replicas):
    (servicer, _, port, registry), = replicas()
    local = Toolbox(("python", "calculator"), LIMITS)
    calls = [ToolCall("python", "print(sum(range(10)))"), ToolCall("python", "1/0"), ToolCall("calculator", "7/14"),
             ToolCall("calculator", "2**"), ToolCall("search", "x"), None]
    with RemoteToolbox(("python", "calculator"), f"127.0.0.1:{port}", security=PLAIN, limits=LIMITS) as remote:
        got = [remote.execute(c) for c in calls]
        assert remote.instructions() == local.instructions()
        assert remote.run_many(calls[:3]) == [o.text for o in got[:3]]
    assert got == [local.execute(c) for c in calls]
    assert [o.verdict for o in got] == ["ok", "error", "ok", "error", "invalid", "invalid"]
    assert servicer.executions == 9 and servicer.status()["env_executions"] == 9
    text = generate_latest(registry).decode()
    assert 'scalerl_environment_executions_total{tool="python",verdict="ok"} 2.0' in text
    assert 'scalerl_environment_executions_total{tool="none",verdict="invalid"} 2.0' in text
    assert 'scalerl_environment_execution_seconds_count{tool="calculator"} 3.0' in text


def test_a_call_may_tighten_the_replicas_limits_never_loosen_them(replicas):
    (_, _, port, _), = replicas()
    tight = Limits(wall_s=0.5, cpu_s=1, memory_bytes=256 << 20, output_bytes=4096)
    with RemoteToolbox(("python",), f"127.0.0.1:{port}", security=PLAIN, limits=tight) as remote:
        t0 = time.perf_counter()
        assert remote.execute(sleeper(3, 1)).verdict == "timeout"
        assert time.perf_counter() - t0 < 2.5
    loose = Limits(wall_s=60.0, cpu_s=60, memory_bytes=4 << 30, output_bytes=4096)
    with RemoteToolbox(("python",), f"127.0.0.1:{port}", security=PLAIN, limits=loose) as remote:
        # the replica's own 256 MiB: a 1 GiB allocation fails there
        assert remote.execute(ToolCall("python", "b = bytearray(1 << 30)\nprint(len(b))")).verdict == "memory"


def test_a_full_replica_refuses_at_once_and_a_queued_call_waits_for_its_slot(replicas):
    (servicer, _, port, registry), = replicas(slots=1, queue_limit=1)
    target = f"127.0.0.1:{port}"
    with RemoteToolbox(("python",), target, security=PLAIN, limits=LIMITS, attempts=1) as slow, \
            RemoteToolbox(("python",), target, security=PLAIN, limits=LIMITS, attempts=1, timeout_s=0.5) as remote, \
            ThreadPoolExecutor(2) as pool:
        running = pool.submit(slow.execute, sleeper(1.5, 1))
        _wait(lambda: servicer.meter.running == 1)
        queued = pool.submit(slow.execute, sleeper(0, 2))
        _wait(lambda: servicer.queued == 1)
        t0 = time.perf_counter()
        with pytest.raises(EnvironmentUnavailable, match=r"RESOURCE_EXHAUSTED.*1 calls running and 1 queued"):
            remote.execute(sleeper(0, 3))  # refused, and tried again for its 1 x 0.5 s: never queued
        assert time.perf_counter() - t0 < 1.4
        assert running.result().text == "1" and queued.result().text == "2"
    assert servicer.rejected >= 1 and servicer.rejected == remote.retries + 1
    assert f"scalerl_environment_rejected_total {servicer.rejected}.0" in generate_latest(registry).decode()
    assert servicer.busy_fraction() > 0.3  # one slot busy for most of the meter's short life


def test_a_queued_call_past_its_deadline_ends_with_deadline_exceeded(replicas):
    (servicer, _, port, _), = replicas(slots=1, queue_limit=4)
    with RemoteToolbox(("python",), f"127.0.0.1:{port}", security=PLAIN, limits=LIMITS, attempts=1,
                       timeout_s=0.5) as remote, ThreadPoolExecutor(1) as pool:
        slow = RemoteToolbox(("python",), f"127.0.0.1:{port}", security=PLAIN, limits=LIMITS, attempts=1)
        running = pool.submit(slow.execute, sleeper(2, 1))
        _wait(lambda: servicer.meter.running == 1)
        with pytest.raises(EnvironmentUnavailable, match="DEADLINE_EXCEEDED"):
            remote.execute(sleeper(0, 2))
        assert running.result().text == "1"
        slow.close()
    _wait(lambda: servicer.queued == 0)


def test_calls_spread_over_replicas_and_a_full_one_sends_its_call_to_another(replicas):
    (a, _, pa, _), (b, _, pb, _) = replicas(2, slots=1, queue_limit=0)
    with RemoteToolbox(("python",), f"ipv4:127.0.0.1:{pa},127.0.0.1:{pb}", security=PLAIN, limits=LIMITS) as remote:
        out = remote.run_many([sleeper(0.3, i) for i in range(8)])
        assert out == [str(i) for i in range(8)]
        assert set(remote.served_by) == {"env-0", "env-1"} and sum(remote.served_by.values()) == 8
        assert a.executions + b.executions == 8  # every call executed once: a refused one never ran
        assert remote.retries == a.rejected + b.rejected


def test_a_replica_that_goes_away_mid_call_has_its_calls_retried_on_another(replicas):
    (a, server_a, pa, _), (_, _, pb, _) = replicas(2)
    with RemoteToolbox(("python", "calculator"), f"ipv4:127.0.0.1:{pa},127.0.0.1:{pb}", security=PLAIN,
                       limits=LIMITS) as remote, ThreadPoolExecutor(8) as pool:
        _both_replicas_answer(remote)  # else round robin may send every call to the one connected first
        before = remote.served_by.get("env-1", 0)
        futures = [pool.submit(remote.execute, sleeper(1.0, i)) for i in range(8)]
        _wait(lambda: a.meter.running > 0)
        threading.Thread(target=server_a.stop, kwargs={"grace_s": 0}).start()  # cancels its calls in flight
        out = [f.result().text for f in futures]
    assert out == [str(i) for i in range(8)]
    assert remote.retries >= 1 and remote.served_by.get("env-1", 0) - before >= 4


def test_no_replica_at_all_is_an_error_after_the_attempts(replicas):
    (_, server, port, _), = replicas()
    server.stop(grace_s=0)
    with RemoteToolbox(("python",), f"127.0.0.1:{port}", security=PLAIN, limits=LIMITS, attempts=2,
                       timeout_s=1.0) as remote:
        with pytest.raises(EnvironmentUnavailable, match="no replica answered in 2 tries over 2 x 1 s"):
            remote.execute(ToolCall("python", "print(1)"))
        assert remote.retries == 1


@pytest.mark.parametrize(("target", "why"), [
    ("dns:///env:notaport", "port 'notaport'"), ("unix:/tmp/x.sock", "unknown scheme"),
    ("ipv4:127.0.0.1:1,bad host:2", "not a host name"), ("http://env:80", "unknown scheme")])
def test_a_malformed_target_is_refused_with_the_forms_allowed(target, why):
    with pytest.raises(ValueError, match=f"environment.service .*{why}.*allowed: dns:///HOST:PORT"):
        RemoteToolbox(("python",), target, security=PLAIN)


def _both_replicas_answer(remote: RemoteToolbox) -> None:
    """Cheap calls until each of the two replicas has answered one: both subchannels are then READY."""
    _wait(lambda: remote.execute(ToolCall("calculator", "1+1")).verdict == "ok"
          and {"env-0", "env-1"} <= set(remote.served_by))


def _wait(cond, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_episodes_through_the_service_equal_episodes_with_local_tools(replicas, tiny_model, tokenizer):
    """The same greedy episodes, tools run here or by the service: token for token, mask for mask (the tiny
    model "calls" where it emits a window of its own greedy continuation: a malformed call, answered with
    the error line, by the replica as by the local toolbox)."""
    from scalerl.generator.engine import LengthControl, SamplingParams
    from scalerl.generator.episode import EpisodeRunner
    from scalerl.generator.role import encode_prompt
    from scalerl.generator.torch_engine import TorchEngine

    (servicer, _, port, _), = replicas()
    never, greedy = 10**6, SamplingParams(temperature=0.0)
    engine = TorchEngine(tiny_model, tokenizer, seed=0)
    prompts = [encode_prompt(tokenizer, p) for p in ("12+34=", "7+8=", "100+1=")]
    free = LengthControl(thinking_budget=20, answer_budget=1, think_close_ids=(never,), eos_id=never)
    stops = tuple(tuple(c.token_ids[5:7]) for c in engine.generate(prompts, greedy, free))
    length = LengthControl(thinking_budget=40, answer_budget=4, think_close_ids=(never,), eos_id=never)
    out = {}
    with RemoteToolbox(("calculator",), f"127.0.0.1:{port}", security=PLAIN, limits=LIMITS) as remote:
        for name, tools in (("local", Toolbox(("calculator",), LIMITS)), ("remote", remote)):
            runner = EpisodeRunner(engine, tokenizer, tools, max_turns=3, max_observation_tokens=48,
                                   straggler_s=60)  # every turn waits for all its calls: the same batches
            runner.stop_sequences = stops
            out[name] = (runner.generate(prompts, greedy, length), runner.calls)
    (local, local_calls), (remote_eps, remote_calls) = out["local"], out["remote"]
    assert local_calls == remote_calls == servicer.executions >= len(prompts)
    for a, b in zip(local, remote_eps, strict=True):
        assert (a.token_ids, a.loss_mask, a.finish_reason) == (b.token_ids, b.loss_mask, b.finish_reason)
        assert not all(a.loss_mask)  # each has at least one observation
