"""A small OTLP/HTTP trace receiver for tests: ``POST /v1/traces`` with the protobuf
``ExportTraceServiceRequest`` the OpenTelemetry exporters send, decoded with the
protocol's own generated classes (``opentelemetry-proto``) and answered as a collector
answers. Tests read the spans it received; nothing of Hotseat's code is replaced."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from hotseat.launcher import free_port


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    attributes: dict[str, Any]


def _value(value: Any) -> Any:
    which = value.WhichOneof("value")
    return getattr(value, which) if which else None


@dataclass
class OtlpReceiver:
    url: str
    spans: list[ReceivedSpan] = field(default_factory=list)
    requests: int = 0

    def named(self, name: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.name == name]

    async def _traces(self, request: web.Request) -> web.Response:
        if request.content_type != "application/x-protobuf":
            return web.Response(status=415)
        export = ExportTraceServiceRequest()
        export.ParseFromString(await request.read())
        self.requests += 1
        for resource in export.resource_spans:
            resource_attrs = {a.key: _value(a.value) for a in resource.resource.attributes}
            for scope in resource.scope_spans:
                for span in scope.spans:
                    self.spans.append(
                        ReceivedSpan(
                            service=str(resource_attrs.get("service.name", "")),
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            kind=span.kind,
                            attributes={a.key: _value(a.value) for a in span.attributes},
                        )
                    )
        body = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")


@asynccontextmanager
async def otlp_receiver() -> AsyncIterator[OtlpReceiver]:
    """A receiver on a free port of 127.0.0.1, in this event loop."""
    port = free_port()
    receiver = OtlpReceiver(url=f"http://127.0.0.1:{port}")
    app = web.Application()
    app.router.add_post("/v1/traces", receiver._traces)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield receiver
    finally:
        await runner.cleanup()
