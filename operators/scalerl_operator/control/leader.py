"""Leader election over a `coordination.k8s.io/v1` Lease, with client-go's leaderelection semantics.

Why a Lease: it is the Kubernetes-native lock every built-in controller (kube-controller-manager,
the scheduler, controller-runtime operators) uses, it needs RBAC on one named object, and
`kubectl get lease` shows who leads. kopf's own peering is a different mechanism: it needs the
KopfPeering CRDs cluster-wide and it *pauses* operators of lower priority rather than electing
exactly one, which is no guarantee while two pods overlap during a rollout. With the Lease, a
replica that is not the leader never starts kopf at all; a leader that cannot renew within the
renew deadline stops and exits (the pod restarts and queues up again), as controller-runtime does,
so two operators never reconcile the same RLJob. One replica plus the Lease is the default: a
second replica only shortens a failover from "a new pod is scheduled" to `leaseDurationSeconds`.

The acquire/renew/take-over rule (`next_action`) is pure; `LeaderElector` does the API calls with
optimistic concurrency (every update carries the resourceVersion it read; a 409 means another
candidate won the race).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from scalerl_operator.api.conditions import parse_rfc3339, rfc3339_us
from scalerl_operator.cluster.kube import Kube, KubeError, path

log = logging.getLogger(__name__)

Action = Literal["create", "renew", "takeover", "wait"]


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    holder: str | None
    renew_time_s: float | None
    duration_s: int
    transitions: int = 0


def record_of(lease: dict[str, Any] | None) -> LeaseRecord | None:
    if lease is None:
        return None
    s = lease.get("spec") or {}
    renew = s.get("renewTime")
    return LeaseRecord(s.get("holderIdentity") or None, parse_rfc3339(renew) if renew else None,
                       int(s.get("leaseDurationSeconds") or 0), int(s.get("leaseTransitions") or 0))


def next_action(rec: LeaseRecord | None, me: str, now_s: float) -> Action:
    """What a candidate does with the Lease it read. Examples (duration 15 s): no Lease → create;
    held by me → renew; held by another, renewed 10 s ago → wait; renewed 16 s ago → takeover;
    released (no holder) → takeover."""
    if rec is None:
        return "create"
    if rec.holder == me:
        return "renew"
    expired = rec.renew_time_s is None or now_s > rec.renew_time_s + rec.duration_s
    return "takeover" if rec.holder is None or expired else "wait"


class LeaderElector:
    """One candidate for the Lease `namespace/name`."""

    def __init__(self, kube: Kube, namespace: str, name: str, identity: str, *, lease_duration_s: int = 15,
                 renew_deadline_s: float = 10.0, retry_period_s: float = 2.0) -> None:
        if not retry_period_s < renew_deadline_s < lease_duration_s:
            raise ValueError(f"leader election: need retry period ({retry_period_s}s) < renew deadline "
                             f"({renew_deadline_s}s) < lease duration ({lease_duration_s}s)")
        self.kube, self.namespace, self.name, self.identity = kube, namespace, name, identity
        self.lease_duration_s, self.renew_deadline_s, self.retry_period_s = (lease_duration_s, renew_deadline_s,
                                                                              retry_period_s)

    def _spec(self, now_s: float, rec: LeaseRecord | None, acquire: bool) -> dict[str, Any]:
        spec = {"holderIdentity": self.identity, "leaseDurationSeconds": self.lease_duration_s,
                "renewTime": rfc3339_us(now_s), "leaseTransitions": (rec.transitions if rec else 0) + (
                    1 if acquire and rec is not None else 0)}
        if acquire:
            spec["acquireTime"] = rfc3339_us(now_s)
        return spec

    def try_once(self, now_s: float | None = None) -> bool:
        """One attempt to acquire or renew; True when this candidate holds the Lease afterwards."""
        now_s = time.time() if now_s is None else now_s
        lease = self.kube.get("coordination.k8s.io/v1", "Lease", self.namespace, self.name)
        rec = record_of(lease)
        action = next_action(rec, self.identity, now_s)
        if action == "wait":
            return False
        body: dict[str, Any] = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                "metadata": {"name": self.name, "namespace": self.namespace}}
        try:
            if action == "create":
                body["spec"] = self._spec(now_s, None, acquire=True)
                self.kube.request("POST", path("coordination.k8s.io/v1", "Lease", self.namespace), body=body)
            else:
                assert lease is not None
                spec = {**lease.get("spec", {}), **self._spec(now_s, rec, acquire=action == "takeover")}
                body["metadata"]["resourceVersion"] = lease["metadata"]["resourceVersion"]
                body["spec"] = spec
                self.kube.request("PUT", path("coordination.k8s.io/v1", "Lease", self.namespace, self.name), body=body)
        except KubeError as exc:
            if exc.status == 409:  # another candidate created or updated it first
                return False
            raise
        if action != "renew":
            log.info("leader election: %s acquired lease %s/%s", self.identity, self.namespace, self.name)
        return True

    def acquire(self, stop: threading.Event) -> bool:
        """Block until this candidate leads (True) or `stop` is set (False)."""
        while not stop.is_set():
            try:
                if self.try_once():
                    return True
            except (KubeError, OSError) as exc:
                log.warning("leader election: %s", exc)
            stop.wait(self.retry_period_s)
        return False

    def keep(self, stop: threading.Event, on_lost: Callable[[], None]) -> threading.Thread:
        """Renew every retry period in a thread; call `on_lost` when no renewal succeeded within the
        renew deadline (or another holder took the Lease)."""

        def loop() -> None:
            last_ok = time.monotonic()
            while not stop.wait(self.retry_period_s):
                try:
                    ok = self.try_once()
                except (KubeError, OSError) as exc:
                    log.warning("leader election: renewing failed: %s", exc)
                    ok = False
                if ok:
                    last_ok = time.monotonic()
                elif time.monotonic() - last_ok > self.renew_deadline_s or self._lost_to_other():
                    log.error("leader election: %s lost lease %s/%s", self.identity, self.namespace, self.name)
                    on_lost()
                    return

        t = threading.Thread(target=loop, name="lease-renewal", daemon=True)
        t.start()
        return t

    def _lost_to_other(self) -> bool:
        try:
            rec = record_of(self.kube.get("coordination.k8s.io/v1", "Lease", self.namespace, self.name))
        except (KubeError, OSError):
            return False
        return rec is not None and rec.holder not in (None, self.identity)

    def release(self) -> None:
        """Give the Lease up at a clean shutdown, so a standby takes over at once."""
        lease = self.kube.get("coordination.k8s.io/v1", "Lease", self.namespace, self.name)
        rec = record_of(lease)
        if lease is None or rec is None or rec.holder != self.identity:
            return
        lease["spec"] = {**lease["spec"], "holderIdentity": None, "leaseDurationSeconds": 1,
                         "renewTime": rfc3339_us(time.time())}
        try:
            self.kube.request("PUT", path("coordination.k8s.io/v1", "Lease", self.namespace, self.name), body=lease)
        except KubeError as exc:
            log.warning("leader election: releasing the lease failed: %s", exc)
