"""Brokers that advertise loopback (issue #26: a test Kafka with advertised.listeners on 127.0.0.1): every
pod connects to itself after bootstrapping. The operator reads the advertised addresses from the bootstrap's
metadata (KafkaBus.advertised_brokers, the job's shared client) and says so: condition BusReachable=False,
reason BrokersAdvertiseLoopback, naming host:port and advertised.listeners, and one Warning Event."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from scalerl.bus.security import KafkaSecurity
from scalerl_operator.api import conditions as c
from scalerl_operator.api.spec import parse_spec
from scalerl_operator.cluster.kafka_access import is_loopback, loopback_problem
from scalerl_operator.control.jobstatus import bus_reachable_patch
from scalerl_operator.control.runtime import OperatorConfig, Runtime

NOW = datetime(2027, 1, 15, 8, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(("host", "loop"), [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("LOCALHOST.", True), ("kafka.localhost", True), ("10.0.0.7", False), ("kafka-0.kafka.ns.svc", False),
    ("128.0.0.1", False), ("::2", False)])
def test_is_loopback(host: str, loop: bool) -> None:
    assert is_loopback(host) is loop


def test_loopback_brokers_behind_a_reachable_bootstrap_are_a_problem() -> None:
    why = loopback_problem("kafka.ns:9092", [("127.0.0.1", 9092), ("10.0.0.8", 9092)])
    assert why is not None and "spec.bus.bootstrap kafka.ns:9092" in why and "127.0.0.1:9092 (loopback)" in why
    assert "10.0.0.8" not in why and "advertised.listeners" in why
    assert "[::1]:9093" in str(loopback_problem("kafka:9092", [("::1", 9093)]))
    assert loopback_problem("kafka.ns:9092", [("kafka-0.kafka.ns.svc", 9092)]) is None
    # bootstrapping through loopback (a port-forward, a local test): loopback is meant
    assert loopback_problem("127.0.0.1:9092", [("127.0.0.1", 9092)]) is None
    assert loopback_problem("localhost:9092,kafka:9092", [("127.0.0.1", 9092)]) is None


def test_the_condition_flips_and_warns_once() -> None:
    obj: dict[str, Any] = {"metadata": {"name": "j", "namespace": "n", "generation": 2}, "status": {}}
    why = loopback_problem("kafka:9092", [("127.0.0.1", 9092)])
    patch, warn = bus_reachable_patch(obj, why, NOW)
    assert patch is not None and warn
    got = c.get_condition(patch["conditions"], c.BUS_REACHABLE)
    assert got is not None and (got["status"], got["reason"], got["message"]) == (
        "False", "BrokersAdvertiseLoopback", why)
    obj["status"] = patch
    assert bus_reachable_patch(obj, why, NOW) == (None, False)  # nothing new: no write, no second Event
    fixed, warn = bus_reachable_patch(obj, None, NOW)
    assert fixed is not None and not warn and c.is_true(fixed["conditions"], c.BUS_REACHABLE)


class FakeBus:
    def __init__(self, advertised: list[tuple[str, int]]) -> None:
        self.advertised = advertised

    def advertised_brokers(self) -> list[tuple[str, int]]:
        return self.advertised


class FakeKube:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []
        self.patches: list[dict[str, Any]] = []

    def event(self, owner: dict[str, Any], type_: str, reason: str, message: str, action: str) -> None:
        self.events.append((type_, reason, message))

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        self.patches.append(status)
        return {"metadata": {"name": name, "namespace": namespace, "generation": 1}, "status": status}


def test_the_operator_sets_the_condition_and_posts_an_event() -> None:
    spec = parse_spec({"bus": {"bootstrap": "kafka.ns:9092"}, "store": {"uri": "s3://bkt/j"}})
    kube = FakeKube()
    runtime = Runtime(kube, OperatorConfig())  # type: ignore[arg-type]
    runtime.buses[("kafka.ns:9092", KafkaSecurity())] = FakeBus([("127.0.0.1", 9092)])  # type: ignore[assignment]
    obj = runtime._check_bus({"metadata": {"name": "j", "namespace": "ns", "generation": 1}, "status": {}}, spec, None)
    assert [e[:2] for e in kube.events] == [("Warning", "BrokersAdvertiseLoopback")]
    assert "127.0.0.1:9092" in kube.events[0][2]
    assert c.get_condition(obj["status"]["conditions"], c.BUS_REACHABLE)["status"] == "False"  # type: ignore[index]
    assert runtime._check_bus(obj, spec, None) is obj and len(kube.events) == 1 and len(kube.patches) == 1
