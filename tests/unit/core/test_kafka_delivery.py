"""Delivery bookkeeping of the Kafka bus against scripted clients (pure logic; the real broker is in
tests/integration): a consumer never moves its positions past records it has not handed over (#27 finding
2), a flush keeps failed sends until they are delivered or reported (finding 3), and a sole owner's
positions win over the group's committed offsets on every assignment (finding 4)."""

from __future__ import annotations

from collections import namedtuple

import kafka.errors as kafka_errors
import pytest
from kafka.structs import TopicPartition

from scalerl.bus.kafka import KafkaBus, KafkaBusConsumer, UndeliverableRecord, _SeekOnAssign
from scalerl.messages import PromptTask
from scalerl.rpc.convert import encode_envelope

ConsumerRecord = namedtuple("ConsumerRecord", "topic partition offset key value headers")
TP = TopicPartition("job.scored", 0)


class Future:
    """kafka-python's FutureRecordMetadata, settled by the scripted producer's flush."""

    def __init__(self) -> None:
        self.is_done = False
        self.exception: Exception | None = None

    def succeeded(self) -> bool:
        return self.is_done and self.exception is None

    def failed(self) -> bool:
        return self.is_done and self.exception is not None


class ScriptedProducer:
    """Each flush settles every unsettled send with the next outcome of `outcomes` (None: delivered), or
    raises it when it is a timeout (records left in flight)."""

    def __init__(self, outcomes: list[Exception | None]) -> None:
        self.outcomes = outcomes
        self.sent: list[tuple[str, bytes]] = []
        self.delivered: list[tuple[str, bytes]] = []
        self._open: list[tuple[Future, str, bytes]] = []

    def send(self, topic, value=None, key=None, headers=None):
        fut = Future()
        self.sent.append((topic, value))
        self._open.append((fut, topic, value))
        return fut

    def flush(self, timeout=None):
        outcome = self.outcomes.pop(0) if self.outcomes else None
        if isinstance(outcome, kafka_errors.KafkaTimeoutError) and not outcome.args:
            raise kafka_errors.KafkaTimeoutError("flush timed out")
        for fut, topic, value in self._open:
            fut.is_done, fut.exception = True, outcome
            if outcome is None:
                self.delivered.append((topic, value))
        self._open = []


def _bus(producer: ScriptedProducer) -> KafkaBus:
    bus = KafkaBus("localhost:1")
    bus._producer = producer
    bus._known_topics.add("job.dlq")  # no admin calls
    return bus


def test_a_retried_flush_sends_the_failed_records_again():
    producer = ScriptedProducer([kafka_errors.KafkaTimeoutError("Batch expired"), None])
    bus = _bus(producer)
    bus.publish_raw("job.policy", b"v5")
    with pytest.raises(kafka_errors.KafkaTimeoutError):
        bus.flush()
    bus.flush()  # (today's code: the failed send was forgotten and this flush "succeeded")
    assert producer.delivered == [("job.policy", b"v5")]
    assert bus._pending == []


def test_a_flush_keeps_failing_while_the_failed_record_is_not_delivered():
    outage = kafka_errors.KafkaTimeoutError("Batch expired")
    producer = ScriptedProducer([outage, outage, outage, None])
    bus = _bus(producer)
    bus.publish_raw("job.policy", b"a")
    bus.publish_raw("job.policy", b"b")
    for _ in range(3):
        with pytest.raises(kafka_errors.KafkaTimeoutError):
            bus.flush()
    bus.flush()
    assert producer.delivered == [("job.policy", b"a"), ("job.policy", b"b")]  # publish order kept


def test_an_undeliverable_record_is_reported_once_by_topic_and_key():
    producer = ScriptedProducer([kafka_errors.MessageSizeTooLargeError("too big")])
    bus = _bus(producer)
    bus.publish_raw("job.scored", b"x" * 10, key=b"p-1")
    with pytest.raises(UndeliverableRecord, match=r"job.scored \(key b'p-1'\)"):
        bus.flush()
    bus.flush()  # reported: not sent again, not raised again
    assert producer.sent == [("job.scored", b"x" * 10)]


class ScriptedConsumer:
    """A KafkaConsumer that returns one scripted batch per poll and records seeks."""

    def __init__(self, batches: list[dict]) -> None:
        self.batches = batches
        self.position_of: dict[TopicPartition, int] = {}
        self.seeks: list[tuple[TopicPartition, int]] = []

    def poll(self, timeout_ms=0, max_records=None):
        batch = self.batches.pop(0) if self.batches else {}
        # the client's fetch position moves past what it returned (as kafka-python's does)
        for tp, recs in batch.items():
            self.position_of[tp] = recs[-1].offset + 1
        return batch

    def seek(self, tp, offset):
        self.seeks.append((tp, offset))
        self.position_of[tp] = offset

    def assignment(self):
        return {TP}

    def position(self, tp, timeout_ms=None):
        return self.position_of.get(tp, 0)


def _record(offset: int, value: bytes) -> ConsumerRecord:
    return ConsumerRecord(TP.topic, TP.partition, offset, b"k", value, [])


def _consumer(bus: KafkaBus, kc: ScriptedConsumer, *, sole_owner: bool = False) -> KafkaBusConsumer:
    c = KafkaBusConsumer.__new__(KafkaBusConsumer)
    c._bus, c._topics, c._group, c._dead_letters, c._role = bus, [TP.topic], "job.learner", True, "job.learner"
    c._sole_owner = sole_owner
    c.undecodable = 0
    import threading
    c._state_lock = threading.RLock()
    c._pos, c._pending_seeks, c._kc, c._dead_unconfirmed = {}, {}, kc, set()
    return c


def _good(i: int) -> bytes:
    return encode_envelope(PromptTask(prompt_id=f"p{i}", epoch=0, prompt="1+1", answer="2", group_size=2,
                                      task="arith"))


def test_positions_do_not_pass_records_that_were_not_handed_over_when_dead_lettering_fails():
    batch = [_record(0, _good(0)), _record(1, b"\x00poison"), _record(2, _good(2))]
    kc = ScriptedConsumer([{TP: batch}])
    producer = ScriptedProducer([kafka_errors.KafkaTimeoutError("broker down"), None])
    bus = _bus(producer)
    c = _consumer(bus, kc)
    with pytest.raises(kafka_errors.KafkaTimeoutError):
        c.poll()
    assert c.positions() == {"job.scored:0": 0}  # nothing handed over: the batch is read again
    assert kc.seeks == [(TP, 0)]
    assert c.undecodable == 0
    kc.batches.append({TP: batch})  # the client re-reads from the seek
    got = c.poll()
    assert [r.offset for r in got] == [0, 2]  # (today's code: only records after the batch came back)
    assert c.positions() == {"job.scored:0": 3}
    assert c.undecodable == 1
    assert [t for t, _ in producer.delivered] == ["job.dlq"]  # the poison record, dead-lettered once


def test_a_sole_owner_keeps_its_positions_across_revocation_and_reassignment():
    kc = ScriptedConsumer([{TP: [_record(3, _good(3)), _record(4, _good(4))]}])
    c = _consumer(_bus(ScriptedProducer([])), kc, sole_owner=True)
    c._pending_seeks[TP] = 3  # restored from a checkpoint before the first assignment
    listener = _SeekOnAssign(c)
    listener.on_partitions_assigned({TP})
    assert [r.offset for r in c.poll()] == [3, 4]
    # lost membership (session expiry across a broker restart): revoked, then assigned again, where the client
    # would start from the group's committed offset (say 9, the dead learner's)
    listener.on_partitions_revoked({TP})
    kc.position_of[TP] = 9
    listener.on_partitions_assigned({TP})
    assert kc.seeks[-1] == (TP, 5) and c.positions() == {"job.scored:0": 5}


def test_a_shared_consumer_gives_revoked_partitions_to_the_group():
    kc = ScriptedConsumer([{TP: [_record(3, _good(3))]}])
    c = _consumer(_bus(ScriptedProducer([])), kc)
    listener = _SeekOnAssign(c)
    listener.on_partitions_assigned({TP})
    c.poll()
    listener.on_partitions_revoked({TP})
    kc.position_of[TP] = 9
    listener.on_partitions_assigned({TP})
    assert kc.seeks == [] and c.positions() == {"job.scored:0": 9}
