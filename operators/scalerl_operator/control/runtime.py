"""What the operator process keeps between kopf's handler calls and the work it does for one RLJob
(`Runtime`): the periodic pass (`sync`: one autoscaler pass when its period came round, the RL status
from the metrics topic, then `reconcile`), the shared Kafka clients and metrics readers, and the
finalizer's clean-up (`cleanup`, done by `scalerl_operator.control.cleanup`: Kafka topics and consumer
groups, and the store's objects with `store.retention: delete`). The kopf handlers that drive it are in
`scalerl_operator.control.handlers`.

Passes of one RLJob never overlap: `lock(uid)` serialises the pool's passes and the event handlers.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from prometheus_client import Counter, Gauge

from scalerl.bus.kafka import KafkaBus
from scalerl.bus.security import KafkaSecurity
from scalerl.config import SpecError
from scalerl_operator.api import conditions as c
from scalerl_operator.api.spec import GROUP, VERSION, RLJobSpec, parse_served_spec
from scalerl_operator.autoscale.scaler import autoscale, lag_status, scaling_status
from scalerl_operator.cluster.kafka_access import kafka_security, loopback_problem
from scalerl_operator.cluster.kube import Kube
from scalerl_operator.cluster.rlstatus import LearnerStatus, MetricsTail, fold
from scalerl_operator.control import kueue
from scalerl_operator.control.cleanup import finalize
from scalerl_operator.control.jobstatus import bus_reachable_patch, is_terminal
from scalerl_operator.control.reconcile import reconcile, unrealisable
from scalerl_operator.control.workqueue import WorkQueue
from scalerl_operator.render.names import bus_prefix

log = logging.getLogger("scalerl_operator")


# served on --metrics-port by `python -m scalerl_operator`
SCALE_EVENTS = Counter("scalerl_operator_scale_events_total", "Pool size changes written by the autoscaler",
                       ["namespace", "job", "role", "direction"])
DESIRED_REPLICAS = Gauge("scalerl_operator_desired_replicas", "Replicas the autoscaler decided, per pool",
                         ["namespace", "job", "role"])
RECONCILE_ERRORS = Counter("scalerl_operator_reconcile_errors_total", "Reconcile passes that raised",
                           ["namespace", "job"])


@dataclass(frozen=True)
class OperatorConfig:
    """Settings of one operator process (the CLI fills them; tests use the environment)."""

    interval_s: float = 15.0  # status + autoscaler period per RLJob, seconds (HPA's sync period)
    kafka_timeout_s: float = 10.0  # per Kafka request, seconds
    kubeconfig: str | None = None  # None: in-cluster service account, else KUBECONFIG
    workers: int = 4  # threads of the periodic passes, shared by every RLJob
    backoff_max_s: float = 60.0  # cap of the retry delay of a failing RLJob, seconds

    @classmethod
    def from_env(cls) -> OperatorConfig:
        """SCALERL_OPERATOR_INTERVAL_S, SCALERL_OPERATOR_KAFKA_TIMEOUT_S, SCALERL_OPERATOR_WORKERS,
        SCALERL_OPERATOR_BACKOFF_MAX_S, KUBECONFIG."""
        env = os.environ
        return cls(interval_s=float(env.get("SCALERL_OPERATOR_INTERVAL_S", cls.interval_s)),
                   kafka_timeout_s=float(env.get("SCALERL_OPERATOR_KAFKA_TIMEOUT_S", cls.kafka_timeout_s)),
                   kubeconfig=env.get("KUBECONFIG") or None,
                   workers=int(env.get("SCALERL_OPERATOR_WORKERS", cls.workers)),
                   backoff_max_s=float(env.get("SCALERL_OPERATOR_BACKOFF_MAX_S", cls.backoff_max_s)))


@dataclass
class Runtime:
    """What the operator process keeps between handler calls (in kopf's memo)."""

    kube: Kube
    config: OperatorConfig
    buses: dict[tuple[str, KafkaSecurity], KafkaBus] = field(default_factory=dict)
    tails: dict[str, MetricsTail] = field(default_factory=dict)
    learners: dict[str, LearnerStatus] = field(default_factory=dict)
    topics_ready: set[tuple[str, str, int]] = field(default_factory=set)
    stopping: threading.Event = field(default_factory=threading.Event)
    queue: WorkQueue | None = None
    next_scale: dict[tuple[str, str], float] = field(default_factory=dict)  # (ns, name) -> monotonic s
    _locks: dict[str, threading.Lock] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)

    def lock(self, uid: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(uid, threading.Lock())

    def bus(self, bootstrap: str, security: KafkaSecurity | None = None) -> KafkaBus:
        """The shared client of these brokers with these settings (None: PLAINTEXT)."""
        security = security or KafkaSecurity()
        with self._guard:
            if (bootstrap, security) not in self.buses:
                self.buses[(bootstrap, security)] = KafkaBus(
                    bootstrap, client_id="scalerl-operator", request_timeout_s=self.config.kafka_timeout_s,
                    security=security)
            return self.buses[(bootstrap, security)]

    def ensure_topics(self, bootstrap: str, data: list[str], single: list[str], partitions: int,
                      security: KafkaSecurity | None = None) -> None:
        """Create the job's topics once per process (data topics with `partitions`)."""
        key = (bootstrap, data[0], partitions)
        if key not in self.topics_ready:
            bus = self.bus(bootstrap, security)
            bus.ensure_topics(data, partitions=partitions)
            bus.ensure_topics(single, partitions=1)
            self.topics_ready.add(key)

    def learner(self, uid: str, name: str, namespace: str, spec: RLJobSpec,
                security: KafkaSecurity | None = None) -> tuple[LearnerStatus, bool]:
        """(what the learner reported so far, whether this read worked)."""
        prev = self.learners.get(uid, LearnerStatus())
        topic = f"{bus_prefix(name, namespace)}.metrics"
        try:
            if uid not in self.tails or self.tails[uid].security != (security or KafkaSecurity()):
                self.forget(uid, keep_status=True)
                self.tails[uid] = MetricsTail(spec.bus.bootstrap, topic, timeout_s=self.config.kafka_timeout_s,
                                              security=security)
            self.learners[uid] = fold(prev, self.tails[uid].poll())
            return self.learners[uid], True
        except Exception as exc:  # the status keeps the last values; the autoscaler counts a failure
            log.warning("%s: reading %s failed: %s", name, topic, exc)
            self.forget(uid, keep_status=True)  # a fresh reader next time
            return prev, False

    def forget(self, uid: str, keep_status: bool = False) -> None:
        tail = self.tails.pop(uid, None)
        if tail is not None:
            try:
                tail.close()
            except Exception as exc:  # a broken client: nothing more to release
                log.debug("closing the metrics reader: %s", exc)
        if not keep_status:
            self.learners.pop(uid, None)
            with self._guard:
                self._locks.pop(uid, None)

    def close(self, wait_s: float = 30.0) -> None:
        """Refuse new passes, wait (bounded) for the passes in flight, close the Kafka clients (the API
        client belongs to whoever made the Kube)."""
        self.stopping.set()
        deadline = time.monotonic() + wait_s
        if self.queue is not None:
            self.queue.stop(wait_s)
        with self._guard:
            locks = list(self._locks.values())
        for lock in locks:
            if lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                lock.release()
        for tail in self.tails.values():
            tail.close()
        for bus in self.buses.values():
            bus.close()

    # ---- the work -----------------------------------------------------------------------------------

    def start_queue(self) -> WorkQueue:
        """The shared pool of periodic passes (`config.workers` threads)."""
        self.queue = WorkQueue(self.periodic, workers=self.config.workers, interval_s=self.config.interval_s,
                               backoff_base_s=min(1.0, self.config.interval_s),
                               backoff_max_s=self.config.backoff_max_s)
        self.queue.start()
        return self.queue

    def periodic(self, key: Any) -> bool:
        """One pass of the pool for `key` = (namespace, name): the autoscaler when its period came
        round, then status and drift repair. False: the RLJob is gone (the queue forgets it)."""
        ns, name = key
        now = time.monotonic()
        scale = now >= self.next_scale.get(key, 0.0)
        try:
            phase = self.sync(ns, name, scale=scale)
        except Exception:
            RECONCILE_ERRORS.labels(ns, name).inc()
            raise
        if phase is None:
            self.next_scale.pop(key, None)
            return False
        if scale:
            self.next_scale[key] = now + self.config.interval_s
        return True

    def sync(self, namespace: str, name: str, *, scale: bool) -> str | None:
        """Autoscale (when `scale`), then reconcile; returns the phase (None: the RLJob is gone)."""
        if self.stopping.is_set():
            return None
        obj = self.kube.get(f"{GROUP}/{VERSION}", "RLJob", namespace, name)
        if obj is None or obj["metadata"].get("deletionTimestamp"):
            return None
        uid = obj["metadata"]["uid"]
        with self.lock(uid):
            if self.stopping.is_set():
                return None
            obj = self.kube.get(f"{GROUP}/{VERSION}", "RLJob", namespace, name)  # fresh, under the lock
            if obj is None or obj["metadata"].get("deletionTimestamp"):
                return None
            spec: RLJobSpec | None
            try:
                spec = parse_served_spec(obj.get("spec") or {})
                if unrealisable(spec) is not None:
                    spec = None  # reconcile reports it; no Kafka reads for a job that cannot run
            except SpecError:
                spec = None
            # the Kafka credentials of spec.bus.security (read from its Secret on every pass: rotation)
            sec = kafka_security(self.kube, namespace, spec.bus) if spec is not None else None
            if spec is not None:
                obj = self._check_bus(obj, spec, sec)
            learner, ok = (self.learner(uid, name, namespace, spec, sec) if spec is not None
                           else (LearnerStatus(), False))
            if spec is not None and scale and not is_terminal(obj.get("status") or {}) and not kueue.holds(obj, spec):
                obj = self._autoscale(obj, spec, learner if ok else None, sec)
            out = reconcile(self.kube, obj, learner=learner,
                            ensure_topics=functools.partial(self.ensure_topics, security=sec))
            return out.phase

    def _check_bus(self, obj: dict[str, Any], spec: RLJobSpec, security: KafkaSecurity | None) -> dict[str, Any]:
        """Condition BusReachable from the brokers' advertised addresses (the bootstrap's metadata, through the
        job's shared client), and an Event when it turns False; a bootstrap that fails says nothing here (the
        topic creation reports it)."""
        try:
            advertised = self.bus(spec.bus.bootstrap, security).advertised_brokers()
        except Exception as exc:  # unreachable now: reconcile's Kafka calls fail and are retried
            log.debug("%s: reading the brokers' metadata failed: %s", obj["metadata"]["name"], exc)
            return obj
        problem = loopback_problem(spec.bus.bootstrap, advertised)
        patch, warn = bus_reachable_patch(obj, problem, datetime.now(UTC))
        if patch is None:
            return obj
        m = obj["metadata"]
        if warn:
            log.warning("%s/%s: %s", m["namespace"], m["name"], problem)
            self.kube.event(obj, "Warning", c.REASON_BROKERS_ADVERTISE_LOOPBACK, str(problem), "BusCheck")
        return self.kube.patch_status(m["namespace"], m["name"], patch)

    def _autoscale(self, obj: dict[str, Any], spec: RLJobSpec, learner: LearnerStatus | None,
                   security: KafkaSecurity | None = None) -> dict[str, Any]:
        bus = self.bus(spec.bus.bootstrap, security)
        decisions = autoscale(self.kube, obj, spec, bus=bus, learner=learner, now_s=time.time())
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        for role, d in decisions.items():
            DESIRED_REPLICAS.labels(ns, name, role).set(d.replicas)
            if d.changed:
                SCALE_EVENTS.labels(ns, name, role, "up" if d.replicas > d.current else "down").inc()
        patch = scaling_status(obj, decisions, datetime.now(UTC)) if decisions else {}
        try:
            patch.update(lag_status(bus, bus_prefix(name, ns)))
        except Exception as exc:  # lag is informative here; the verifier pool counted its own failure
            log.warning("%s: reading topic lag failed: %s", name, exc)
        if not patch:
            return obj
        return self.kube.patch_status(ns, name, patch)

    def cleanup(self, obj: dict[str, Any], retry: int) -> None:
        """The finalizer's work (`cleanup.finalize`); raises kopf.TemporaryError while a step should be retried."""
        m = obj["metadata"]
        prefix = bus_prefix(m["name"], m["namespace"])
        try:
            finalize(self.kube, obj, retry, bus_for=self.bus, kafka_timeout_s=self.config.kafka_timeout_s)
        finally:
            self.topics_ready = {k for k in self.topics_ready if not k[1].startswith(f"{prefix}.")}
