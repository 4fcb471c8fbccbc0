"""Limits on what one client can make the router hold, over raw sockets against a router
process with small limits (tests/security/conftest.py: LIMITS): headers by bytes and by
count (431), time to send the headers and the body (408), open connections (the
longest idle one closed to make room, else 503 + Retry-After) and request body bytes
buffered at once (503 + Retry-After). Every answer
has the OpenAI error body and an x-hotseat-request-id, and nothing reaches an upstream."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from hotseat.launcher import Managed
from tests.security.conftest import CLIENT_KEY, LIMITS, SecureRouter, secure_router_with
from tests.security.rawhttp import answer_of, connect, head, header, status_of
from tests.support.waiting import eventually

MAX_HEADER_BYTES = int(LIMITS["HOTSEAT_MAX_HEADER_BYTES"])
MAX_HEADERS = int(LIMITS["HOTSEAT_MAX_HEADERS"])
MAX_CONNECTIONS = int(LIMITS["HOTSEAT_MAX_CONNECTIONS"])
BODY = b'{"model": "m", "messages": [], "pad": "'


def request_lines(*extra: str, length: int | None = None) -> list[str]:
    lines = [
        "POST /v1/chat/completions HTTP/1.1",
        "host: x",
        f"authorization: Bearer {CLIENT_KEY}",
        "content-type: application/json",
        *extra,
    ]
    if length is not None:
        lines.append(f"content-length: {length}")
    return lines


def padded(size: int) -> bytes:
    """A valid chat body of exactly ``size`` bytes."""
    return BODY + b"x" * (size - len(BODY) - 2) + b'"}'


async def assert_refused(reader: asyncio.StreamReader, status: int, code: str) -> bytes:
    """The answer is ``status`` with the OpenAI error ``code`` and a request id, and the
    router then closes the connection."""
    got, answer, body = await answer_of(reader)
    assert got == status, answer
    assert body["error"]["code"] == code, body  # type: ignore[index]
    assert header(answer, b"x-hotseat-request-id"), answer
    assert header(answer, b"content-type") == b"application/json", answer
    assert await asyncio.wait_for(reader.read(), 30) == b""  # closed by the router
    return answer


async def test_headers_over_the_byte_limit_get_431_while_still_arriving(
    limited_router: SecureRouter,
) -> None:
    """One header past max_header_bytes gets 431 while the client is still sending it
    (at most a read past the limit is held), and reaches no upstream."""
    reader, writer = await connect(limited_router.url)
    writer.write(("\r\n".join(request_lines(length=2)) + "\r\nx-big: ").encode())
    answer: asyncio.Task[tuple[int, bytes]] = asyncio.create_task(status_of(reader))
    sent = 0
    with contextlib.suppress(ConnectionError):
        while not answer.done() and sent < 64 * MAX_HEADER_BYTES:
            writer.write(b"a" * 1024)
            await writer.drain()
            sent += 1024
            await asyncio.wait({answer}, timeout=0.05)  # a client sending at its pace
    status, _ = await answer
    writer.close()
    assert status == 431
    assert sent < 64 * MAX_HEADER_BYTES, "the router took every byte of the header"
    assert limited_router.echo.requests == []


async def test_a_large_header_or_too_many_headers_get_431(limited_router: SecureRouter) -> None:
    """A whole head over max_header_bytes (one large header) or with more than
    max_headers headers gets 431 with the OpenAI error body, and reaches no upstream."""
    body = padded(64)
    for extra in (
        [f"x-big: {'a' * 2 * MAX_HEADER_BYTES}"],
        [f"x-h{i}: v" for i in range(MAX_HEADERS)],
    ):
        reader, writer = await connect(limited_router.url)
        writer.write(head(request_lines(*extra, length=len(body))) + body)
        await writer.drain()
        await assert_refused(reader, 431, "request_headers_too_large")
        writer.close()
    assert limited_router.echo.requests == []


async def test_headers_not_sent_in_time_get_408(limited_router: SecureRouter) -> None:
    """A connection that sends nothing, one that stops halfway through its headers, and
    one that trickles its headers a byte at a time all get 408 once header_timeout has
    passed since the connection opened, and are closed."""
    silent = await connect(limited_router.url)
    partial = await connect(limited_router.url)
    partial[1].write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
    trickle = await connect(limited_router.url)
    answer = asyncio.create_task(assert_refused(trickle[0], 408, "request_read_timeout"))
    with contextlib.suppress(ConnectionError):
        for byte in b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-slow: " + b"a" * 200:
            if answer.done():
                break
            trickle[1].write(bytes([byte]))
            await trickle[1].drain()
            await asyncio.wait({answer}, timeout=0.1)  # the slow client's pace
    await answer
    for reader, _ in (silent, partial):
        await assert_refused(reader, 408, "request_read_timeout")
    for _, writer in (silent, partial, trickle):
        writer.close()
    assert limited_router.echo.requests == []


async def test_a_body_shorter_than_its_length_gets_408(limited_router: SecureRouter) -> None:
    """A body that stops short of its Content-Length gets 408 once body_timeout has
    passed, and the connection is closed; nothing reaches an upstream."""
    reader, writer = await connect(limited_router.url)
    writer.write(head(request_lines(length=100)) + BODY)
    await writer.drain()
    await assert_refused(reader, 408, "request_read_timeout")
    writer.close()
    assert limited_router.echo.requests == []


PING = head(["GET /healthz HTTP/1.1", "host: x"])

Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


Opener = Callable[..., Awaitable[Connection]]
"""``sockets(url, source=None)``: a raw connection, from loopback address ``source``."""


@pytest.fixture
async def sockets() -> AsyncIterator[Opener]:
    """Connections opened by raw socket, all closed when the test ends (failed too)."""
    opened: list[asyncio.StreamWriter] = []

    async def open_one(url: str, source: str | None = None) -> Connection:
        reader, writer = await connect(url, source=source)
        opened.append(writer)
        return reader, writer

    yield open_one
    for writer in opened:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


@pytest.fixture
async def patient_router(
    tmp_path: Path, prefix: str, nats_server: Managed
) -> AsyncIterator[SecureRouter]:
    """The limited router, but waiting 30 s for a request's headers: a connection that
    sends nothing stays open as long as a test needs it."""
    async for router in secure_router_with(
        tmp_path, prefix, nats_server, {**LIMITS, "HOTSEAT_HEADER_TIMEOUT": "30"}
    ):
        yield router


async def pinged(connection: Connection) -> int:
    """The status of a ``GET /healthz`` on this connection (kept alive after it)."""
    reader, writer = connection
    writer.write(PING)
    status, answer = await status_of(reader)
    await reader.readexactly(int(header(answer, b"content-length") or 0))
    return status


async def test_connections_past_the_limit_get_503_with_retry_after(
    limited_router: SecureRouter, sockets: Opener
) -> None:
    """With max_connections open, each with a request under way (its upstream not
    answering), the next connection's request gets 503 with Retry-After and the OpenAI
    error body, and is closed; once the open ones close, a new one is served."""
    limited_router.echo.mode = "hang"
    body = padded(100)
    busy: list[asyncio.StreamWriter] = []

    async def upstream_has_all() -> bool:
        return len(limited_router.echo.requests) == len(busy)

    for _ in range(MAX_CONNECTIONS):
        _, writer = await sockets(limited_router.url)
        writer.write(head(request_lines(length=len(body))) + body)
        busy.append(writer)
        await eventually(upstream_has_all)
    reader, writer = await sockets(limited_router.url)
    writer.write(PING)
    refused = await assert_refused(reader, 503, "too_many_connections")
    assert header(refused, b"retry-after") == b"1"
    for writer in busy:
        writer.close()

    async def served() -> bool:
        reader, writer = await sockets(limited_router.url)
        writer.write(PING)
        status, _ = await status_of(reader)
        writer.close()
        return status == 200

    await eventually(served)


HOARDER, OTHER, THIRD = "127.0.0.2", "127.0.0.1", "127.0.0.3"
"""Three client hosts, as loopback addresses."""


async def test_one_client_holding_every_slot_gives_way_to_another(
    patient_router: SecureRouter, sockets: Opener
) -> None:
    """One client holding every slot with connections it does not use (one silent since
    it opened, the others kept alive after a request) locks nobody else out: a new
    connection from another client is served, and the holder's connection that has
    waited longest for a request is closed to make room (as HTTP allows of an idle
    connection), the silent one first, then the one kept alive the longest. A new
    connection of the holder's own is refused: it has its share. The holder's other
    connections stay open and usable."""
    url = patient_router.url
    silent = await sockets(url, HOARDER)
    kept = [await sockets(url, HOARDER) for _ in range(MAX_CONNECTIONS - 1)]
    for connection in kept:
        assert await pinged(connection) == 200
    assert await pinged(kept[0]) == 200  # used again: kept[1] has now waited longest
    newcomers = []
    for longest_waiting in (silent, kept[1]):
        newcomer = await sockets(url, OTHER)
        assert await pinged(newcomer) == 200
        closed = await asyncio.wait_for(longest_waiting[0].read(), 30)
        assert closed == b"", "the holder's connection idle the longest was not closed"
        newcomers.append(newcomer)
    reader, writer = await sockets(url, HOARDER)
    writer.write(PING)
    await assert_refused(reader, 503, "too_many_connections")
    for connection in [kept[0], *kept[2:], *newcomers]:
        assert await pinged(connection) == 200


async def test_a_client_trickling_heads_cannot_push_out_an_established_one(
    patient_router: SecureRouter, sockets: Opener
) -> None:
    """One client fills the slots with connections trickling their heads (slowloris),
    beside another client's kept-alive connection. A new connection of the trickling
    client is refused and the other client's connection stays open and served; a new
    connection from a third client is served, and the trickling client's connection
    that has waited longest is closed to make room."""
    url = patient_router.url
    established = await sockets(url, OTHER)
    assert await pinged(established) == 200
    trickling = [await sockets(url, HOARDER) for _ in range(MAX_CONNECTIONS - 1)]
    for _, writer in trickling:
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-slow: a")
        await writer.drain()
    reader, writer = await sockets(url, HOARDER)
    writer.write(PING)
    await assert_refused(reader, 503, "too_many_connections")
    assert await pinged(established) == 200
    third = await sockets(url, THIRD)
    assert await pinged(third) == 200
    closed = await asyncio.wait_for(trickling[0][0].read(), 30)
    assert closed == b"", "the trickling client's oldest connection was not closed"
    assert await pinged(established) == 200


async def test_bodies_past_the_body_budget_get_503_with_retry_after(
    limited_router: SecureRouter,
) -> None:
    """While one request holds most of the body budget (its body read, its upstream not
    yet answering), another whose declared body would not fit gets 503 with Retry-After
    before its body is read; once the first is over, the budget is free again."""
    limited_router.cloud.mode = "hang"
    body = padded(3000)
    first = await connect(limited_router.url)
    first[1].write(head(request_lines(length=len(body))) + body.replace(b'"m"', b'"c"'))
    await first[1].drain()
    await limited_router.cloud.arrived.wait()
    second = await connect(limited_router.url)
    second[1].write(head(request_lines(length=len(body))))
    await second[1].drain()
    answer = await assert_refused(second[0], 503, "body_budget_exceeded")
    assert header(answer, b"retry-after") == b"1"
    second[1].close()
    first[1].close()  # the client leaves: its request ends and its claim is released

    async def served() -> bool:
        reader, writer = await connect(limited_router.url)
        writer.write(head(request_lines(length=len(body))) + body)
        status, _, _ = await answer_of(reader)
        writer.close()
        return status == 200

    await eventually(served)
    assert [r.json()["model"] for r in limited_router.echo.requests] == ["m"]
