"""Prometheus metrics per role (names with units, values read back through the exposition parser) and
W3C trace-context headers (hand-written traceparent in, the same ids out)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from scalerl.telemetry.metrics import RoleMetrics
from scalerl.telemetry.tracing import extract_context, inject_headers, setup_tracing, span_from_headers, tracer

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_role_metrics_names_and_values() -> None:
    met = RoleMetrics("learner")
    met.tokens.inc(1200)
    met.tokens.inc(34)
    met.groups_in.inc(3)
    met.groups_out.inc()
    met.queue_lag.labels(topic="job.scored").set(17)
    met.staleness.set(2)
    met.policy_version.set(9)
    for s in (0.3, 1.7, 45.0):
        met.step_seconds.observe(s)
    met.ready.set(1)
    got = _samples(met.render().decode())
    assert got[("scalerl_learner_tokens_total", ())] == 1234.0
    assert got[("scalerl_learner_groups_in_total", ())] == 3.0
    assert got[("scalerl_learner_groups_out_total", ())] == 1.0
    assert got[("scalerl_learner_queue_lag_messages", (("topic", "job.scored"),))] == 17.0
    assert got[("scalerl_learner_policy_staleness_versions", ())] == 2.0
    assert got[("scalerl_learner_policy_version", ())] == 9.0
    assert got[("scalerl_learner_ready", ())] == 1.0
    # histogram: 0.3 + 1.7 + 45 = 47 s over 3 steps; le=0.5 holds 1, le=2.5 holds 2, le=60 holds all 3
    assert got[("scalerl_learner_step_seconds_count", ())] == 3.0
    assert got[("scalerl_learner_step_seconds_sum", ())] == pytest.approx(47.0)
    assert got[("scalerl_learner_step_seconds_bucket", (("le", "0.5"),))] == 1.0
    assert got[("scalerl_learner_step_seconds_bucket", (("le", "2.5"),))] == 2.0
    assert got[("scalerl_learner_step_seconds_bucket", (("le", "30.0"),))] == 2.0
    assert got[("scalerl_learner_step_seconds_bucket", (("le", "60.0"),))] == 3.0


def test_roles_have_separate_registries() -> None:
    a, b = RoleMetrics("generator"), RoleMetrics("generator")  # would clash on one global registry
    a.tokens.inc(5)
    assert _samples(b.render().decode())[("scalerl_generator_tokens_total", ())] == 0.0
    with pytest.raises(ValueError, match="role must be one of generator, verifier, learner, curriculum, got 'gen'"):
        RoleMetrics("gen")


def test_headers_carry_the_trace_context() -> None:
    exporter = InMemorySpanExporter()
    setup_tracing("unit-test", None, exporter=exporter)
    ctx = extract_context({"traceparent": TRACEPARENT, "key": "ignored"})
    parent = trace.get_current_span(ctx).get_span_context()
    assert (f"{parent.trace_id:032x}", f"{parent.span_id:016x}") == (TRACE_ID, PARENT_ID)
    assert inject_headers({"schema": "1"}, ctx) == {"schema": "1", "traceparent": TRACEPARENT}
    with span_from_headers("consume", {"traceparent": TRACEPARENT}) as span:
        out = inject_headers({})
        sc = span.get_span_context()
    assert out["traceparent"] == f"00-{TRACE_ID}-{sc.span_id:016x}-01"  # same trace, this span as parent
    (finished,) = exporter.get_finished_spans()
    assert finished.name == "consume" and finished.parent is not None
    assert f"{finished.parent.span_id:016x}" == PARENT_ID
    assert finished.resource.attributes["service.name"] == "unit-test"
    # no (or a malformed) traceparent: a new root trace, nothing injected without a span
    assert inject_headers({}, extract_context({"traceparent": "garbage"})) == {}
    with tracer().start_as_current_span("root") as root:
        assert inject_headers()["traceparent"].split("-")[1] == f"{root.get_span_context().trace_id:032x}"


def test_setup_tracing_rejects_an_empty_name() -> None:
    with pytest.raises(ValueError, match="service_name is empty"):
        setup_tracing("", None)


def _fresh_process_json(code: str) -> Any:
    """The JSON `code` prints last, run in a new interpreter without an OTLP endpoint (no provider yet)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                         check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_records_carry_a_traceparent_without_any_tracing_setup() -> None:
    """No setup_tracing, no exporter (a role without OTEL_EXPORTER_OTLP_ENDPOINT): every hop still writes a
    W3C traceparent with the SDK's random ids, and the next hop continues that trace. In a fresh process:
    this one has a provider from the tests above."""
    code = (
        "import json\n"
        "from scalerl.telemetry.hops import hop\n"
        "with hop('curriculum.issue', {'policy_version': '3'}, root=True) as a:\n"
        "    pass\n"
        "with hop('generator.generate', a) as b:\n"
        "    pass\n"
        "print(json.dumps([a, b]))\n"
    )
    first, second = _fresh_process_json(code)
    assert first["policy_version"] == "3"
    pattern = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-0[13]")  # sampled (+ random trace id, W3C level 2)
    a, b = pattern.fullmatch(first["traceparent"]), pattern.fullmatch(second["traceparent"])
    assert a and b, (first, second)
    assert int(a[1], 16) != 0 and int(a[2], 16) != 0
    assert b[1] == a[1] and b[2] != a[2]  # same trace, the generator's own span as the parent of the next hop


def test_ids_do_not_follow_the_jobs_seed() -> None:
    """Every role seeds Python's global `random` with the job's seed; the SDK's default ids came from it, so two
    runs with the same seed (two processes here, each seeded 0) started the same traces with the same span ids,
    and Jaeger merged them (tests/real_node/test_real_node_observability.py saw another run's curriculum span
    as the root of a Pod's prompt trace). With and without an exporter set up."""
    code = (
        "import json, random\n"
        "from scalerl.telemetry.hops import hop\n"
        "from scalerl.telemetry.tracing import setup_tracing\n"
        "random.seed(0)\n"
        "with hop('curriculum.issue', {}, root=True) as a:\n"
        "    pass\n"
        "setup_tracing('scalerl-curriculum')\n"
        "random.seed(0)\n"
        "with hop('curriculum.issue', {}, root=True) as b:\n"
        "    pass\n"
        "print(json.dumps([a['traceparent'], b['traceparent']]))\n"
    )
    runs = [_fresh_process_json(code) for _ in range(2)]
    ids = [tp.split("-")[1:3] for run in runs for tp in run]
    assert len({trace_id for trace_id, _ in ids}) == 4 and len({span_id for _, span_id in ids}) == 4, ids
