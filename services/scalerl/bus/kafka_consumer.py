"""The Kafka bus's consumer (`scalerl.bus.kafka.KafkaBus.consumer` / `reader` make them).

Consumer: a group member (`subscribe`, group-managed assignment) with `enable_auto_commit=False` and
`auto_offset_reset="earliest"`; it starts from the group's committed offsets. `max.poll.interval.ms` is
`max_batch_s` (default one hour, not Kafka's 5 minutes): a role does its work between two polls, and a
generator batch longer than the interval would leave the group, fail its commit and regenerate the same
prompts forever. A dead process still leaves within the session timeout (heartbeats run in the background).
- A record whose bytes do not decode (any error from `decode_envelope`) is skipped: its offset counts as
  consumed and `poll` never raises on bad data. A consumer that owns its topics' dead letters
  (`dead_letters=True`, the default for a group; see `scalerl.bus.dlq.DLQ_OWNERS`) first copies it, raw,
  to the job's dead-letter topic (`<prefix>.dlq`, prefix = the topic name before its last ".") with the
  headers of `scalerl.bus.dlq.DLQ_HEADERS` (reason "undecodable: ...", role = the group) and flushes;
  any other consumer only skips it; both count it (`undecodable`). Records read from the dead-letter topic
  itself are never re-routed. Positions move past a polled batch only once it is handed over: when the
  dead-letter flush raises, the batch's partitions are sought back to their first record and `poll`
  raises, so the next poll returns the same records again (good ones included) and nothing is skipped.
- `seek()` works at any time. Choice: we keep group-managed assignment (so several generators can
  share a topic) and route seeks through a rebalance listener: a seek for a partition this member
  owns is applied at once; a seek for a partition it does not own yet (e.g. right after creation,
  before the first poll has joined the group) is kept pending and applied in
  `on_partitions_assigned`, i.e. before anything is fetched for it. So a learner that restores
  positions from a checkpoint and then polls reads exactly from those offsets.
- `positions()` are those of the records returned so far (and of seeks), plus the current fetch
  position of owned partitions nothing was returned from yet; partitions revoked by a rebalance are
  dropped (their new owner starts from the committed offset: at-least-once, downstream dedups).
- A **sole owner** (`sole_owner=True`: the learner, the only member of its group, whose positions live in its
  checkpoints) never lets the group's committed offsets decide where it reads: on every assignment, after
  a rebalance or a membership lost across a broker restart as well as the first one, each partition it
  has a position for (restored by `seek`, or read so far) continues from that position. Its positions
  survive revocation. (Otherwise a resumed learner that loses membership before its first commit would jump
  to the dead learner's commits, past groups it never trained, and in steady state a rebalance would
  re-deliver the buffered groups as duplicates.)
- `commit()` is synchronous. A commit rejected because the group rebalanced (CommitFailedError) is
  logged and dropped: the records will be delivered again to the partition's new owner.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

from kafka import TopicPartition
from kafka import errors as kafka_errors
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.structs import OffsetAndMetadata

from scalerl.bus.base import Consumer, Record
from scalerl.bus.dlq import DLQ_HEADERS, dlq_headers
from scalerl.rpc.convert import decode_envelope as decode

log = logging.getLogger(__name__)


def dlq_topic(topic: str) -> str:
    """The dead-letter topic of `topic`: "<job>.rollouts" -> "<job>.dlq"."""
    prefix = topic.rsplit(".", 1)[0] if "." in topic else topic
    return f"{prefix}.dlq"


def _tp(position_key: str) -> TopicPartition:
    topic, _, part = position_key.rpartition(":")
    if not topic or not part.isdigit():
        raise ValueError(f"position key {position_key!r}: expected 'topic:partition'")
    return TopicPartition(topic, int(part))


def _key(tp: Any) -> str:
    return f"{tp.topic}:{tp.partition}"


class _SeekOnAssign(ConsumerRebalanceListener):  # type: ignore[misc]
    """Applies pending seeks when partitions are assigned; forgets positions of revoked ones.
    Runs on the consumer's IO thread: it only touches in-memory state (no blocking IO)."""

    def __init__(self, owner: KafkaBusConsumer) -> None:
        self.owner = owner

    def on_partitions_revoked(self, revoked: Any) -> None:
        if self.owner._sole_owner:
            return  # its positions stay its own: re-applied when the partitions come back
        with self.owner._state_lock:
            for tp in revoked:
                self.owner._pos.pop(tp, None)

    def on_partitions_assigned(self, assigned: Any) -> None:
        with self.owner._state_lock:
            for tp in assigned:
                off = self.owner._pending_seeks.pop(tp, None)
                if off is None and self.owner._sole_owner:
                    off = self.owner._pos.get(tp)
                if off is not None:
                    self.owner._kc.seek(tp, off)
                    self.owner._pos[tp] = off


class KafkaBusConsumer(Consumer):
    """A consumer-group member; see the module docstring for the semantics."""

    def __init__(self, bus: Any, topics: list[str], group: str | None, *, dead_letters: bool = True,
                 role: str | None = None, sole_owner: bool = False) -> None:
        self._bus = bus
        self._topics = topics
        self._group = group
        self._dead_letters = dead_letters
        self._sole_owner = sole_owner
        self._role = role or group or "reader"
        self.undecodable = 0  # records that did not decode (dead-lettered when this consumer owns them)
        self._state_lock = threading.RLock()
        self._pos: dict[Any, int] = {}  # TopicPartition -> next offset to return
        self._dead_unconfirmed: set[tuple[Any, int]] = set()  # dead letters published, not yet flushed
        self._pending_seeks: dict[Any, int] = {}
        self._kc = bus._raw_consumer(
            group_id=group, client_id=f"{bus.client_id}-{group or 'reader'}-{uuid.uuid4().hex[:6]}")
        if group is None:  # a reader: every partition from the beginning, no group, no coordinator
            parts = [TopicPartition(t, p) for t in topics for p in bus.partitions(t)]
            self._kc.assign(parts)
            self._kc.seek_to_beginning(*parts)
        else:
            self._kc.subscribe(topics=topics, listener=_SeekOnAssign(self))

    # ---- poll -------------------------------------------------------------------------------------

    def poll(self, timeout_s: float = 0.0, max_records: int = 1000) -> list[Record]:
        deadline = time.monotonic() + max(0.0, timeout_s)
        out: list[Record] = []
        while True:
            remaining_ms = max(0, int((deadline - time.monotonic()) * 1000))
            batch = self._kc.poll(timeout_ms=remaining_ms, max_records=max_records)
            good: list[Record] = []
            dead = 0
            for recs in batch.values():
                for r in recs:
                    rec = self._convert(r)
                    if rec is None:
                        dead += 1
                    else:
                        good.append(rec)
            if dead and self._dead_letters:
                try:  # the dead letters are durable before their offsets can be committed
                    self._bus.flush(timeout_s=self._bus.request_timeout_ms / 1000)
                except Exception:
                    self._rewind(batch)  # hand nothing of this batch over: it is read again
                    raise
                self._dead_unconfirmed.clear()
            with self._state_lock:
                for tp, recs in batch.items():
                    if recs:
                        self._pos[tp] = recs[-1].offset + 1
            self.undecodable += dead
            out += good
            if out or time.monotonic() >= deadline:
                return out

    def _rewind(self, batch: dict[Any, list[Any]]) -> None:
        """Seek each partition of a batch that was not handed over back to its first record."""
        for tp, recs in batch.items():
            if recs:
                try:
                    self._kc.seek(tp, recs[0].offset)
                except Exception as exc:  # revoked meanwhile: its new owner reads from the committed offset
                    log.warning("rewind of %s to %d failed: %r", _key(tp), recs[0].offset, exc)

    def _convert(self, r: Any) -> Record | None:
        tp = TopicPartition(r.topic, r.partition)
        headers = {k: (v or b"").decode("utf-8", "replace") for k, v in r.headers or []}
        key = r.key.decode("utf-8", "replace") if r.key is not None else None
        try:
            if r.value is None:
                raise ValueError("record has no value (tombstone)")
            value = decode(r.value)
        except Exception as exc:  # never raise on bad data: MessageError, but also anything else
            if self._dead_letters:
                self._dead_letter(tp, r, f"undecodable: {exc}")
            else:
                log.info("skipped undecodable record %s:%d@%d (dead-lettered by the topic's owner)",
                         tp.topic, tp.partition, r.offset)
            return None
        return Record(tp.topic, tp.partition, r.offset, key, value, headers)

    def _dead_letter(self, tp: Any, r: Any, reason: str) -> None:
        target = dlq_topic(tp.topic)
        log.warning("undecodable record %s:%d@%d -> %s: %s", tp.topic, tp.partition, r.offset,
                    target, reason)
        if target == tp.topic:
            return  # a bad record in the dead-letter topic itself: skip it, never loop
        if (tp, r.offset) in self._dead_unconfirmed:
            return  # read again after a failed flush: its copy is still pending in the bus, sent again there
        self._dead_unconfirmed.add((tp, r.offset))
        headers = [(k, v or b"") for k, v in r.headers or [] if k not in DLQ_HEADERS]
        headers += [(k, v.encode()) for k, v in dlq_headers(reason, tp.topic, tp.partition, r.offset,
                                                            self._role).items()]
        self._bus._ensure_dlq(target)
        self._bus.publish_raw(target, r.value if r.value is not None else b"", key=r.key,
                              headers=headers)

    # ---- offsets ----------------------------------------------------------------------------------

    def positions(self) -> dict[str, int]:
        with self._state_lock:
            pos = dict(self._pos)
            pending = dict(self._pending_seeks)
        for tp in self._kc.assignment():
            if tp not in pos:
                try:
                    pos[tp] = self._kc.position(tp, timeout_ms=5000)
                except Exception as exc:  # position unknown yet (offsets still being fetched)
                    log.debug("position(%s) unavailable: %s", tp, exc)
        pos.update(pending)
        return {_key(tp): off for tp, off in pos.items() if off is not None}

    def commit(self, positions: dict[str, int] | None = None) -> None:
        if self._group is None:
            raise ValueError("a reader (no consumer group) has no offsets to commit")
        if positions is None:
            with self._state_lock:
                offsets = dict(self._pos)
        else:
            offsets = {_tp(k): v for k, v in positions.items()}
        if not offsets:
            return
        try:
            self._kc.commit({tp: OffsetAndMetadata(off, "", -1) for tp, off in offsets.items()})
        except kafka_errors.CommitFailedError as exc:
            log.warning("commit of %s rejected after a group rebalance (will be re-delivered): %s",
                        {_key(tp): o for tp, o in offsets.items()}, exc)

    def seek(self, positions: dict[str, int]) -> None:
        with self._state_lock:
            assigned = self._kc.assignment()
            for k, off in positions.items():
                tp = _tp(k)
                if tp.topic not in self._topics:
                    continue
                try:
                    if tp not in assigned:
                        raise ValueError("not assigned yet")
                    self._kc.seek(tp, off)
                    self._pending_seeks.pop(tp, None)
                except ValueError:  # not ours (yet), or revoked by a concurrent rebalance
                    self._pending_seeks[tp] = off
                self._pos[tp] = off

    def drop_membership(self) -> None:
        """Leave the consumer group now and rejoin on the next poll, as a member whose session expired does
        (a broker restart, a long pause): its partitions are revoked and assigned again. For fault
        injection (`scalerl.faults`) and its tests."""
        if self._group is None:
            raise ValueError("a reader (no consumer group) has no membership to drop")
        with self._state_lock:
            self._kc._coordinator.maybe_leave_group(reason="fault injection: membership dropped")
            self._kc._coordinator.request_rejoin()

    def close(self) -> None:
        self._kc.close(autocommit=False)
