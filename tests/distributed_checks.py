"""What the tests of `scalerl run --distributed` (LocalCluster: the roles as processes over the real Kafka
and MinIO) read and check, in tests/integration and tests/vllm_cpu alike."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from scalerl.rpc.convert import decode_envelope
from scalerl.runtime.launcher import LocalCluster


def steps_of(out: Path) -> list[dict[str, Any]]:
    """The learner's step records so far (`<out>/train.jsonl`)."""
    path = out / "train.jsonl"
    if not path.exists():
        return []
    return [r for r in (json.loads(x) for x in path.read_text().splitlines() if x.strip()) if r["kind"] == "step"]


def wait_step(cluster: LocalCluster, out: Path, step: int, timeout_s: float = 240) -> None:
    """Until the learner has recorded `step`; fails at once when the learner process exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(r["step"] >= step for r in steps_of(out)):
            return
        learner = cluster.procs["learner-0"].popen
        assert learner.poll() is None, f"learner exited early ({learner.returncode}):\n{cluster.tail('learner-0')}"
        time.sleep(0.3)
    pytest.fail(f"no step {step} within {timeout_s:.0f} s:\n{cluster.tail('learner-0')}")


def wait_rollouts_from(cluster: LocalCluster, bus: Any, topic: str, generator_id: str,
                       timeout_s: float = 300) -> None:
    """Until `topic` holds a rollout group that `generator_id` generated: a generator that starts late (a
    loaded machine, a slow engine) joins the consumer group after the others have taken every partition,
    so "it has run" is waited for, not assumed. Fails at once when the learner process exits."""
    from scalerl.messages import RolloutGroup

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        records = [r for r in bus.read_raw(topic) if not r.value.startswith(b"\x00")]
        if any(decode_envelope(r.value, RolloutGroup).generator_id == generator_id for r in records):
            return
        learner = cluster.procs["learner-0"].popen
        assert learner.poll() is None, (f"the learner finished ({learner.returncode}) before {generator_id} "
                                        f"generated a group:\n{cluster.tail(generator_id)}")
        time.sleep(1.0)
    pytest.fail(f"{generator_id} generated no group within {timeout_s:.0f} s:\n{cluster.tail(generator_id)}")


def assert_committed_have_output(bus: Any, topic: str, group: str, out_topic: str, key_in: Callable[[Any], str],
                                 key_out: Callable[[Any], str]) -> None:
    """Nothing lost: every record of `topic` below `group`'s committed offsets has an output on
    `out_topic` (matched by key_in(input) == key_out(output); records starting with NUL are poison)."""
    committed = bus.committed(group, topic)
    inputs = [r for r in bus.read_raw(topic) if not r.value.startswith(b"\x00")]
    done = [key_in(decode_envelope(r.value)) for r in inputs if r.offset < committed.get(r.partition, 0)]
    outputs = {key_out(decode_envelope(r.value)) for r in bus.read_raw(out_topic) if not r.value.startswith(b"\x00")}
    assert done and set(done) <= outputs, sorted(set(done) - outputs)[:5]
