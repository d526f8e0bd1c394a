"""The trace of one prompt across the roles: curriculum → generator → verifier → learner.

Each role continues the trace carried in the `traceparent` header of the record it consumed, in a span
of its own, and hands that span's context on in the headers of the record it produces. Without the
OpenTelemetry SDK installed (a plain `pip install scalerl`), headers pass through unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager


@contextmanager
def hop(name: str, headers: Mapping[str, str] | None = None, *, root: bool = False) -> Iterator[dict[str, str]]:
    """A span `name` continuing the trace of `headers` (a new trace when `root` or none is carried);
    yields the headers to publish with, carrying this span's context."""
    try:
        from opentelemetry.trace import SpanKind

        from scalerl.telemetry.tracing import inject_headers, span_from_headers
    except ImportError:
        yield dict(headers or {})
        return
    carried = {} if root else dict(headers or {})
    kind = SpanKind.PRODUCER if root else SpanKind.CONSUMER
    with span_from_headers(name, carried, kind=kind):
        yield inject_headers({k: v for k, v in (headers or {}).items() if k not in ("traceparent", "tracestate")})
