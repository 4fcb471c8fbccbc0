"""The fault proxy itself, against a real echo server: each mode does what the fault
tests rely on."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from tests.support.faultproxy import DOWN, UP, FaultProxy, seen

pytestmark = pytest.mark.fault


@pytest.fixture
async def echo_port() -> AsyncIterator[int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Closed whatever happens: the tests reset connections under it, and a writer left
        # to the garbage collector warns (an error) in whichever test runs then.
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            await _closed(writer)

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()


async def _closed(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


async def _roundtrip(port: int, payload: bytes, timeout: float = 5) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(payload)
        await writer.drain()
        return await asyncio.wait_for(reader.readexactly(len(payload)), timeout)
    finally:
        await _closed(writer)


async def test_pass_latency_and_blackhole(echo_port: int) -> None:
    """pass forwards, latency delays each direction, blackhole holds bytes until healed."""
    with FaultProxy(echo_port) as proxy:
        assert await _roundtrip(proxy.port, b"hello") == b"hello"
        proxy.latency(0.2)
        started = time.monotonic()
        assert await _roundtrip(proxy.port, b"slow") == b"slow"
        assert time.monotonic() - started >= 0.4  # 0.2 s each way
        proxy.blackhole()
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"held")
        await writer.drain()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.readexactly(4), 0.3)
        proxy.pass_()
        assert await asyncio.wait_for(reader.readexactly(4), 5) == b"held"
        await _closed(writer)


async def test_reset_and_close_after(echo_port: int) -> None:
    """reset aborts open connections and refuses new ones; close_after cuts a connection
    once its byte budget is spent."""
    with FaultProxy(echo_port) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"x")
        await writer.drain()
        assert await reader.readexactly(1) == b"x"
        proxy.reset()
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await asyncio.wait_for(reader.readexactly(1), 5)
        await _closed(writer)
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await _roundtrip(proxy.port, b"refused")
        proxy.close_after(4, DOWN)
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"0123456789")
        await writer.drain()
        assert await asyncio.wait_for(reader.read(100), 5) == b"0123"
        assert await asyncio.wait_for(reader.read(100), 5) == b""
        await _closed(writer)


async def test_trip_wire_holds_from_the_pattern_on(echo_port: int) -> None:
    """when_seen blackholes a direction from the chunk holding the pattern on."""
    with FaultProxy(echo_port) as proxy:
        tripped = proxy.when_seen(b"STOP", UP)
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"go")
        await writer.drain()
        assert await reader.readexactly(2) == b"go"
        writer.write(b"STOP")
        await writer.drain()
        await seen(tripped, 5)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.readexactly(4), 0.3)
        await _closed(writer)
