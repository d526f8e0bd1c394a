"""Kafka transport for the bus (kafka-python 3.x), used in distributed mode (`kafka://host:port`).

Producer: idempotent (`enable_idempotence=True`, `acks=all`), values are protobuf `scalerl.v1.Envelope`
bytes (`scalerl.rpc.convert.encode_envelope`; `decode_envelope` also reads the legacy JSON of
`messages.encode`), keys are the utf-8 prompt ids (so a prompt group stays on one partition), headers are
(str, bytes) pairs: `schema` (messages.SCHEMA_VERSION) plus whatever the caller passes (traceparent,
policy version, ...). Batches are compressed with zstd, else lz4, else gzip (whichever codec is
installed). `publish` is asynchronous; `flush()` returns once every published record is acknowledged
by all in-sync replicas, and raises if any of them failed. A failed send is never forgotten: it stays
pending and the next `flush()` sends it again (in publish order), so a flush retried after an outage
succeeds only once everything published has been delivered. A send that can never succeed (a non-retriable
error, e.g. a record larger than the topic allows) is reported once, by `UndeliverableRecord` naming its
topic and key, and then dropped.

Consumer: `scalerl.bus.kafka_consumer` (KafkaBusConsumer: group membership, dead letters, positions,
seeks and the sole owner's positions).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka import errors as kafka_errors
from kafka.admin import OffsetSpec
from kafka.codec import has_lz4, has_zstd

from scalerl.bus.base import Bus
from scalerl.bus.kafka_consumer import KafkaBusConsumer, _SeekOnAssign, _tp, dlq_topic
from scalerl.bus.security import KafkaConnectError, KafkaSecurity, diagnose
from scalerl.messages import SCHEMA_VERSION
from scalerl.rpc.convert import encode_envelope as encode

log = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_BATCH_S = 3600.0
"""The longest unit of work between two polls of one consumer (Kafka's `max.poll.interval.ms`)."""


class UndeliverableRecord(kafka_errors.KafkaError):  # type: ignore[misc]
    """A published record that can never be delivered (a non-retriable send error); reported once."""

    retriable = False


@dataclass(slots=True)
class _Send:
    """One published record and its delivery future, kept until it is acknowledged or reported."""

    topic: str
    value: bytes
    key: bytes | None
    headers: list[tuple[str, bytes]]
    future: Any


def _compression() -> str:
    if has_zstd():
        return "zstd"
    if has_lz4():
        return "lz4"
    return "gzip"


@dataclass(frozen=True, slots=True)
class RawRecord:
    """A record as stored in Kafka (undecoded): what the dead-letter topic holds."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes] = field(default_factory=dict)


class KafkaBus(Bus):
    """Bus over a Kafka cluster. `bootstrap` is "host:port[,host:port...]"; `security` (SASL/TLS,
    scalerl.bus.security) defaults to the SCALERL_KAFKA_* environment (PLAINTEXT when unset)."""

    def __init__(self, bootstrap: str, *, client_id: str = "scalerl",
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 replication_factor: int | None = None, compression: str | None = None,
                 request_timeout_s: float = 30.0, session_timeout_s: float = 10.0,
                 max_batch_s: float = DEFAULT_MAX_BATCH_S, security: KafkaSecurity | None = None,
                 connect_timeout_s: float | None = None) -> None:
        self.bootstrap = [b.strip() for b in bootstrap.split(",") if b.strip()]
        if not self.bootstrap:
            raise ValueError("KafkaBus: empty bootstrap address")
        self.security = security if security is not None else KafkaSecurity.from_env()
        # every client of this bus: security settings, and a bounded wait for the first broker (a wrong
        # password or certificate fails the bootstrap within connect_timeout_s, default request_timeout_s,
        # instead of hanging)
        self.connect_timeout_s = request_timeout_s if connect_timeout_s is None else connect_timeout_s
        self._conn = {**self.security.client_kwargs(), "bootstrap_timeout_ms": int(self.connect_timeout_s * 1000)}
        self.client_id = client_id
        self.max_message_bytes = max_message_bytes
        self.replication_factor = replication_factor
        self.compression = compression or _compression()
        self.request_timeout_ms = int(request_timeout_s * 1000)
        # A dead group member's partitions move to the others after this long (the client default, 45 s,
        # stalls a pipeline for most of a minute when a generator is killed).
        self.session_timeout_ms = int(session_timeout_s * 1000)
        self.max_poll_interval_ms = int(max_batch_s * 1000)
        self._lock = threading.Lock()
        self._producer: Any = None
        self._admin: Any = None
        self._pending: list[_Send] = []
        self._known_topics: set[str] = set()

    # ---- clients (created lazily, shared) ---------------------------------------------------------

    def connect(self, factory: Any, **kwargs: Any) -> Any:
        """`factory(bootstrap_servers=..., <security>, **kwargs)`; a failed bootstrap raises
        KafkaConnectError saying which step failed (TCP, TLS, SASL) instead of kafka-python's
        "Unable to bootstrap"."""
        try:
            return factory(bootstrap_servers=self.bootstrap, **self._conn, **kwargs)
        except kafka_errors.KafkaTimeoutError as exc:
            why = diagnose(self.bootstrap, self.security, timeout_s=min(5.0, self.connect_timeout_s))
            raise KafkaConnectError(f"Kafka {','.join(self.bootstrap)} ({self.security.describe()}): no broker "
                                    f"answered within {self.connect_timeout_s:g}s: {why}") from exc

    def _get_producer(self) -> Any:
        with self._lock:
            if self._producer is None:
                self._producer = self.connect(
                    KafkaProducer, client_id=f"{self.client_id}-producer", enable_idempotence=True, acks="all",
                    compression_type=self.compression, max_request_size=self.max_message_bytes, linger_ms=2,
                    request_timeout_ms=self.request_timeout_ms)
            return self._producer

    def _get_admin(self) -> Any:
        with self._lock:
            if self._admin is None:
                self._admin = _OneCallAtATime(self.connect(KafkaAdminClient, client_id=f"{self.client_id}-admin",
                                                           request_timeout_ms=self.request_timeout_ms))
            return self._admin

    # ---- topics -----------------------------------------------------------------------------------

    def _default_replication(self) -> int:
        if self.replication_factor is not None:
            return self.replication_factor
        brokers = self._get_admin().describe_cluster().get("brokers") or []
        return max(1, min(3, len(brokers)))

    def advertised_brokers(self) -> list[tuple[str, int]]:
        """(host, port) of every broker as the bootstrap's metadata response advertises it (what clients
        connect to after bootstrapping), read from the admin client's cluster metadata: no broker but the
        bootstrap address is contacted."""
        brokers = self._get_admin()._manager.cluster.brokers()
        return sorted((str(b.host), int(b.port)) for b in brokers)

    def partitions(self, topic: str) -> list[int]:
        """The partition ids of `topic` (empty if it does not exist)."""
        for t in self._get_admin().describe_topics([topic]):
            if t.get("name") == topic and t.get("error_code", 0) == 0:
                return sorted(p["partition_index"] for p in t.get("partitions") or [])
        return []

    def ensure_topics(self, topics: list[str], partitions: int = 1) -> None:
        """Create missing topics (idempotent; an existing topic with fewer partitions is grown to
        `partitions`, never shrunk) with `max.message.bytes`, and wait until every partition has a
        leader."""
        topics = list(dict.fromkeys(topics))
        if not topics:
            return
        admin = self._get_admin()
        rf = self._default_replication()
        spec = {t: {"num_partitions": partitions, "replication_factor": rf,
                    "configs": {"max.message.bytes": str(self.max_message_bytes)}} for t in topics}
        result = admin.create_topics(spec, timeout_ms=self.request_timeout_ms, raise_errors=False)
        for t in result.get("topics", []):
            code = t.get("error_code", 0)
            if code not in (0, kafka_errors.TopicAlreadyExistsError.errno):
                raise kafka_errors.for_code(code)(f"create topic {t.get('name')}: {t.get('error_message')}")
        admin.wait_for_topics(topics, timeout_ms=self.request_timeout_ms)
        grow = {t: partitions for t in topics if len(self.partitions(t)) < partitions}
        if grow:
            admin.create_partitions(grow, timeout_ms=self.request_timeout_ms)
            admin.wait_for_topics(list(grow), timeout_ms=self.request_timeout_ms)
        with self._lock:
            self._known_topics.update(topics)

    def delete_topics(self, topics: list[str]) -> None:
        """Delete topics (missing ones are ignored), e.g. when a job is torn down."""
        existing = set(self._get_admin().list_topics())
        doomed = [t for t in dict.fromkeys(topics) if t in existing]
        if doomed:
            self._get_admin().delete_topics(doomed, timeout_ms=self.request_timeout_ms)
        with self._lock:
            self._known_topics.difference_update(topics)

    def list_topics(self, prefix: str = "") -> list[str]:
        """Names of the topics that start with `prefix`, sorted."""
        return sorted(t for t in self._get_admin().list_topics() if t.startswith(prefix))

    def _ensure_dlq(self, topic: str) -> None:
        if topic not in self._known_topics:
            self.ensure_topics([topic], partitions=1)

    # ---- produce ----------------------------------------------------------------------------------

    def publish(self, topic: str, value: Any, *, key: str | None = None,
                headers: dict[str, str] | None = None) -> None:
        hdrs = [("schema", str(SCHEMA_VERSION).encode())]
        hdrs += [(k, str(v).encode()) for k, v in (headers or {}).items() if k != "schema"]
        self.publish_raw(topic, encode(value), key=key.encode() if key is not None else None,
                         headers=hdrs)

    def publish_raw(self, topic: str, data: bytes, *, key: bytes | None = None,
                    headers: list[tuple[str, bytes]] | None = None) -> None:
        """Append undecoded bytes (the dead-letter path; tests use it to inject bad records)."""
        hdrs = list(headers or [])
        fut = self._get_producer().send(topic, value=data, key=key, headers=hdrs)
        with self._lock:
            self._pending.append(_Send(topic, data, key, hdrs, fut))
            if len(self._pending) > 10_000:  # publishers that rarely flush: drop acknowledged ones
                self._pending = [p for p in self._pending if not (p.future.is_done and p.future.succeeded())]

    def flush(self, timeout_s: float | None = None) -> None:
        """Block until everything published is acknowledged (acks=all); raise the first failure.

        Failed sends stay pending: the next flush sends them again, in publish order, before it waits (see
        the module docstring); a non-retriable failure is raised once as UndeliverableRecord and dropped."""
        with self._lock:
            producer = self._producer
            if producer is None:
                return
            for p in self._pending:  # an earlier flush failed: send its failed records again
                if p.future.is_done and p.future.failed() and getattr(p.future.exception, "retriable", True):
                    p.future = producer.send(p.topic, value=p.value, key=p.key, headers=p.headers)
        try:
            producer.flush(timeout=timeout_s)
        finally:
            with self._lock:
                undelivered = [p for p in self._pending if not (p.future.is_done and p.future.succeeded())]
                fatal = [p for p in undelivered
                         if p.future.is_done and not getattr(p.future.exception, "retriable", True)]
                self._pending = [p for p in undelivered if p not in fatal]
        if fatal:
            p = fatal[0]
            raise UndeliverableRecord(f"{len(fatal)} record(s) can never be delivered; the first to {p.topic} "
                                      f"(key {p.key!r}): {p.future.exception!r}")
        for p in undelivered:
            if not p.future.is_done:
                raise kafka_errors.KafkaTimeoutError(f"flush: a record to {p.topic} is still in flight")
            raise p.future.exception

    # ---- consume ----------------------------------------------------------------------------------

    def consumer(self, topics: list[str], group: str, *, dead_letters: bool = True,
                 sole_owner: bool = False) -> KafkaBusConsumer:
        return KafkaBusConsumer(self, list(topics), group, dead_letters=dead_letters, sole_owner=sole_owner)

    def reader(self, topics: list[str], *, dead_letters: bool = False, role: str = "reader") -> KafkaBusConsumer:
        """Every record of `topics` from the beginning, outside any consumer group (the policy topic:
        no group to join, no coordinator to find, nothing left behind in the broker)."""
        return KafkaBusConsumer(self, list(topics), None, dead_letters=dead_letters, role=role)

    def _raw_consumer(self, **extra: Any) -> Any:
        return self.connect(KafkaConsumer, enable_auto_commit=False,
                             auto_offset_reset="earliest",
                             max_partition_fetch_bytes=self.max_message_bytes,
                             fetch_max_bytes=max(52428800, self.max_message_bytes),
                             request_timeout_ms=self.request_timeout_ms,
                             session_timeout_ms=self.session_timeout_ms,
                             max_poll_interval_ms=self.max_poll_interval_ms,
                             heartbeat_interval_ms=max(100, self.session_timeout_ms // 4), **extra)

    def read_raw(self, topic: str, timeout_s: float = 10.0) -> list[RawRecord]:
        """Every record currently in `topic` (all partitions, undecoded, no consumer group), read
        up to the end offsets taken at the call; returns early once they are reached."""
        parts = [TopicPartition(topic, p) for p in self.partitions(topic)]
        if not parts:
            return []
        c = self._raw_consumer(group_id=None, client_id=f"{self.client_id}-reader")
        try:
            c.assign(parts)
            c.seek_to_beginning(*parts)
            end = c.end_offsets(parts)
            out: list[RawRecord] = []
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and any(c.position(tp) < end[tp] for tp in parts):
                for tp, recs in c.poll(timeout_ms=200).items():
                    out += [RawRecord(tp.topic, tp.partition, r.offset, r.key, r.value,
                                      {k: v or b"" for k, v in r.headers or []}) for r in recs]
            return sorted(out, key=lambda r: (r.partition, r.offset))
        finally:
            c.close(autocommit=False)

    # ---- offsets / lag ----------------------------------------------------------------------------

    def committed(self, group: str, topic: str) -> dict[int, int]:
        """partition -> committed next offset of `group` on `topic` (partitions never committed are
        absent)."""
        admin = self._get_admin()
        deadline = time.monotonic() + self.request_timeout_ms / 1000
        while True:
            try:
                offsets = admin.list_group_offsets(group).get(group, {})
                break
            except (kafka_errors.CoordinatorNotAvailableError,
                    kafka_errors.CoordinatorLoadInProgressError,
                    kafka_errors.NotCoordinatorError):
                # the offsets topic is created on first use, and after a broker restart the group's
                # coordinator moves: it may not be up yet, or not where the client last saw it
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        return {tp.partition: om.offset for tp, om in offsets.items()
                if tp.topic == topic and om is not None and om.offset is not None and om.offset >= 0}

    def lag(self, group: str, topic: str) -> int:
        """Records of `topic` not yet committed by `group`: Σ over partitions (end offset − committed
        offset); a partition the group never committed counts from its earliest offset."""
        parts = [TopicPartition(topic, p) for p in self.partitions(topic)]
        if not parts:
            return 0
        admin = self._get_admin()
        end = admin.list_partition_offsets({tp: OffsetSpec.LATEST for tp in parts})
        start = admin.list_partition_offsets({tp: OffsetSpec.EARLIEST for tp in parts})
        committed = self.committed(group, topic)
        total = 0
        for tp in parts:
            done = committed.get(tp.partition, start[tp].offset)
            total += max(0, end[tp].offset - max(done, start[tp].offset))
        return total

    def close(self) -> None:
        """Flush (bounded by the request timeout), then close the clients; never raises."""
        try:
            self.flush(timeout_s=self.request_timeout_ms / 1000)
        except kafka_errors.KafkaError as exc:
            log.warning("close: records not acknowledged may be lost: %s", exc)
        finally:
            with self._lock:
                producer, admin = self._producer, self._admin
                self._producer = self._admin = None
            if producer is not None:
                producer.close(timeout=5)
            if admin is not None:
                admin.close()


class _OneCallAtATime:
    """kafka-python's admin client is not thread-safe (concurrent calls from the operator's workers raised
    NodeNotReadyError): the bus's one admin client takes one call at a time."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._calls = threading.RLock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def serialized(*args: Any, **kwargs: Any) -> Any:
            with self._calls:
                return attr(*args, **kwargs)
        return serialized


__all__ = ["DEFAULT_MAX_BATCH_S", "DEFAULT_MAX_MESSAGE_BYTES", "KafkaBus", "KafkaBusConsumer", "RawRecord",
           "UndeliverableRecord", "_SeekOnAssign", "_tp", "dlq_topic"]
