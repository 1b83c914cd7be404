"""OpenTelemetry traces for operators who run a collector (docs/deploy.md, "Traces"), and what goes with a record's
engine call: its request id (``x-request-id``) and, when tracing, the W3C ``traceparent`` of the call's span. Off,
the SDK is never imported and ``span`` hands back one shared no-op context."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

from .errors import ConfigError

__all__ = ["configure", "span", "span_since", "note", "engine_calls", "call_headers"]

_tracer: Any = None  # the SDK's Tracer, once ``configure`` found an endpoint
_propagate: Any = None  # opentelemetry.propagate: W3C trace context in and out of headers
_OFF = contextlib.nullcontext()
_request_id: ContextVar[str | None] = ContextVar("openrelay_record_request_id", default=None)


def configure(service_name: str = "openrelay") -> bool:
    """Export spans over OTLP (HTTP, protobuf) when an endpoint is set; whether it is."""
    global _tracer, _propagate
    if not (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")):
        return False
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        if os.environ.get(name, "http/protobuf") != "http/protobuf":
            raise ConfigError(f"{name}={os.environ[name]!r}: OpenRelay exports traces as http/protobuf only")
    from opentelemetry import propagate, trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({SERVICE_NAME: os.environ.get("OTEL_SERVICE_NAME") or service_name})
    provider = TracerProvider(resource=resource)  # flushes its spans when the process exits
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)  # FastAPI makes each request's span from it (its native telemetry)
    _tracer, _propagate = provider.get_tracer("openrelay"), propagate
    return True


def span(name: str, attributes: Mapping[str, Any] | None = None) -> contextlib.AbstractContextManager[Any]:
    """A span around a block, a child of the current one; the span, or None when tracing is off."""
    if _tracer is None:
        return _OFF
    return _tracer.start_as_current_span(name, attributes=attributes)


def span_since(name: str, start_ns: int, attributes: Mapping[str, Any]) -> None:
    """A span of something that began at ``start_ns`` (``clock.now_ns()``) and ends now: for work only worth a
    span once its outcome is known (a claim that found a batch)."""
    if _tracer is not None:
        _tracer.start_span(name, start_time=start_ns, attributes=attributes).end()


def note(key: str, value: Any) -> None:
    """An attribute on the current span, learnt midway (a create's batch id)."""
    if _tracer is not None:
        from opentelemetry import trace

        trace.get_current_span().set_attribute(key, value)


def engine_calls(request_id: str, batch_id: str, line: int) -> contextlib.AbstractContextManager[Any]:
    """Around a record's engine calls: each carries ``request_id`` (``call_headers``; it stays the lane task's until
    its next record sets its own), and when tracing their spans are children of the record's."""
    _request_id.set(request_id)
    if _tracer is None:
        return _OFF
    attributes = {"openrelay.request_id": request_id, "openrelay.batch_id": batch_id, "openrelay.line": line}
    return _tracer.start_as_current_span("batch record", attributes=attributes)


def call_headers() -> dict[str, str]:
    """The headers of an engine call made now: the record's request id, and the trace context when tracing."""
    headers: dict[str, str] = {}
    if (request_id := _request_id.get()) is not None:
        headers["x-request-id"] = request_id
    if _tracer is not None:
        _propagate.inject(headers)
    return headers
