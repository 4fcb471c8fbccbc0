"""The floor: the least a Python HTTP proxy on the router's own stack (asyncio on uvloop,
httptools, orjson) does per request, to read the router's CPU per request against.

Each client connection gets one upstream connection of its own, kept alive. A request is
parsed (httptools) and its JSON body read for ``model`` and ``stream`` (orjson), which
any router must do to route it; then the bytes the client sent go upstream as they
came, and the upstream's bytes come back as they arrive, parsed only to know where the
response ends. Nothing else: no routing table, no header rewriting, no audit, no metrics,
no limits, no timeouts, no error answers. It is a floor to measure, not a proxy to run.

    python bench/floor_proxy.py PORT UPSTREAM_PORT      # prints "ready" once listening
"""

from __future__ import annotations

import asyncio
import sys
from typing import cast

import httptools
import orjson
import uvloop


class Upstream(asyncio.Protocol):
    """The upstream half: the response's bytes to the client as they arrive, parsed so that
    a real proxy would know where the response ends (this one needs not: it has one
    upstream connection per client connection)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.client.write(data)
        self.parser.feed_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()


class Client(asyncio.Protocol):
    """The client half: a request read whole, routed on its body, sent on as it came."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.upstream: Upstream | None = None
        self.raw: list[bytes] = []
        self.body: list[bytes] = []
        self.model: object = None
        self.stream: object = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.raw.append(data)
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        fields = orjson.loads(b"".join(self.body))
        self.model, self.stream = fields.get("model"), fields.get("stream")
        request = b"".join(self.raw)
        self.raw.clear()
        self.body.clear()
        if self.upstream is None:
            asyncio.get_running_loop().create_task(self.connect(request))
        elif self.upstream.transport is not None:
            self.upstream.transport.write(request)

    async def connect(self, request: bytes) -> None:
        loop = asyncio.get_running_loop()
        upstream = Upstream(self)
        self.upstream = upstream
        transport, _ = await loop.create_connection(
            lambda: upstream, "127.0.0.1", self.upstream_port
        )
        transport.write(request)

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.close()


async def serve(port: int, upstream_port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Client(upstream_port), "127.0.0.1", port)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(serve(int(sys.argv[1]), int(sys.argv[2])))
