"""Optional OpenTelemetry traces (docs/adr/0010): off unless ``HOTSEAT_OTLP_ENDPOINT`` is set.

Services hold a :class:`Tracing` from their lifespan and open spans through it. Off (the
default), it is :data:`NO_TRACING`: every span is one shared no-op object, Hotseat
imports nothing of OpenTelemetry (it need not even be installed), and no header is added
to any message. On, spans go to the endpoint over OTLP/HTTP (protobuf) from a background thread,
batched; a collector that is down costs that thread's retries, never a request.

Across processes the context travels as W3C ``traceparent`` / ``tracestate`` headers: on
the NATS acquire request from router to controller. Within a process it is the current
span (``contextvars``), so a task created inside a span (a swap started by an acquire)
continues that span's trace.

Span and attribute names are defined here, once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from enum import Enum
from types import TracebackType
from typing import Any, Protocol, Self

REQUEST_SPAN = "hotseat.request"
"""The router's span of one client request (kind server)."""
ACQUIRE_SPAN = "hotseat.pool.acquire"
"""Asking the pool for a lease: the router's (client) and the controller's (server)."""
SWAP_SPAN = "hotseat.pool.swap"
"""One run of a swap by its owner (a takeover runs it again under the same swap id)."""
DRIVER_UNLOAD_SPAN = "hotseat.driver.unload"
DRIVER_LOAD_SPAN = "hotseat.driver.load"

SWAP_ID = "hotseat.swap_id"
POOL = "hotseat.pool"
MEMBER = "hotseat.member"
REQUEST_ID = "hotseat.request_id"
RULE = "hotseat.rule"
BACKEND = "hotseat.backend"
OUTCOME = "hotseat.outcome"
RESULT = "hotseat.result"
EPOCH = "hotseat.epoch"
STATUS = "http.response.status_code"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"

Value = str | int | float | bool


class Kind(Enum):
    INTERNAL = "internal"
    SERVER = "server"
    CLIENT = "client"


class Span(Protocol):
    def set(self, key: str, value: Value | None) -> None:
        """Set an attribute (``None``: leave it unset)."""


class _NoSpan:
    """The span of tracing that is off: a context manager that is its own span."""

    __slots__ = ()

    def set(self, key: str, value: Value | None) -> None:
        return

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return


_NO_SPAN = _NoSpan()


class Tracing:
    """Tracing that is off; :func:`start_tracing` returns one that exports when asked to."""

    enabled = False

    def span(
        self,
        name: str,
        attributes: Mapping[str, Value | None] | None = None,
        *,
        kind: Kind = Kind.INTERNAL,
        carrier: Mapping[str, str] | None = None,
    ) -> contextlib.AbstractContextManager[Span]:
        """A span, the current one while the block runs (``carrier``: the headers of the
        message it continues, instead of the current span)."""
        return _NO_SPAN

    def headers(self) -> dict[str, str] | None:
        """The current span's context as message headers (``None`` when off)."""
        return None

    def shutdown(self) -> None:
        """Export what is still buffered (blocking: call it from a thread)."""
        return


NO_TRACING = Tracing()


class _OtelSpan:
    __slots__ = ("_span",)

    def __init__(self, span: Any) -> None:
        self._span = span

    def set(self, key: str, value: Value | None) -> None:
        if value is not None:
            self._span.set_attribute(key, value)


class _OtlpTracing(Tracing):
    """Spans exported over OTLP/HTTP by the SDK's batch processor."""

    enabled = True

    def __init__(self, service: str, instance: str, endpoint: str) -> None:
        # Imported here: only a service that turns tracing on needs the `otel` extra.
        from opentelemetry import trace  # noqa: PLC0415
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter,
        )
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415
        from opentelemetry.trace.propagation.tracecontext import (  # noqa: PLC0415
            TraceContextTextMapPropagator,
        )

        resource = Resource.create(
            {"service.name": f"hotseat-{service}", "service.instance.id": instance}
        )
        self._provider = TracerProvider(resource=resource)
        exporter = OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces", timeout=5)
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("hotseat")
        self._propagator = TraceContextTextMapPropagator()
        self._kinds = {
            Kind.INTERNAL: trace.SpanKind.INTERNAL,
            Kind.SERVER: trace.SpanKind.SERVER,
            Kind.CLIENT: trace.SpanKind.CLIENT,
        }

    @contextlib.contextmanager
    def span(
        self,
        name: str,
        attributes: Mapping[str, Value | None] | None = None,
        *,
        kind: Kind = Kind.INTERNAL,
        carrier: Mapping[str, str] | None = None,
    ) -> Iterator[Span]:
        context = self._propagator.extract(dict(carrier)) if carrier is not None else None
        given = {k: v for k, v in (attributes or {}).items() if v is not None}
        with self._tracer.start_as_current_span(
            name, context=context, kind=self._kinds[kind], attributes=given
        ) as span:
            yield _OtelSpan(span)

    def headers(self) -> dict[str, str] | None:
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier)
        return carrier or None

    def shutdown(self) -> None:
        self._provider.shutdown()


class TracingUnavailable(RuntimeError):
    """Tracing was asked for, but the ``otel`` extra is not installed."""


def start_tracing(service: str, instance: str, endpoint: str | None) -> Tracing:
    """:data:`NO_TRACING` without an endpoint; else spans exported to it over OTLP/HTTP."""
    if not endpoint:
        return NO_TRACING
    try:
        return _OtlpTracing(service, instance, endpoint)
    except ImportError as exc:
        raise TracingUnavailable(
            "HOTSEAT_OTLP_ENDPOINT is set but OpenTelemetry is not installed: "
            "pip install 'hotseat-common[otel]'"
        ) from exc
