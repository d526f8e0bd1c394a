"""The finalizer never holds a namespace being deleted (issue #26, real node): `kubectl delete namespace` deletes
the RLJob's Secrets before its finalizer runs, so a clean-up step whose credential Secret is gone is left behind
at once, reported (a Warning Event and a log line naming the topics `<ns>.<name>.*` and the store URI, with the
commands that remove them) and the finalizer released; a step that can still succeed (brokers down, the Secret
present) is retried. Driven through `Runtime.cleanup`, what kopf's on_delete calls, with fakes for the API
server and the brokers."""

from __future__ import annotations

import base64
import logging
from typing import Any

import kopf
import pytest

from scalerl_operator.cluster.kube import KubeError
from scalerl_operator.cluster.secrets import SecretError, SecretNotFound
from scalerl_operator.control.cleanup import (
    CLEANUP_RETRIES,
    CannotClean,
    Decision,
    decide,
    kafka_leftover,
    report,
    store_leftover,
)
from scalerl_operator.control.runtime import OperatorConfig, Runtime

SASL = {"protocol": "SASL_PLAINTEXT", "saslMechanism": "PLAIN", "secretRef": {"name": "kafka-auth"}}
STORE = {"uri": "s3://bkt/runs/j", "endpoint": "http://minio:9000", "retention": "delete",
         "credentialsSecret": {"name": "s3-keys"}}
KAFKA_SECRET = {"data": {k: base64.b64encode(v.encode()).decode() for k, v in
                         (("username", "scalerl"), ("password", "pw"))}}
TERMINATING = KubeError(403, "Forbidden", "unable to create new content in namespace n because it is being "
                        "terminated", "POST /api/v1/namespaces/n/events")


class FakeKube:
    """The API server as the finalizer sees it: Secrets (by name), no workloads, Events recorded or refused."""

    def __init__(self, secrets: dict[str, dict[str, Any]], *, terminating: bool = False) -> None:
        self.secrets, self.terminating, self.events = secrets, terminating, []  # type: ignore[var-annotated]

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        assert kind == "Secret"
        return self.secrets.get(name)

    def get_scale(self, namespace: str, name: str, kind: str = "Deployment") -> dict[str, Any] | None:
        return None  # the namespace controller deleted the workloads already

    def event(self, owner: dict[str, Any], type_: str, reason: str, message: str, action: str) -> None:
        if self.terminating:
            raise TERMINATING
        self.events.append((type_, reason, message))


class FakeAdmin:
    def list_groups(self) -> list[dict[str, Any]]:
        return [{"group_id": "n.j.verifiers", "group_state": "Empty"}]

    def delete_groups(self, ids: list[str]) -> list[tuple[str, Any]]:
        return [(g, None) for g in ids]

    def close(self) -> None:
        pass


class FakeBus:
    def __init__(self, *, down: bool = False) -> None:
        self.down, self.topics = down, ["n.j.prompts", "n.j.rollouts", "other.x.prompts"]

    def connect(self, factory: Any, **_: Any) -> FakeAdmin:
        if self.down:
            raise ConnectionError("n.j: TCP connect to k:9092 refused")
        return FakeAdmin()

    def list_topics(self, prefix: str = "") -> list[str]:
        return [t for t in self.topics if t.startswith(prefix)]

    def delete_topics(self, topics: list[str]) -> None:
        self.topics = [t for t in self.topics if t not in topics]


def rljob(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "j", "namespace": "n", "uid": "u", "generation": 1},
            "spec": {"bus": {"bootstrap": "k:9092", **spec.pop("bus", {})},
                     "store": spec.pop("store", {"uri": "s3://bkt/runs/j"}), **spec}}


def runtime(kube: FakeKube, bus: FakeBus, monkeypatch: pytest.MonkeyPatch) -> Runtime:
    rt = Runtime(kube, OperatorConfig())  # type: ignore[arg-type]
    monkeypatch.setattr(rt, "bus", lambda bootstrap, security=None: bus)
    return rt


def test_secrets_deleted_with_the_namespace_leave_a_report_and_release_the_finalizer(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    kube, bus = FakeKube({}), FakeBus()
    with caplog.at_level(logging.WARNING, logger="scalerl_operator"):
        runtime(kube, bus, monkeypatch).cleanup(rljob(bus={"security": SASL}, store=STORE), retry=0)  # no raise
    assert bus.topics == ["n.j.prompts", "n.j.rollouts", "other.x.prompts"]  # nothing reachable without the Secret
    assert [e[:2] for e in kube.events] == [("Warning", "CleanupIncomplete")] * 2  # one per leftover
    kafka, store = (e[2] for e in kube.events)
    assert kafka == ("RLJob n/j released its finalizer and left behind Kafka topics and consumer groups n.j.* on "
                     "k:9092 (spec.bus.security.secretRef: Secret n/kafka-auth not found); remove by hand: "
                     "kafka-topics.sh --bootstrap-server k:9092 [--command-config <client.properties>] --delete "
                     "--topic 'n\\.j\\..*'; kafka-consumer-groups.sh --bootstrap-server k:9092 [--command-config "
                     "<client.properties>] --delete --group <each n.j.* group>")
    assert store == ("RLJob n/j released its finalizer and left behind the objects under s3://bkt/runs/j "
                     "(store.credentialsSecret: Secret n/s3-keys not found); remove by hand: aws s3 rm --recursive "
                     "s3://bkt/runs/j/ --endpoint-url http://minio:9000")
    assert kafka in caplog.text and store in caplog.text  # the log says the same


def test_in_a_terminating_namespace_refused_events_do_not_hold_the_finalizer(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # the Kafka Secret still exists, the store's is gone, and the API server refuses new Events (403)
    kube, bus = FakeKube({"kafka-auth": KAFKA_SECRET}, terminating=True), FakeBus()
    with caplog.at_level(logging.WARNING, logger="scalerl_operator"):
        runtime(kube, bus, monkeypatch).cleanup(rljob(bus={"security": SASL}, store=STORE), retry=0)
    assert bus.topics == ["other.x.prompts"]  # the job's topics went; a neighbour's stayed
    assert "left behind the objects under s3://bkt/runs/j" in caplog.text


def test_a_step_that_can_still_succeed_is_retried_then_left_with_a_report(monkeypatch: pytest.MonkeyPatch) -> None:
    kube, bus = FakeKube({"kafka-auth": KAFKA_SECRET}), FakeBus(down=True)
    rt, obj = runtime(kube, bus, monkeypatch), rljob(bus={"security": SASL})
    with pytest.raises(kopf.TemporaryError, match=r"cleanup failed, retrying: n\.j: TCP connect to k:9092 refused"):
        rt.cleanup(obj, retry=0)
    assert kube.events == []
    rt.cleanup(obj, retry=CLEANUP_RETRIES)  # 5 minutes later: released, reported
    assert [e[1] for e in kube.events] == ["CleanupIncomplete"]
    assert "left behind Kafka topics and consumer groups n.j.* on k:9092 (n.j: TCP connect to k:9092 refused)" in \
        kube.events[0][2]


def test_with_everything_there_the_topics_and_groups_are_deleted(monkeypatch: pytest.MonkeyPatch) -> None:
    kube, bus = FakeKube({"kafka-auth": KAFKA_SECRET}), FakeBus()
    runtime(kube, bus, monkeypatch).cleanup(rljob(bus={"security": SASL}), retry=0)
    assert bus.topics == ["other.x.prompts"]
    assert kube.events == [("Normal", "CleanedUp", "deleted topics n.j.prompts, n.j.rollouts and 1 consumer "
                            "group(s)")]


@pytest.mark.parametrize(("exc", "retry", "expected"), [
    (SecretNotFound("spec.bus.security.secretRef: Secret n/kafka-auth not found"), 0, Decision.LEAVE),
    (CannotClean("store.retention: delete needs store.endpoint"), 0, Decision.LEAVE),
    (SecretError("spec.bus.security.secretRef: Secret n/kafka-auth lacks password"), 0, Decision.RETRY),
    (ConnectionError("brokers down"), 0, Decision.RETRY),
    (ConnectionError("brokers down"), CLEANUP_RETRIES - 1, Decision.RETRY),
    (ConnectionError("brokers down"), CLEANUP_RETRIES, Decision.LEAVE),
])
def test_decide(exc: Exception, retry: int, expected: Decision) -> None:
    assert decide(exc, retry=retry) is expected


def test_the_report_names_the_leftover_and_its_command() -> None:
    x = store_leftover("s3://bkt/runs/j", "", "gone")
    assert x.remedy == "aws s3 rm --recursive s3://bkt/runs/j/"  # no endpoint: the client's default
    assert report("n", "j", x) == ("RLJob n/j released its finalizer and left behind the objects under "
                                   "s3://bkt/runs/j (gone); remove by hand: aws s3 rm --recursive s3://bkt/runs/j/")
    busy = kafka_leftover("n.j", "k:9092", "still had members after the wait", groups=["n.j.verifiers"])
    assert (busy.what, busy.remedy) == ("Kafka consumer groups n.j.verifiers on k:9092", "kafka-consumer-groups.sh "
                                        "--bootstrap-server k:9092 [--command-config <client.properties>] --delete "
                                        "--group n.j.verifiers")
