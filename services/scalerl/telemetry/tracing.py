"""OpenTelemetry tracing: one provider per process, W3C `traceparent` carried in Kafka headers and in
gRPC metadata, so one prompt's spans (curriculum -> generator -> verifier -> learner) share a trace.

- `setup_tracing(service_name, otlp_endpoint, exporter)` installs the provider: spans go to an OTLP
  collector (gRPC exporter) only when an endpoint is configured, to `exporter` when one is given (tests
  pass an InMemorySpanExporter), else nowhere. Spans are created in every case, with the SDK's ids, and
  before any `setup_tracing` too (a provider without exporters): every record carries a valid
  `traceparent` whether or not traces are exported, so a backend added later (or a log line quoting the
  header) can still join a prompt's hops.
- `inject_headers` / `extract_context` / `span_from_headers`: the Kafka side (headers dict[str, str]).
- `ClientTracingInterceptor` / `ServerTracingInterceptor`: the gRPC side; the client starts a CLIENT
  span per call and sends its context in the call metadata, the server continues it in a SERVER span
  that is current while the handler runs (so a handler that publishes to Kafka carries it on).

Choices:
1. Only the W3C trace-context propagator (`traceparent`, `tracestate`), whatever OTEL_PROPAGATORS says:
   every role must speak the same format.
2. scalerl code takes its tracer from `tracer()`, i.e. from the provider of the last `setup_tracing`
   call. OpenTelemetry lets the global provider be set once per process; we set it on the first call
   (for third-party instrumentation) and keep later calls (tests) working through `tracer()`.
3. Only unary-unary gRPC methods are traced (all of ours); the health and reflection services
   (`/grpc.*`) are not, to keep probes out of the traces.
4. Trace and span ids come from the operating system's random source (`_OsRandomIds`), not from the SDK's
   default generator, which draws from Python's global `random`: every role seeds that with the job's seed
   (`parts.seed_everything`), so two runs with the same seed (0 by default) drew the same ids, and a tracing
   backend merged their traces (a Pod's prompt trace rooted in another run's curriculum span, 2026-12-06).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NamedTuple

import grpc
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRACEPARENT = "traceparent"
_PROPAGATOR = TraceContextTextMapPropagator()
_provider: TracerProvider | None = None
_unexported: TracerProvider | None = None  # ids without export, until setup_tracing installs a provider


class _OsRandomIds(IdGenerator):
    """Trace and span ids from os.urandom (random.SystemRandom), whatever the global `random` was seeded with."""

    def __init__(self) -> None:
        self._random = random.SystemRandom()

    def _nonzero(self, bits: int) -> int:
        value = 0
        while value == 0:  # 0 is the invalid id
            value = self._random.getrandbits(bits)
        return value

    def generate_span_id(self) -> int:
        return self._nonzero(64)

    def generate_trace_id(self) -> int:
        return self._nonzero(128)

    def is_trace_id_random(self) -> bool:
        return True


def _new_provider(service_name: str) -> TracerProvider:
    return TracerProvider(resource=Resource.create({"service.name": service_name}), id_generator=_OsRandomIds())


def setup_tracing(service_name: str, otlp_endpoint: str | None = None,
                  exporter: SpanExporter | None = None) -> TracerProvider:
    """Install this process's tracer provider (replacing one set up before, which is shut down).

    otlp_endpoint: "http://collector:4317" (plain) or "https://..." (TLS) for the OTLP gRPC exporter
    (batched); None or "" = no OTLP export. exporter: an extra exporter fed span by span.
    """
    global _provider
    if not service_name:
        raise ValueError("setup_tracing: service_name is empty")
    provider = _new_provider(service_name)
    if otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint)))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    old, _provider = _provider, provider
    if old is not None:
        old.shutdown()
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)
    return provider


def shutdown_tracing() -> None:
    """Flush and stop the provider installed by `setup_tracing` (exports what is still batched)."""
    global _provider
    if _provider is not None:
        _provider.shutdown()
        _provider = None


def tracer(name: str = "scalerl") -> trace.Tracer:
    """A tracer of the provider of `setup_tracing`; before one, of the global provider when another
    library installed one, else of an SDK provider without exporters (real span ids, nothing exported)."""
    global _unexported
    provider = _provider if _provider is not None else trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        if _unexported is None:
            _unexported = _new_provider("scalerl")
        provider = _unexported
    return provider.get_tracer(name)


# ---- Kafka headers -------------------------------------------------------------------------------

def inject_headers(headers: Mapping[str, str] | None = None, context: Context | None = None) -> dict[str, str]:
    """A copy of `headers` with the `traceparent` (and `tracestate`) of `context` (default: the current
    one) added; unchanged when there is no valid span in it."""
    carrier = dict(headers or {})
    _PROPAGATOR.inject(carrier, context=context)
    return carrier


def extract_context(headers: Mapping[str, str]) -> Context:
    """The trace context carried by `headers` (an empty context when they carry none or a bad one)."""
    return _PROPAGATOR.extract(carrier=dict(headers))


@contextmanager
def span_from_headers(name: str, headers: Mapping[str, str], *, kind: SpanKind = SpanKind.CONSUMER,
                      attributes: Mapping[str, Any] | None = None) -> Iterator[Span]:
    """A current span continuing the trace of a consumed record."""
    with tracer().start_as_current_span(name, context=extract_context(headers), kind=kind,
                                        attributes=dict(attributes or {})) as span:
        yield span


# ---- gRPC ----------------------------------------------------------------------------------------

class _CallDetails(NamedTuple):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: bool | None
    compression: Any


class _ClientCallDetails(_CallDetails, grpc.ClientCallDetails):  # type: ignore[misc]
    pass


def _rpc_attributes(method: str) -> dict[str, str]:
    service, _, name = method.lstrip("/").partition("/")
    return {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}


class ClientTracingInterceptor(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Starts a CLIENT span per unary call and sends its `traceparent` in the call metadata."""

    def intercept_unary_unary(self, continuation: Callable[..., Any], client_call_details: Any,
                              request: Any) -> Any:
        method = client_call_details.method
        with tracer().start_as_current_span(method.lstrip("/"), kind=SpanKind.CLIENT,
                                            attributes=_rpc_attributes(method)) as span:
            carrier: dict[str, str] = {}
            _PROPAGATOR.inject(carrier)
            metadata = [*(client_call_details.metadata or ()), *carrier.items()]
            details = _ClientCallDetails(method, client_call_details.timeout, metadata,
                                         client_call_details.credentials,
                                         getattr(client_call_details, "wait_for_ready", None),
                                         getattr(client_call_details, "compression", None))
            outcome = continuation(details, request)
            code = outcome.code()
            span.set_attribute("rpc.grpc.status_code", int(code.value[0]))
            if code != grpc.StatusCode.OK:
                span.set_status(Status(StatusCode.ERROR, f"{code.name}: {outcome.details()}"))
            return outcome


class ServerTracingInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
    """Continues the caller's trace (from the `traceparent` metadata) in a SERVER span around each
    unary handler."""

    def intercept_service(self, continuation: Callable[..., Any], handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or handler.unary_unary is None or method.startswith("/grpc."):
            return handler
        inner = handler.unary_unary
        carrier = {k: v for k, v in handler_call_details.invocation_metadata or () if isinstance(v, str)}

        def traced(request: Any, context: grpc.ServicerContext) -> Any:
            with tracer().start_as_current_span(method.lstrip("/"), context=extract_context(carrier),
                                                kind=SpanKind.SERVER,
                                                attributes=_rpc_attributes(method)) as span:
                try:
                    return inner(request, context)
                finally:
                    code = context.code()
                    if code is not None and code != grpc.StatusCode.OK:
                        span.set_attribute("rpc.grpc.status_code", int(code.value[0]))
                        span.set_status(Status(StatusCode.ERROR, f"{code.name}: {context.details()}"))

        return grpc.unary_unary_rpc_method_handler(traced, request_deserializer=handler.request_deserializer,
                                                   response_serializer=handler.response_serializer)
