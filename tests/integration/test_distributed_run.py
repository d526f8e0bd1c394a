"""The roles as separate processes over the real Kafka broker and MinIO, with faults injected mid-run.

One run (curriculum, two generators, two verifiers, a learner; PipelineRL-2) in which:
- generator-0 is killed with SIGKILL: its uncommitted prompts go to generator-1;
- the learner is killed with SIGKILL after its step-4 checkpoint and started again: it resumes from the
  checkpoint in MinIO and its saved offsets;
- the broker is restarted: every role reconnects and carries on;
- poison records are written to the rollouts and scored topics: they land in the dead-letter topic.
Then the accounting is checked against the scored topic itself: the groups below the learner's final
positions are exactly the groups of the training steps (each in one step), plus duplicates counted.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from scalerl.bus.kafka import KafkaBus
from scalerl.messages import ScoredGroup
from scalerl.rpc.convert import decode_envelope
from scalerl.runtime.launcher import LocalCluster
from warm_start import mixed_reward_warm_start

pytestmark = [pytest.mark.infra, pytest.mark.distributed]

STEPS = 10


# PipelineRL-2 over two partitions, a checkpoint every 4 steps (the learner is killed after step 4)
RUN = {"steps": STEPS, "off_policy": {"mode": "pipeline", "k": 2}, "checkpoint_every": 4, "eval_every": 5,
       "partitions": 2}


@pytest.fixture(scope="module")
def sft_start(tmp_path_factory, addition_run_spec) -> str:
    """One warm start whose groups have mixed rewards by construction (checked), shared by the tests here."""
    return mixed_reward_warm_start(addition_run_spec("sft", None, **RUN), tmp_path_factory.mktemp("sft"))


def _steps(out: Path) -> list[dict]:
    path = out / "train.jsonl"
    if not path.exists():
        return []
    return [r for r in (json.loads(x) for x in path.read_text().splitlines() if x.strip()) if r["kind"] == "step"]


def _wait_step(cluster: LocalCluster, out: Path, step: int, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(r["step"] >= step for r in _steps(out)):
            return
        learner = cluster.procs["learner-0"].popen
        assert learner.poll() is None, f"learner exited early ({learner.returncode}):\n{cluster.tail('learner-0')}"
        time.sleep(0.3)
    pytest.fail(f"no step {step} within {timeout_s:.0f} s:\n{cluster.tail('learner-0')}")


@pytest.mark.timeout(900)
def test_distributed_run_survives_kills_and_broker_restart(infra, unique, sft_start, tmp_path, restart_kafka,
                                                           addition_run_spec):
    spec = addition_run_spec(unique, sft_start, **RUN)
    out = tmp_path / "run"
    cluster = LocalCluster(spec, out, f"kafka://{infra.kafka_bootstrap}", f"s3://{unique}/job",
                           generators=2, verifiers=2, env=infra.s3_env())
    bus = KafkaBus(infra.kafka_bootstrap)
    try:
        cluster.start_all()
        _wait_step(cluster, out, 2)
        cluster.kill("generator-0")  # SIGKILL mid-run; not restarted
        bus.publish_raw(f"{unique}.rollouts", b"\x00poison-rollout", key=b"p")
        bus.publish_raw(f"{unique}.scored", b"\x00poison-scored", key=b"p")
        bus.flush()
        _wait_step(cluster, out, 5)  # the step-4 checkpoint is in MinIO
        cluster.kill("learner-0")
        cluster.start("learner", "learner-0")
        restart_kafka()
        assert cluster.wait_learner(timeout_s=480) == 0, cluster.tail("learner-0")
        # (checked at the end: waiting for it mid-run could let the learner finish before it is killed)
        _check_side_port(cluster, "generator-1", f"{unique}.prompts")
        codes = cluster.stop_all()
    finally:
        cluster.stop_all(timeout_s=30)
    assert codes["generator-0"] == -signal.SIGKILL
    assert {rid: rc for rid, rc in codes.items() if rid != "generator-0"} == {
        "learner-0": 0, "curriculum-0": 0, "verifier-0": 0, "verifier-1": 0, "generator-1": 0}
    assert "learner resumed from step_000004" in cluster.procs["learner-0"].log_path.read_text()

    summary = json.loads((out / "summary.json").read_text())
    steps = _steps(out)
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1)) and summary["steps"] == STEPS
    trained = [gid for r in steps for gid in r["group_ids"]]
    assert len(trained) == STEPS * spec.train.prompts_per_step
    assert len(set(trained)) == len(trained), "a group was counted in two steps"
    assert sum(r["effective_batch"] for r in steps) > 0  # some groups had mixed rewards: real updates
    assert all(r["loss"] != 0 for r in steps if r["effective_batch"]), "a step with data left the loss at 0"

    # The scored topic below the learner's final positions holds exactly the trained groups (+ duplicates).
    final = summary["final_positions"]
    below: list[str] = []
    for rec in bus.read_raw(f"{unique}.scored"):
        if rec.offset >= final.get(f"{unique}.scored:{rec.partition}", 0) or rec.value.startswith(b"\x00"):
            continue
        group = decode_envelope(rec.value, ScoredGroup)
        below.append(group.group_id)
    assert set(below) == set(trained)
    assert len(below) - len(set(below)) == summary["duplicates_dropped"]

    # Nothing lost: every prompt the generators committed has a rollout group (the killed generator's
    # uncommitted prompts were re-delivered), every rollout the verifiers committed has a score.
    _assert_committed_have_output(bus, f"{unique}.prompts", f"{unique}.generators", f"{unique}.rollouts",
                                  lambda m: f"{m.prompt_id}@{m.epoch}", lambda m: f"{m.task.prompt_id}@{m.task.epoch}")
    _assert_committed_have_output(bus, f"{unique}.rollouts", f"{unique}.verifiers", f"{unique}.scored",
                                  lambda m: f"{m.task.prompt_id}@{m.task.epoch}", lambda m: m.group_id)

    dlq = bus.read_raw(f"{unique}.dlq")
    origins = {(r.headers.get("original_topic") or r.headers.get("origin_topic") or b"").decode() for r in dlq}
    assert {f"{unique}.rollouts", f"{unique}.scored"} <= origins
    bus.delete_topics([f"{unique}.{k}" for k in ("prompts", "rollouts", "scored", "policy", "metrics", "dlq")])
    bus.close()


def _check_side_port(cluster: LocalCluster, role_id: str, input_topic: str, timeout_s: float = 120) -> None:
    """The role's side port: ready (it holds a policy), and /metrics counts its tokens (once it has had a
    partition: it may have joined the group after the other generator took both) and its input lag."""
    ports = json.loads(next(line for line in cluster.procs[role_id].log_path.read_text().splitlines()
                            if line.startswith("{")))
    base = f"http://127.0.0.1:{ports['http']}"
    with urllib.request.urlopen(f"{base}/readyz", timeout=10) as r:
        assert r.status == 200
    deadline = time.monotonic() + timeout_s
    while True:
        with urllib.request.urlopen(f"{base}/metrics", timeout=30) as r:
            text = r.read().decode()
        tokens = [float(line.split()[-1]) for line in text.splitlines()
                  if line.startswith("scalerl_generator_tokens_total ")]
        assert tokens, "no scalerl_generator_tokens_total on /metrics"
        if tokens[0] > 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert tokens[0] > 0, f"{role_id} generated no tokens within {timeout_s:.0f} s"
    assert f'scalerl_generator_queue_lag_messages{{topic="{input_topic}"}}' in text


def _assert_committed_have_output(bus, topic, group, out_topic, key_in, key_out) -> None:
    committed = bus.committed(group, topic)
    inputs = [r for r in bus.read_raw(topic) if not r.value.startswith(b"\x00")]
    done = [key_in(decode_envelope(r.value)) for r in inputs if r.offset < committed.get(r.partition, 0)]
    outputs = {key_out(decode_envelope(r.value)) for r in bus.read_raw(out_topic) if not r.value.startswith(b"\x00")}
    assert done and set(done) <= outputs, sorted(set(done) - outputs)[:5]
