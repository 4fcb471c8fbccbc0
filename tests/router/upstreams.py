"""Purpose-built upstream servers for router tests: real HTTP servers on free ports.

One :class:`FakeUpstream` plays an OpenAI-compatible backend whose behaviour a test
scripts through :attr:`FakeUpstream.mode` and a few events.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from hotseat.launcher import free_port


@dataclass
class Received:
    path: str
    headers: list[tuple[str, str]]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)


def completion(model: str, text: str = "hello") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def chunk(model: str, text: str, *, finish: bool = False) -> bytes:
    payload = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "delta": {} if finish else {"content": text},
                "finish_reason": "stop" if finish else None,
            }
        ],
    }
    return b"data: " + orjson.dumps(payload) + b"\n\n"


@dataclass
class FakeUpstream:
    """Modes: ``ok``, ``status`` (answer ``status``), ``hang`` (never answer), ``slow``
    (answer after ``delay_s``), ``echo``,
    ``stream`` (first chunk, then the rest once ``gate`` is set), ``stream_forever``
    (one chunk, then nothing until the client leaves), ``stream_stall`` (one chunk, then
    silence), ``stream_flood`` (chunks as fast as they are taken, until the client
    leaves). A JSON body's ``stream: true`` switches ``ok`` to a short SSE stream."""

    name: str
    mode: str = "ok"
    status: int = 500
    delay_s: float = 0.0
    requests: list[Received] = field(default_factory=list)
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    port: int = 0
    runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self.runner.setup()
        self.port = free_port()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append(Received(request.path_qs, list(request.headers.items()), body))
        self.arrived.set()
        try:
            return await self._respond(request, body)
        except asyncio.CancelledError:
            self.disconnected.set()
            raise
        finally:
            self.finished.set()

    async def _respond(self, request: web.Request, body: bytes) -> web.StreamResponse:
        doc = orjson.loads(body) if body else {}
        model = doc.get("model", "?") if isinstance(doc, dict) else "?"
        headers = {"x-upstream": self.name}
        if self.mode == "status":
            error = {"error": {"message": f"{self.name} says {self.status}", "type": "x"}}
            return web.json_response(error, status=self.status, headers=headers)
        if self.mode == "hang":
            await asyncio.Event().wait()
        if self.mode == "slow":
            # A slow model is the behaviour under test here, not a synchronisation stand-in.
            await asyncio.sleep(self.delay_s)  # the scripted slowness itself
        if self.mode == "echo":
            received = self.requests[-1]
            return web.json_response(
                {"path": received.path, "headers": received.headers, "body": doc},
                headers=headers,
            )
        if self.mode.startswith("stream") or (isinstance(doc, dict) and doc.get("stream")):
            return await self._stream(request, model, headers)
        return web.json_response(completion(model, f"from {self.name}"), headers=headers)

    async def _stream(
        self, request: web.Request, model: str, headers: dict[str, str]
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={**headers, "content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk(model, f"from {self.name}"))
        while self.mode == "stream_flood":
            await response.write(chunk(model, "x" * 16384))
        if self.mode == "stream":
            await self.gate.wait()
        elif self.mode in {"stream_forever", "stream_stall"}:
            await asyncio.Event().wait()
        await response.write(chunk(model, " and more"))
        await response.write(chunk(model, "", finish=True))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response
