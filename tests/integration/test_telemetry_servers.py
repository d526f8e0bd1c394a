"""Telemetry against real servers: the FastAPI side port served by uvicorn (/healthz, /readyz,
/metrics); spans exported over OTLP to a gRPC collector on loopback; one trace carried from a client
span through gRPC metadata into the verifier's server span, and from there through the headers of a
record on the real Kafka broker into a consumer's span."""

from __future__ import annotations

import json
import os
import socket
import urllib.error
import urllib.request
from concurrent import futures
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client.parser import text_string_to_metric_families

from scalerl.bus.base import TopicNames
from scalerl.messages import Completion, PromptTask, RolloutGroup, ScoredGroup
from scalerl.rpc.client import VerifierClient
from scalerl.rpc.security import RpcSecurity
from scalerl.rpc.server import serve_grpc
from scalerl.tasks.registry import build_task
from scalerl.telemetry.metrics import RoleMetrics
from scalerl.telemetry.sideport import SidePort
from scalerl.telemetry.tracing import inject_headers, setup_tracing, shutdown_tracing, span_from_headers, tracer
from scalerl.verifier.server import VerifierServicer
from scalerl.verifier.verifier import Verifier

LOOPBACK = "127.0.0.1"


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers.get("content-type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("content-type", ""), e.read().decode()


def test_side_port_health_readiness_and_metrics() -> None:
    state: dict[str, Any] = {"ready": False}

    def ready() -> bool:
        if state.get("boom"):
            raise RuntimeError("store unreachable")
        return bool(state["ready"])

    metrics = RoleMetrics("generator")
    port = SidePort(ready, metrics, host=LOOPBACK, port=0)
    bound = port.start()
    try:
        assert bound > 0 and port.url == f"http://{LOOPBACK}:{bound}"
        assert _get(port.url + "/healthz")[0] == 200
        code, _, body = _get(port.url + "/readyz")
        assert (code, json.loads(body)) == (503, {"ready": False, "role": "generator"})
        state["ready"] = True
        code, _, body = _get(port.url + "/readyz")
        assert (code, json.loads(body)) == (200, {"ready": True, "role": "generator"})
        state["boom"] = True
        code, _, body = _get(port.url + "/readyz")
        # the probe answers anyone: the exception's type, not its text
        assert code == 503 and json.loads(body)["reason"] == "RuntimeError" and "store" not in body
        state["boom"] = False

        metrics.tokens.inc(321)
        metrics.queue_lag.labels(topic="job.prompts").set(7)
        metrics.step_seconds.observe(0.2)
        metrics.step_seconds.observe(0.4)
        code, ctype, text = _get(port.url + "/metrics")
        assert code == 200 and ctype.startswith("text/plain")
        for name in ("scalerl_generator_tokens_total", "scalerl_generator_queue_lag_messages",
                     "scalerl_generator_step_seconds_bucket", "scalerl_generator_ready",
                     "scalerl_generator_policy_staleness_versions", "scalerl_generator_groups_in_total"):
            assert name in text
        values = {(s.name, tuple(s.labels.items())): s.value
                  for fam in text_string_to_metric_families(text) for s in fam.samples}
        assert values[("scalerl_generator_tokens_total", ())] == 321.0
        assert values[("scalerl_generator_queue_lag_messages", (("topic", "job.prompts"),))] == 7.0
        assert values[("scalerl_generator_step_seconds_count", ())] == 2.0
        assert values[("scalerl_generator_step_seconds_sum", ())] == pytest.approx(0.6)
        assert values[("scalerl_generator_ready", ())] == 1.0  # set from ready() on each scrape

        other = SidePort(ready, RoleMetrics("learner"), host=LOOPBACK, port=bound)
        with pytest.raises(OSError, match=f"cannot bind {LOOPBACK}:{bound}"):
            other.start()
    finally:
        port.stop()
    with pytest.raises(OSError), socket.create_connection((LOOPBACK, bound), timeout=2):
        pass  # nothing listens any more
    port.stop()  # idempotent


class Collector(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    """An OTLP trace collector: keeps what it is sent."""

    def __init__(self) -> None:
        self.requests: list[Any] = []

    def Export(self, request: Any, context: Any) -> Any:
        self.requests.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()


def test_spans_are_exported_over_otlp_when_an_endpoint_is_set() -> None:
    collector = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    port = server.add_insecure_port(f"{LOOPBACK}:0")
    server.start()
    try:
        setup_tracing("scalerl-otlp-test", f"http://{LOOPBACK}:{port}")
        with tracer().start_as_current_span("learner.step", attributes={"step": 7}) as span:
            trace_id = span.get_span_context().trace_id
        shutdown_tracing()  # flushes the batch
    finally:
        server.stop(grace=1.0)
    spans = [(rs.resource, s) for req in collector.requests for rs in req.resource_spans
             for ss in rs.scope_spans for s in ss.spans]
    assert len(spans) == 1
    resource, exported = spans[0]
    assert exported.name == "learner.step" and exported.trace_id == trace_id.to_bytes(16, "big")
    assert {a.key: a.value.string_value for a in resource.attributes}["service.name"] == "scalerl-otlp-test"
    assert [(a.key, a.value.int_value) for a in exported.attributes] == [("step", 7)]


class PublishingVerifier(Verifier):
    """What the verifier role does with a group: score it, then publish it with the trace headers."""

    def __init__(self, bus: Any, topic: str) -> None:
        super().__init__(build_task("addition", digits=2, train_size=10, eval_size=2))
        self.bus, self.topic = bus, topic

    def score(self, rollout: RolloutGroup) -> ScoredGroup:
        scored = super().score(rollout)
        headers = inject_headers({"policy_version": "0"})  # the traceparent of the current (server) span
        self.bus.publish(self.topic, scored, key=rollout.task.prompt_id, headers=headers)
        self.bus.flush()
        return scored


@pytest.mark.infra
def test_one_trace_through_grpc_and_kafka(infra, unique, poll_until) -> None:
    if not os.environ.get("CI"):
        pytest.importorskip("kafka", reason="kafka-python is not installed")
    from scalerl.bus.kafka import KafkaBus

    exporter = InMemorySpanExporter()
    setup_tracing("scalerl-trace-test", None, exporter=exporter)
    bus = KafkaBus(infra.kafka_bootstrap, client_id="scalerl-it-trace")
    topics = TopicNames(unique)
    bus.ensure_topics([topics.scored])
    rollout = RolloutGroup(PromptTask("p-9", 0, "12+34=", "46", 1, "addition"), [1, 2],
                           [Completion([5, 6], [-0.5, -0.25], [0, 0], [True, True], "stop", "<think>t</think>46")])
    server, port = serve_grpc(0, VerifierServicer(PublishingVerifier(bus, topics.scored)), host=LOOPBACK,
                              security=RpcSecurity.development())
    try:
        with tracer().start_as_current_span("curriculum.issue") as root, \
                VerifierClient(f"{LOOPBACK}:{port}", security=RpcSecurity.development()) as client:
            assert client.score(rollout).rewards == [1.0]
        consumer = bus.consumer([topics.scored], group=f"{unique}-learner")
        try:
            (rec,) = poll_until(consumer, 1)
        finally:
            consumer.close()
        assert rec.value.rollout == rollout and rec.headers["policy_version"] == "0"
        with span_from_headers("learner.consume", rec.headers):
            pass
    finally:
        server.stop(grace_s=1.0)
        bus.delete_topics(bus.list_topics(prefix=f"{unique}."))
        bus.close()

    finished = exporter.get_finished_spans()
    (client_span,) = [s for s in finished if s.kind == SpanKind.CLIENT]
    (server_span,) = [s for s in finished if s.kind == SpanKind.SERVER]
    (consume,) = [s for s in finished if s.name == "learner.consume"]
    assert client_span.name == server_span.name == "scalerl.v1.Verifier/Score"
    trace_id = root.get_span_context().trace_id
    assert {s.context.trace_id for s in (client_span, server_span, consume)} == {trace_id}
    # the chain of parents: root -> client call -> server handler -> Kafka consumer
    assert client_span.parent.span_id == root.get_span_context().span_id
    assert server_span.parent.span_id == client_span.context.span_id and server_span.parent.is_remote
    assert consume.parent.span_id == server_span.context.span_id and consume.parent.is_remote
    assert server_span.attributes["rpc.service"] == "scalerl.v1.Verifier"
    assert server_span.attributes["rpc.method"] == "Score"
