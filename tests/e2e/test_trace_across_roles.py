"""One prompt's spans from all four roles share one trace id (curriculum → generator → verifier →
learner), carried in the bus headers; in-memory span exporter, embedded run on the memory bus."""

from __future__ import annotations

from collections import defaultdict

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the distributed extra provides the OpenTelemetry SDK")

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from scalerl.runtime.embedded import EmbeddedRun
from scalerl.telemetry.tracing import setup_tracing, shutdown_tracing

ROLE_SPANS = {"curriculum.issue", "generator.generate", "verifier.score", "learner.consume"}


@pytest.mark.timeout(300)
def test_one_trace_per_prompt_across_roles(tiny_spec, tmp_path):
    exporter = InMemorySpanExporter()
    setup_tracing("scalerl-test", exporter=exporter)
    try:
        spec = tiny_spec.model_copy(update={"train": tiny_spec.train.model_copy(update={"steps": 2})})
        EmbeddedRun(spec, tmp_path / "run", show_progress=False).run()
    finally:
        spans = list(exporter.get_finished_spans())
        shutdown_tracing()
    by_trace: dict[int, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for s in spans:
        by_trace[s.context.trace_id][s.name].append(s)
    complete = [t for t in by_trace.values() if set(t) >= ROLE_SPANS]
    # every prompt the learner consumed (2 steps x 4 prompts) carries one trace through all four roles
    assert len(complete) >= 2 * spec.train.prompts_per_step
    for t in complete:
        issue, gen, ver, learn = (t[n][0] for n in ("curriculum.issue", "generator.generate", "verifier.score",
                                                    "learner.consume"))
        assert issue.parent is None
        assert gen.parent.span_id == issue.context.span_id
        assert ver.parent.span_id == gen.context.span_id
        assert learn.parent.span_id == ver.context.span_id
