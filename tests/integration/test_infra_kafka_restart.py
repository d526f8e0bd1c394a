"""The broker restarts on the same port and data dir (restart_kafka fixture, scripts/infra/
restart_kafka.sh): committed records and group offsets survive a crash (SIGKILL) and a clean stop."""

from __future__ import annotations

import os

import pytest

from scalerl.messages import PromptTask

pytestmark = pytest.mark.infra

if not os.environ.get("CI"):  # in CI a missing client is an error, never a skip
    pytest.importorskip("kafka", reason="kafka-python is not installed")
from scalerl.bus.kafka import KafkaBus  # noqa: E402


def _task(i: int) -> PromptTask:
    return PromptTask(f"p{i}", 0, f"q{i}", str(i), 2, "addition")


@pytest.mark.parametrize("kill", [True, False], ids=["sigkill", "sigterm"])
def test_data_and_offsets_survive_a_broker_restart(private_kafka, unique: str, restart_kafka, poll_until,
                                                   kill: bool) -> None:
    topic, group = f"{unique}.prompts", f"{unique}-g"
    bus = KafkaBus(private_kafka.bootstrap, client_id="scalerl-it-restart")
    try:
        bus.ensure_topics([topic], partitions=2)
        for i in range(10):
            bus.publish(topic, _task(i), key=f"p{i}")
        bus.flush()
        c = bus.consumer([topic], group)
        try:
            first = poll_until(c, 4, max_records=4)
            assert len(first) == 4
            c.commit()
        finally:
            c.close()
    finally:
        bus.close()

    restart_kafka(kill=kill)

    bus = KafkaBus(private_kafka.bootstrap, client_id="scalerl-it-restart")
    try:
        assert bus.lag(group, topic) == 6
        c = bus.consumer([topic], group)
        try:
            rest = poll_until(c, 6, timeout_s=60)
            c.commit()
        finally:
            c.close()
        got = sorted(r.value.prompt_id for r in first + rest)
        assert got == sorted(f"p{i}" for i in range(10))
        assert bus.lag(group, topic) == 0
        bus.delete_topics([topic])
    finally:
        bus.close()
