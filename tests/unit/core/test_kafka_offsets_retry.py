"""`KafkaBus.committed` retries while the group's coordinator is not (yet) where the client asks: the
offsets topic is created on first use, and after a broker restart the coordinator moves. Pure retry
logic against a scripted admin client; the real broker restart is `tests/integration`."""

from __future__ import annotations

import kafka.errors as kafka_errors
import pytest
from kafka.structs import OffsetAndMetadata, TopicPartition

from scalerl.bus.kafka import KafkaBus


class ScriptedAdmin:
    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.calls = 0

    def list_group_offsets(self, group: str):
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return {group: {TopicPartition("scored", 0): OffsetAndMetadata(7, "", -1),
                        TopicPartition("scored", 1): OffsetAndMetadata(-1, "", -1),
                        TopicPartition("other", 0): OffsetAndMetadata(3, "", -1)}}


@pytest.mark.parametrize("error", [kafka_errors.NotCoordinatorError, kafka_errors.CoordinatorNotAvailableError,
                                   kafka_errors.CoordinatorLoadInProgressError])
def test_committed_retries_until_the_coordinator_answers(monkeypatch, error):
    bus = KafkaBus("localhost:1", request_timeout_s=5)
    admin = ScriptedAdmin([error(), error()])
    monkeypatch.setattr(bus, "_get_admin", lambda: admin)
    monkeypatch.setattr("scalerl.bus.kafka.time.sleep", lambda _s: None)
    assert bus.committed("g", "scored") == {0: 7}  # never-committed (-1) and other topics left out
    assert admin.calls == 3


def test_committed_gives_up_after_the_request_timeout(monkeypatch):
    bus = KafkaBus("localhost:1", request_timeout_s=0.001)
    admin = ScriptedAdmin([kafka_errors.NotCoordinatorError() for _ in range(1000)])
    monkeypatch.setattr(bus, "_get_admin", lambda: admin)
    with pytest.raises(kafka_errors.NotCoordinatorError):
        bus.committed("g", "scored")
