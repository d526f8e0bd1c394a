"""The finalizer's clean-up of what Kubernetes cannot garbage-collect (`finalize`): the job's Kafka topics and
consumer groups, and with `store.retention: delete` the objects under spec.store.uri. The workloads are scaled
to zero first (the learner checkpoints on SIGTERM); the children themselves go by garbage collection.

It never keeps a namespace from being deleted. `kubectl delete namespace` deletes the RLJob's Secrets and pods
while the RLJob waits on its finalizer, so a credential Secret a step needs can be gone for good; each step
that fails is either retried or left behind (`decide`):

- **left behind at once**: the Secret is gone (`SecretNotFound`), or the step cannot be done from what the
  spec and the operator have (`CannotClean`: no S3 endpoint or key pair). No wait brings them back;
- **retried** (every CLEANUP_DELAY_S, CLEANUP_RETRIES times): anything else — brokers or store unreachable,
  a Secret that exists but lacks a key, consumer groups that still have members (the role pods leaving) —
  then left behind too.

What is left behind is reported when the finalizer is released: for each thing left, a Warning Event
`CleanupIncomplete` and a log line naming it (the topics and groups `<namespace>.<name>.*` and on which
brokers; the objects under the store URI), why, and the command that removes it by hand. Events are best effort: a
namespace being deleted refuses new objects, Events included (403), and the log line says it all anyway.
"""

from __future__ import annotations

import enum
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import kopf
from kafka import KafkaAdminClient

from scalerl.bus.kafka import KafkaBus
from scalerl.bus.security import KafkaSecurity
from scalerl.config import SpecError
from scalerl_operator.api.infra import StoreSpec
from scalerl_operator.api.newer_fields import FieldsFromNewerCRD
from scalerl_operator.api.spec import RLJobSpec, parse_served_spec
from scalerl_operator.cluster.kafka_access import kafka_security
from scalerl_operator.cluster.kube import Kube, KubeError
from scalerl_operator.cluster.secrets import SecretNotFound, secret_values
from scalerl_operator.control.reconcile import WORKLOADS
from scalerl_operator.render.names import bus_prefix, child_name

log = logging.getLogger("scalerl_operator")

CLEANUP_RETRIES = 60  # x CLEANUP_DELAY_S: how long a step that can still succeed is retried (5 min)
CLEANUP_DELAY_S = 5.0

BusFor = Callable[[str, KafkaSecurity], KafkaBus]  # (bootstrap, security) -> the shared client


class CannotClean(RuntimeError):
    """A step that cannot be done from what the spec and the operator have (one line saying what is missing)."""


class Decision(enum.Enum):
    RETRY = "retry"  # raise kopf.TemporaryError: the finalizer stays, the step runs again
    LEAVE = "leave"  # report what is left behind and release the finalizer


def decide(exc: Exception, *, retry: int, retries: int = CLEANUP_RETRIES) -> Decision:
    """What to do when a step of the clean-up raised `exc` on attempt `retry` (0 = the first).
    Examples: SecretNotFound on attempt 0 → LEAVE; a broker timeout on attempt 3 → RETRY, on attempt 60 → LEAVE."""
    if isinstance(exc, SecretNotFound | CannotClean) or retry >= retries:
        return Decision.LEAVE
    return Decision.RETRY


@dataclass(frozen=True, slots=True)
class Leftover:
    """One thing the clean-up left behind: what, why, and how to remove it by hand."""

    what: str
    why: str
    remedy: str


def kafka_leftover(prefix: str, bootstrap: str, why: str, groups: list[str] | None = None) -> Leftover:
    """The job's topics and consumer groups (`<prefix>.*`, or only `groups`) left on the brokers."""
    opts = f"--bootstrap-server {bootstrap} [--command-config <client.properties>]"
    group_args = " ".join(f"--group {g}" for g in groups) if groups else f"--group <each {prefix}.* group>"
    delete_groups = f"kafka-consumer-groups.sh {opts} --delete {group_args}"
    if groups:
        return Leftover(f"Kafka consumer groups {', '.join(groups)} on {bootstrap}", why, delete_groups)
    topics = prefix.replace(".", "\\.") + "\\..*"  # a regular expression: the job's topics only
    return Leftover(f"Kafka topics and consumer groups {prefix}.* on {bootstrap}", why,
                    f"kafka-topics.sh {opts} --delete --topic '{topics}'; {delete_groups}")


def store_leftover(uri: str, endpoint: str, why: str) -> Leftover:
    """The objects under the store URI (retention: delete) left in the bucket."""
    url = f" --endpoint-url {endpoint}" if endpoint else ""
    return Leftover(f"the objects under {uri}", why, f"aws s3 rm --recursive {uri.rstrip('/')}/{url}")


def report(namespace: str, name: str, leftover: Leftover) -> str:
    """One line for an Event and the log: what was left, why, and the command that removes it.
    Example: "RLJob n/j released its finalizer and left behind the objects under s3://b/j (Secret n/k not found);
    remove by hand: aws s3 rm --recursive s3://b/j/"."""
    return (f"RLJob {namespace}/{name} released its finalizer and left behind {leftover.what} ({leftover.why}); "
            f"remove by hand: {leftover.remedy}")


def _event(kube: Kube, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
    """An Event about `obj`, best effort (a namespace being deleted refuses new ones)."""
    try:
        kube.event(obj, type_, reason, message, "Cleanup")
    except KubeError as exc:
        log.info("%s/%s: Event %s not posted (%s): %s", obj["metadata"]["namespace"], obj["metadata"]["name"],
                 reason, exc, message)


def _scale_to_zero(kube: Kube, namespace: str, name: str) -> None:
    """Stop the producers first (the learner checkpoints on SIGTERM); a workload already gone is fine."""
    for role, kind in WORKLOADS.items():
        scale = kube.get_scale(namespace, child_name(name, role), kind)
        if scale is not None and scale["spec"].get("replicas"):
            try:
                kube.set_scale(namespace, child_name(name, role), 0, kind)
            except KubeError as exc:
                if exc.status != 404:
                    raise


def _clean_kafka(kube: Kube, obj: dict[str, Any], spec: RLJobSpec, retry: int, *, bus_for: BusFor,
                 kafka_timeout_s: float) -> Leftover | None:
    """Delete the job's idle consumer groups and its topics; raises kopf.TemporaryError while groups have
    members (until CLEANUP_RETRIES), then leaves the busy ones (returned as a Leftover)."""
    m = obj["metadata"]
    prefix = bus_prefix(m["name"], m["namespace"])
    bus = bus_for(spec.bus.bootstrap, kafka_security(kube, m["namespace"], spec.bus))
    admin = bus.connect(KafkaAdminClient, client_id="scalerl-operator-admin",
                        request_timeout_ms=int(kafka_timeout_s * 1000))
    try:
        groups = [g for g in admin.list_groups() if g["group_id"].startswith(f"{prefix}.")]
        busy = [g["group_id"] for g in groups if g.get("group_state") not in ("Empty", "Dead", None)]
        if busy and retry < CLEANUP_RETRIES:
            raise kopf.TemporaryError(f"consumer groups still have members: {', '.join(busy)}",
                                      delay=CLEANUP_DELAY_S)
        idle = [g["group_id"] for g in groups if g["group_id"] not in busy]
        failed = [gid for gid, err in (admin.delete_groups(idle) if idle else [])
                  if err is not None and getattr(err, "errno", 0) != 0]
    finally:
        admin.close()
    doomed = bus.list_topics(prefix=f"{prefix}.")
    bus.delete_topics(doomed)
    _event(kube, obj, "Normal", "CleanedUp", f"deleted topics {', '.join(doomed) or '(none)'} and "
           f"{len(groups) - len(busy) - len(failed)} consumer group(s)")
    if busy or failed:
        return kafka_leftover(prefix, spec.bus.bootstrap, "still had members after the wait" if busy else
                              "the brokers refused to delete them", groups=busy + failed)
    return None


def delete_store_objects(kube: Kube, namespace: str, store: StoreSpec) -> int:
    """Delete every object under `store.uri`, with the key pair of `store.credentialsSecret` (else the
    operator's own S3_ACCESS_KEY / S3_SECRET_KEY) at `store.endpoint` (else S3_ENDPOINT). Returns the count."""
    from scalerl.store.s3 import S3Store

    access, secret = os.environ.get("S3_ACCESS_KEY", ""), os.environ.get("S3_SECRET_KEY", "")
    if (ref := store.credentials_secret) is not None:
        keys = secret_values(kube, namespace, ref.name, {"access": ref.access_key_key, "secret": ref.secret_key_key},
                             "store.credentialsSecret")
        access, secret = keys["access"], keys["secret"]
    endpoint = store.endpoint or os.environ.get("S3_ENDPOINT", "")
    if not (endpoint and access and secret):
        raise CannotClean("store.retention: delete needs store.endpoint and a key pair (credentialsSecret)")
    bucket, _, prefix = store.uri.removeprefix("s3://").partition("/")
    s3 = S3Store(endpoint, access, secret, bucket, prefix, create_bucket=False)
    keys_ = s3.list("")
    for key in keys_:
        s3.delete(key)
    return len(keys_)


def _attempt(step: Callable[[], Leftover | None], retry: int,
             on_leave: Callable[[Exception], Leftover]) -> Leftover | None:
    """Run one step: its own leftover, or on an error the decision's (raises kopf.TemporaryError to retry)."""
    try:
        return step()
    except kopf.TemporaryError:
        raise
    except Exception as exc:
        if decide(exc, retry=retry) is Decision.RETRY:
            raise kopf.TemporaryError(f"cleanup failed, retrying: {exc}", delay=CLEANUP_DELAY_S) from exc
        return on_leave(exc)


def finalize(kube: Kube, obj: dict[str, Any], retry: int, *, bus_for: BusFor,
             kafka_timeout_s: float) -> list[Leftover]:
    """The finalizer's work for `obj` on attempt `retry`; returns what was left behind (reported here: a Warning
    Event and a log line). Raises kopf.TemporaryError while a step should be retried."""
    m = obj["metadata"]
    name, ns = m["name"], m["namespace"]
    try:
        spec = parse_served_spec(obj.get("spec") or {})
    except FieldsFromNewerCRD as exc:  # what this build knows of it names the bus and the store
        spec = exc.known
    except SpecError:
        return []  # never realised: nothing outside Kubernetes to clean
    try:
        _scale_to_zero(kube, ns, name)
    except Exception as exc:  # not a leftover once given up: garbage collection removes the workloads
        if decide(exc, retry=retry) is Decision.RETRY:
            raise kopf.TemporaryError(f"cleanup failed, retrying: {exc}", delay=CLEANUP_DELAY_S) from exc
        log.warning("%s/%s: the workloads were not scaled to zero before their deletion: %s", ns, name, exc)

    def kafka() -> Leftover | None:
        return _clean_kafka(kube, obj, spec, retry, bus_for=bus_for, kafka_timeout_s=kafka_timeout_s)

    def store() -> Leftover | None:
        deleted = delete_store_objects(kube, ns, spec.store)
        _event(kube, obj, "Normal", "StoreDeleted", f"deleted {deleted} object(s) under {spec.store.uri} "
               "(store.retention: delete)")
        return None

    endpoint = spec.store.endpoint or os.environ.get("S3_ENDPOINT", "")
    steps = [(kafka, lambda exc: kafka_leftover(bus_prefix(name, ns), spec.bus.bootstrap, str(exc)))]
    if spec.store.retention == "delete":
        steps.append((store, lambda exc: store_leftover(spec.store.uri, endpoint, str(exc))))
    leftovers = [x for step, leave in steps if (x := _attempt(step, retry, leave)) is not None]
    for leftover in leftovers:  # one Event each: an Event's message holds 1024 characters
        message = report(ns, name, leftover)
        log.warning("%s", message)
        _event(kube, obj, "Warning", "CleanupIncomplete", message)
    return leftovers
