"""How a request learns that its client left: from its connection (the ``CLIENT_LEFT``
scope extension of the router's own HTTP server), with no task of its own, and by a task
awaiting ``receive()`` under a server without it. Either way the request is interrupted
and audited ``client_disconnected``; a callback never outlives its request on a
kept-alive connection."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import httpx
import pytest

from hotseat.launcher import free_port
from hotseat_common.settings import ServiceSettings
from hotseat_router.asgi import CLIENT_LEFT, Receive, Scope, Send
from hotseat_router.connection import ConnectionLimits, LimitedHttpProtocol
from tests.router.conftest import router_tasks, serve
from tests.router.fake_activation import FakeActivation

CHAT = "/v1/chat/completions"


def pooled_config(a: Any) -> dict[str, Any]:
    return {
        "backends": [{"name": "a", "address": a.url, "pool": {"name": "gpu0", "member": "a"}}],
        "pools": [{"name": "gpu0", "members": [{"name": "a"}]}],
        "rules": [{"name": "r", "route": {"backends": ["a"]}}],
    }


async def leave_while_held(
    start_router: Any, upstream: Any, audit: Any, **server: Any
) -> list[str]:
    """A request held for a pool lease whose client leaves: it stops asking (no lease is
    granted) and is audited ``client_disconnected``. Returns the router's own tasks
    started meanwhile (:func:`router_tasks`)."""
    a = await upstream("a")
    activation = FakeActivation(hold={"a": asyncio.Event()})
    router = await start_router(pooled_config(a), activation_factory=activation.factory, **server)
    with router_tasks() as started:
        async with httpx.AsyncClient(timeout=30) as http:
            request = asyncio.create_task(
                http.post(
                    router.url + CHAT, json={"model": "m"}, headers={"x-hotseat-request-id": "held"}
                )
            )
            await asyncio.wait_for(activation.asked.wait(), 5)
            request.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await request
        event = await audit.request_event("held")
    assert event["outcome"] == "client_disconnected"
    activation.hold["a"].set()
    assert activation.granted == []
    return started


async def test_a_client_leaving_while_held_is_noticed_without_a_task(upstream, start_router, audit):
    """A client that leaves while its request is held for a pool lease: the request is
    interrupted and audited ``client_disconnected``, and the router started no task of its
    own to notice."""
    assert await leave_while_held(start_router, upstream, audit) == []


async def test_under_another_server_a_task_notices_the_client_leaving(
    upstream, start_router, audit
):
    """Under uvicorn's own protocol (no ``CLIENT_LEFT``), a task awaiting ``receive()``
    notices the client leaving while held: the same ``client_disconnected``."""
    started = await leave_while_held(start_router, upstream, audit, http="httptools")
    assert len(started) == 1, started


# --- the extension itself, under the router's HTTP server with a small app -------------


@dataclass
class Script:
    """What each path of :func:`scripted_app` does with ``CLIENT_LEFT``."""

    fired: list[str] = field(default_factory=list)
    reached: dict[str, asyncio.Event] = field(default_factory=dict)
    """Per path: it registered its callback (or, for ``/unwatched``, saw the client leave)."""
    went: dict[str, asyncio.Event] = field(default_factory=dict)
    """Per path: its callback fired."""
    first_may_unwatch: asyncio.Event = field(default_factory=asyncio.Event)
    first_unwatched: asyncio.Event = field(default_factory=asyncio.Event)

    def event(self, table: dict[str, asyncio.Event], path: str) -> asyncio.Event:
        return table.setdefault(path, asyncio.Event())

    def callback(self, path: str) -> Callable[[], None]:
        def fire() -> None:
            self.fired.append(path)
            self.event(self.went, path).set()

        return fire


def scripted_app(script: Script) -> Callable[[Scope, Receive, Send], Any]:
    """``/keep``: watch, answer, never unwatch. ``/late``: watch, answer, unwatch only once
    ``first_may_unwatch`` is set. ``/hang``: watch, then wait for the client to leave.
    ``/unwatched``: no watch, wait for ``http.disconnect``. ``/after``: wait for
    ``http.disconnect``, then watch."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        hook = scope["extensions"][CLIENT_LEFT]
        await receive()  # the (empty) body
        fire = script.callback(path)
        if path in {"/keep", "/late", "/hang"}:
            hook["watch"](fire)
            script.event(script.reached, path).set()
        if path in {"/unwatched", "/after"}:
            while (await receive())["type"] != "http.disconnect":
                pass
            script.event(script.reached, path).set()
        if path == "/after":
            hook["watch"](fire)
            return
        if path == "/hang":
            await script.event(script.went, path).wait()
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"1"})
        if path == "/late":
            await script.first_may_unwatch.wait()
            hook["unwatch"](fire)
            script.first_unwatched.set()

    return app


@pytest.fixture
async def scripted() -> AsyncIterator[tuple[Script, str, int]]:
    """:func:`scripted_app` under uvicorn with the router's connection layer."""
    script = Script()
    port = free_port()
    limits = ConnectionLimits(
        max_header_bytes=16384,
        max_headers=100,
        header_timeout=30,
        max_connections=100,
        write_timeout=30,
    )
    server, task = await serve(
        scripted_app(script),
        ServiceSettings(port=port, shutdown_grace=5),
        http=partial(LimitedHttpProtocol, limits=limits),
        lifespan="off",
    )
    yield script, "127.0.0.1", port
    server.should_exit = True
    await asyncio.wait_for(task, 10)


class Connection:
    """One kept-alive HTTP/1.1 connection, requests written by hand."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def ask(self, path: str) -> None:
        self.writer.write(f"GET {path} HTTP/1.1\r\nhost: t\r\n\r\n".encode())

    async def answer(self) -> bytes:
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200"), head
        return await asyncio.wait_for(self.reader.readexactly(1), 5)

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


async def connect(host: str, port: int) -> Connection:
    return Connection(*await asyncio.open_connection(host, port))


async def test_a_callback_never_fires_after_its_response(scripted):
    """Request 1 watches and is answered without unwatching; the client leaves during
    request 2 on the same connection: request 1's callback does not fire."""
    script, host, port = scripted
    connection = await connect(host, port)
    connection.ask("/keep")
    assert await connection.answer() == b"1"
    connection.ask("/unwatched")
    await connection.close()
    await asyncio.wait_for(script.event(script.reached, "/unwatched").wait(), 5)
    assert script.fired == []


async def test_an_earlier_request_ending_late_leaves_the_next_ones_watch(scripted):
    """Request 1 unwatches only after request 2 on the same connection watched: the client
    leaving then fires request 2's callback, and only it."""
    script, host, port = scripted
    connection = await connect(host, port)
    connection.ask("/late")
    assert await connection.answer() == b"1"
    connection.ask("/hang")
    await asyncio.wait_for(script.event(script.reached, "/hang").wait(), 5)
    script.first_may_unwatch.set()
    await asyncio.wait_for(script.first_unwatched.wait(), 5)
    await connection.close()
    await asyncio.wait_for(script.event(script.went, "/hang").wait(), 5)
    assert script.fired == ["/hang"]


async def test_a_watch_after_the_client_left_fires_at_once(scripted):
    """A request that watches once its client is already gone is told at once."""
    script, host, port = scripted
    connection = await connect(host, port)
    connection.ask("/after")
    await connection.close()
    await asyncio.wait_for(script.event(script.went, "/after").wait(), 5)
    assert script.fired == ["/after"]
