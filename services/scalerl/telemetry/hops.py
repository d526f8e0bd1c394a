"""The trace of one prompt across the roles: curriculum → generator → verifier → learner.

Each role continues the trace carried in the `traceparent` header of the record it consumed, in a span
of its own, and hands that span's context on in the headers of the record it produces. Without the
OpenTelemetry SDK installed (a plain `pip install scalerl`), headers pass through unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any


@functools.cache
def _tracing() -> Any:
    """scalerl.telemetry.tracing, or None without the SDK; looked up once (a failed import is not cached by
    Python, and `hop` runs for every record)."""
    try:
        from scalerl.telemetry import tracing
    except ImportError:
        return None
    return tracing


@contextmanager
def hop(name: str, headers: Mapping[str, str] | None = None, *, root: bool = False) -> Iterator[dict[str, str]]:
    """A span `name` continuing the trace of `headers` (a new trace when `root` or none is carried);
    yields the headers to publish with, carrying this span's context."""
    tracing = _tracing()
    if tracing is None:
        yield dict(headers or {})
        return
    carried = {} if root else dict(headers or {})
    kind = tracing.SpanKind.PRODUCER if root else tracing.SpanKind.CONSUMER
    with tracing.span_from_headers(name, carried, kind=kind):
        passed = {k: v for k, v in (headers or {}).items() if k not in ("traceparent", "tracestate")}
        yield tracing.inject_headers(passed)
