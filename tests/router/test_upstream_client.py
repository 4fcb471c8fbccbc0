"""The router's upstream HTTP client against scripted upstreams: real TCP (and TLS)
servers on free ports whose every byte the test writes, so each way an upstream can
answer, stall or break is played exactly."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hotseat_router.upstream import (
    READ_HIGH_WATER,
    UpstreamBodyError,
    UpstreamClient,
    UpstreamConnectError,
    UpstreamResponse,
)
from tests.support.tls import make_tls

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "Scripted"], Awaitable[None]]

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


@dataclass
class Scripted:
    """A TCP server that runs ``handler`` on each connection it accepts."""

    handler: Handler
    connections: int = 0
    closed_by_client: int = 0
    requests: list[bytes] = field(default_factory=list)
    server: asyncio.Server | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def url(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer, self)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self.changed.set()

    async def request(self, reader: asyncio.StreamReader) -> bytes | None:
        """One request, head and body; ``None`` when the client closed the connection."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            self.closed_by_client += 1
            self.changed.set()
            return None
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        whole = head + await reader.readexactly(length)
        self.requests.append(whole)
        self.changed.set()
        return whole

    async def until(self, condition: Callable[[], bool], timeout: float = 10) -> None:
        async with asyncio.timeout(timeout):
            while not condition():
                self.changed.clear()
                await self.changed.wait()


@contextlib.asynccontextmanager
async def scripted(handler: Handler, **tls: ssl.SSLContext) -> AsyncIterator[Scripted]:
    upstream = Scripted(handler)
    upstream.server = await asyncio.start_server(upstream._serve, "127.0.0.1", 0, **tls)
    try:
        yield upstream
    finally:
        upstream.server.close()


@contextlib.asynccontextmanager
async def client(*, per_host: int = 16, keepalive_s: float = 30) -> AsyncIterator[UpstreamClient]:
    upstream_client = UpstreamClient(connections_per_host=per_host, keepalive_s=keepalive_s)
    try:
        yield upstream_client
    finally:
        await upstream_client.close()


async def read_all(response: UpstreamResponse) -> bytes:
    pieces = []
    while chunk := await response.chunk():
        pieces.append(chunk)
    return b"".join(pieces)


async def keep_answering(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Scripted
) -> None:
    while await s.request(reader) is not None:
        writer.write(OK)


async def test_a_connection_is_reused_and_the_request_is_written_as_given() -> None:
    async with scripted(keep_answering) as upstream, client() as upstream_client:
        for n in range(3):
            response = await upstream_client.send(
                upstream.url + "/v1/chat/completions?a=%20b",
                headers=[("x-n", str(n)), ("x-text", "é")],
                body=b'{"model":"m"}',
            )
            assert (response.status, response.content_type) == (200, "application/json")
            assert await read_all(response) == b"{}"
            assert response.body_known_complete
            response.close()
        assert upstream.connections == 1
        first = upstream.requests[0]
        assert first.startswith(b"POST /v1/chat/completions?a=%20b HTTP/1.1\r\n")
        assert b"\r\nx-n: 0\r\n" in first
        assert "x-text: é".encode() in first
        assert b"\r\ncontent-length: 13\r\n" in first.lower()
        assert first.endswith(b'\r\n\r\n{"model":"m"}')


async def test_credentials_in_the_address_are_sent_unless_the_request_has_its_own() -> None:
    async with scripted(keep_answering) as upstream, client() as upstream_client:
        url = upstream.url.replace("http://", "http://us%40er:p%3Ass@") + "/x"
        for headers in ([], [("authorization", "Bearer k")]):
            response = await upstream_client.send(url, headers=headers, body=b"")
            await read_all(response)
            response.close()
        basic = b"authorization: Basic " + base64.b64encode(b"us@er:p:ss")
        assert [basic in r for r in upstream.requests] == [True, False]
        assert b"authorization: Bearer k\r\n" in upstream.requests[1]
        assert b"\r\nhost: 127.0.0.1:" in upstream.requests[0]


async def test_an_answer_given_back_unread_leaves_nothing_for_the_next() -> None:
    """An error answer the router does not relay (a 5xx) is closed unread; when it came
    whole, its connection is reused and the next answer is its own bytes only."""
    async with scripted(keep_answering) as upstream, client() as upstream_client:
        unread = await upstream_client.send(upstream.url + "/x", headers=[], body=b"")
        async with asyncio.timeout(10):
            while not unread._conn.body_ended:
                await asyncio.sleep(0.01)
        unread.close()
        response = await upstream_client.send(upstream.url + "/x", headers=[], body=b"")
        unread.close()  # again, by mistake: the connection is the next answer's now
        other = await upstream_client.send(upstream.url + "/x", headers=[], body=b"")
        assert await read_all(response) == b"{}"
        assert await read_all(other) == b"{}"
        assert upstream.connections == 2


async def test_a_pooled_connection_dropped_before_any_answer_is_retried_on_a_fresh_one() -> None:
    """The upstream closes a kept-alive connection just as the next request goes out on
    it (its idle timeout): that request is sent again on a new connection."""

    async def answer_once_then_drop(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Scripted
    ) -> None:
        await s.request(reader)
        writer.write(OK)
        await s.request(reader)  # the next one on this connection: dropped unanswered

    async with scripted(answer_once_then_drop) as upstream, client() as upstream_client:
        for body in (b"a", b"b"):
            response = await upstream_client.send(upstream.url + "/x", headers=[], body=body)
            assert response.status == 200
            assert await read_all(response) == b"{}"
            response.close()
        assert upstream.connections == 2
        assert [r[-1:] for r in upstream.requests] == [b"a", b"b", b"b"]


async def test_a_request_dropped_unanswered_is_sent_at_most_twice() -> None:
    """Every pooled connection dropping the request (it kills its upstream): the retry
    is one, not one per pooled connection."""

    async def answer_once_then_drop(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Scripted
    ) -> None:
        await s.request(reader)
        await s.until(lambda: len(s.requests) >= 3)  # three connections pooled at once
        writer.write(OK)
        await s.request(reader)

    async with scripted(answer_once_then_drop) as upstream, client() as upstream_client:
        url = upstream.url + "/x"
        first = await asyncio.gather(
            *(upstream_client.send(url, headers=[], body=b"a") for _ in range(3))
        )
        for response in first:
            await read_all(response)
            response.close()
        with pytest.raises(UpstreamConnectError):
            await upstream_client.send(url, headers=[], body=b"poison")
        await upstream.until(lambda: len(upstream.requests) >= 5)
        assert [r[-6:] for r in upstream.requests].count(b"poison") == 2


async def test_a_fresh_connection_dropped_before_any_answer_is_not_retried() -> None:
    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Scripted) -> None:
        await s.request(reader)

    async with scripted(drop) as upstream, client() as upstream_client:
        with pytest.raises(UpstreamConnectError):
            await upstream_client.send(upstream.url + "/x", headers=[], body=b"a")
        assert upstream.connections == 1


async def test_unreachable_upstream() -> None:
    async with scripted(keep_answering) as upstream:
        url = upstream.url
    async with client() as upstream_client:
        with pytest.raises(UpstreamConnectError):
            await upstream_client.send(url + "/x", headers=[], body=b"a")


def answers_then_closes(answer: bytes) -> Handler:
    """An upstream that takes one request, writes ``answer`` and closes the connection."""

    async def handler(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Scripted
    ) -> None:
        await s.request(reader)
        writer.write(answer)
        await writer.drain()

    return handler


async def test_a_body_cut_short_of_its_length_is_a_body_error() -> None:
    cut = answers_then_closes(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this")
    async with scripted(cut) as upstream, client() as upstream_client:
        response = await upstream_client.send(upstream.url + "/x", headers=[], body=b"")
        with pytest.raises(UpstreamBodyError):
            await read_all(response)
        assert not response.body_known_complete
        response.close()


async def test_a_chunked_body_that_breaks_off_is_a_body_error() -> None:
    cut = answers_then_closes(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n"
    )
    async with scripted(cut) as upstream, client() as upstream_client:
        response = await upstream_client.send(upstream.url + "/x", headers=[], body=b"")
        assert await response.chunk() == b"hello"
        with pytest.raises(UpstreamBodyError):
            await response.chunk()
        response.close()


async def test_a_body_read_until_close_ends_at_the_close() -> None:
    async def until_close(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Scripted
    ) -> None:
        await s.request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nconnection: close\r\n"
            b"content-type: Text/Event-Stream; charset=utf-8\r\n\r\n"
        )
        for n in range(3):
            writer.write(b"data: %d\n\n" % n)
            await writer.drain()

    async with scripted(until_close) as upstream, client() as upstream_client:
        response = await upstream_client.send(upstream.url + "/x", headers=[], body=b"")
        assert response.content_type == "text/event-stream"
        assert await read_all(response) == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
        response.close()


async def test_a_chunked_stream_arrives_piece_by_piece_and_the_connection_is_reused() -> None:
    go_on = asyncio.Event()

    async def stream(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Scripted
    ) -> None:
        while await s.request(reader) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\none\r\n")
            await go_on.wait()
            writer.write(b"3\r\ntwo\r\n0\r\n\r\n")
            go_on.clear()

    async with scripted(stream) as upstream, client() as upstream_client:
        for _ in range(2):
            response = await upstream_client.send(upstream.url + "/x", headers=[], body=b"")
            assert await response.chunk() == b"one"
            assert response.chunk_at_hand() is None  # nothing more yet: the caller waits
            go_on.set()
            assert await response.chunk() == b"two"
            assert response.body_known_complete
            assert await response.chunk() == b""
            response.close()
        assert upstream.connections == 1


@pytest.mark.parametrize("apart", [False, True], ids=["same-read", "later-read"])
async def test_bytes_after_an_answer_make_its_connection_unusable(apart: bool) -> None:
    """An upstream that writes past its answer's end (a second, unasked answer) has lost
    track of the exchange: the connection is closed, with the answer whole, whether
    those bytes came with the answer or later while it was idle. (Bytes that come after
    the next request went out on it cannot be told from its answer: HTTP/1.1 has no
    way to.)"""
    stale = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nstale"

    async def answer_twice(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Scripted
    ) -> None:
        await s.request(reader)
        if apart:
            writer.write(OK)
            await writer.drain()
            await asyncio.sleep(0.05)  # the scripted upstream's pause (correct either way)
            writer.write(stale)
        else:
            writer.write(OK + stale)
        await s.request(reader)  # None once the client closes this connection

    async with scripted(answer_twice) as upstream, client() as upstream_client:
        response = await upstream_client.send(upstream.url + "/x", headers=[], body=b"")
        assert await read_all(response) == b"{}"
        response.close()
        await upstream.until(lambda: upstream.closed_by_client == 1)
        response = await upstream_client.send(upstream.url + "/x", headers=[], body=b"")
        assert await read_all(response) == b"{}"
        assert upstream.connections == 2


async def test_an_interim_answer_is_skipped() -> None:
    async def continue_first(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Scripted
    ) -> None:
        await s.request(reader)
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)  # the interim answer alone first (correct either way)
        writer.write(OK)

    async with scripted(continue_first) as upstream, client() as upstream_client:
        response = await upstream_client.send(upstream.url + "/x", headers=[], body=b"")
        assert response.status == 200
        assert await read_all(response) == b"{}"


@pytest.mark.parametrize(
    "answer",
    [b"this is not HTTP\r\n\r\n", b"HTTP/1.1 200 OK\r\nx: " + b"y" * (300 * 1024) + b"\r\n\r\n"],
    ids=["garbage", "head-too-large"],
)
async def test_an_answer_that_is_not_http_is_a_connect_error(answer: bytes) -> None:
    async def bad(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Scripted) -> None:
        await s.request(reader)
        writer.write(answer)
        await writer.drain()
        await reader.read()

    async with scripted(bad) as upstream, client() as upstream_client:
        with pytest.raises(UpstreamConnectError):
            await upstream_client.send(upstream.url + "/x", headers=[], body=b"")


async def test_a_header_with_a_line_break_is_never_written() -> None:
    async with scripted(keep_answering) as upstream, client() as upstream_client:
        with pytest.raises(UpstreamConnectError, match="line break"):
            await upstream_client.send(
                upstream.url + "/x", headers=[("x-a", "b\r\nx-injected: 1")], body=b""
            )
        assert upstream.requests == []


async def test_an_unread_or_cancelled_answer_closes_its_connection() -> None:
    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Scripted) -> None:
        await s.request(reader)
        await s.request(reader)  # returns None once the client closes

    async with scripted(hang) as upstream, client() as upstream_client:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await upstream_client.send(upstream.url + "/x", headers=[], body=b"")
        await upstream.until(lambda: upstream.closed_by_client == 1)


async def test_a_slow_reader_pauses_the_upstream_and_still_gets_every_byte() -> None:
    size = 32 * 1024 * 1024
    piece = bytes(range(256)) * 256  # 64 KiB

    async def flood(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, s: Scripted
    ) -> None:
        await s.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
        for _ in range(size // len(piece)):
            writer.write(piece)
            await writer.drain()

    async with scripted(flood) as upstream, client() as upstream_client:
        response = await upstream_client.send(upstream.url + "/x", headers=[], body=b"")
        conn = response._conn
        async with asyncio.timeout(10):
            while not conn._reading_paused:
                await asyncio.sleep(0.01)
        waiting = conn._buffered
        assert READ_HIGH_WATER < waiting < READ_HIGH_WATER + 1024 * 1024
        got = bytearray()
        while chunk := await response.chunk():
            got += chunk
        assert got == piece * (size // len(piece))


async def test_a_large_request_body_is_written_whole_in_slices() -> None:
    body = bytes(range(256)) * 4096 * 3  # 3 MiB

    async with scripted(keep_answering) as upstream, client() as upstream_client:
        response = await upstream_client.send(
            upstream.url + "/x", headers=[], body=(body[:10], memoryview(body)[10:])
        )
        assert response.status == 200
        assert upstream.requests[0].endswith(b"\r\n\r\n" + body)


async def test_connections_per_host_is_a_limit_and_a_freed_one_is_handed_on() -> None:
    async with scripted(keep_answering) as upstream, client(per_host=1) as upstream_client:
        first = await upstream_client.send(upstream.url + "/x", headers=[], body=b"")
        second = asyncio.create_task(
            upstream_client.send(upstream.url + "/x", headers=[], body=b"")
        )
        await asyncio.sleep(0.05)
        assert not second.done()  # waits for the one connection
        assert await read_all(first) == b"{}"
        first.close()
        response = await asyncio.wait_for(second, 10)
        assert await read_all(response) == b"{}"
        assert upstream.connections == 1


async def test_an_idle_connection_is_closed_after_the_keep_alive() -> None:
    async with scripted(keep_answering) as upstream, client(keepalive_s=0.2) as upstream_client:
        response = await upstream_client.send(upstream.url + "/x", headers=[], body=b"")
        await read_all(response)
        response.close()
        await upstream.until(lambda: upstream.closed_by_client == 1)


async def test_https_upstream_is_verified(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tls = make_tls(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(tls.cert, tls.key)
    async with scripted(keep_answering, ssl=server_tls) as upstream:
        url = upstream.url.replace("http://127.0.0.1", "https://localhost")
        async with client() as upstream_client:
            with pytest.raises(UpstreamConnectError):  # not a certificate it trusts
                await upstream_client.send(url + "/x", headers=[], body=b"")
        monkeypatch.setenv("SSL_CERT_FILE", str(tls.ca))
        async with client() as upstream_client:
            response = await upstream_client.send(url + "/x", headers=[], body=b"a")
            assert await read_all(response) == b"{}"
        assert upstream.requests[-1].split(b"\r\n")[1] == f"host: {url.split('//')[1]}".encode()
