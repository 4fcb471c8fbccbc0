"""The upstream HTTP client: pooled keep-alive connections to every backend (aiohttp).

aiohttp was chosen over httpx by measurement (docs/adr/0003-router-upstream-client.md).
Every aiohttp exception is translated here, at this one boundary, into
:class:`UpstreamConnectError` or :class:`UpstreamBodyError`; timeouts are the caller's
(``asyncio.timeout`` around :meth:`UpstreamClient.send` and each :meth:`UpstreamResponse.chunk`).
"""

from __future__ import annotations

import aiohttp
from aiohttp.abc import AbstractStreamWriter
from aiohttp.payload import Payload
from yarl import URL

SKIP_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")
"""Send only what the client sent: no headers of aiohttp's own choosing."""


Body = bytes | tuple[bytes | memoryview, ...]
"""A request body: its bytes, or pieces sent one after the other (a renamed body)."""

WRITE_SLICE = 256 * 1024
"""A body larger than this is written a slice at a time, each once the previous one is
on its way: the connection's send buffer then holds at most about a slice, never a copy
of the whole body (asyncio keeps what a socket did not take at once)."""


class _SlicedBody(Payload):
    """A body written as views of the caller's buffers, a slice at a time."""

    def __init__(self, pieces: tuple[bytes | memoryview, ...]) -> None:
        super().__init__(pieces)
        self._pieces = pieces
        self._size = sum(len(piece) for piece in pieces)

    async def write(self, writer: AbstractStreamWriter) -> None:
        for piece in self._pieces:
            view = memoryview(piece)
            for start in range(0, len(view), WRITE_SLICE):
                await writer.write(view[start : start + WRITE_SLICE])

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return b"".join(self._pieces).decode(encoding, errors)


def _payload(body: Body) -> bytes | _SlicedBody:
    if isinstance(body, bytes):
        return body if len(body) <= WRITE_SLICE else _SlicedBody((body,))
    if sum(len(piece) for piece in body) <= WRITE_SLICE:
        return b"".join(body)
    return _SlicedBody(body)


class UpstreamConnectError(Exception):
    """The upstream could not be reached or dropped the connection before answering."""


class UpstreamBodyError(Exception):
    """The upstream broke the connection while sending its body."""


class UpstreamResponse:
    """Status and headers of an upstream answer whose body is read chunk by chunk."""

    __slots__ = ("_remaining", "_response", "headers", "status")

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status
        self.headers: tuple[tuple[bytes, bytes], ...] = response.raw_headers
        length = response.content_length
        self._remaining = length if length is not None else -1

    @property
    def content_type(self) -> str:
        return self._response.content_type

    @property
    def body_known_complete(self) -> bool:
        """True once a body with a Content-Length has been read in full."""
        return self._remaining == 0

    async def chunk(self) -> bytes:
        """The next piece of the body as it arrives; ``b""`` at its end."""
        try:
            data = await self._response.content.readany()
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamBodyError(str(exc) or type(exc).__name__) from exc
        if self._remaining > 0:
            self._remaining -= len(data)
        return data

    def chunk_at_hand(self) -> bytes | None:
        """What :meth:`chunk` would return at once, without waiting: the body received so
        far (``b""`` at its end); ``None`` when nothing came yet (then await :meth:`chunk`)."""
        content = self._response.content
        try:
            data = content.read_nowait()  # raises what broke the body, as chunk() does
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamBodyError(str(exc) or type(exc).__name__) from exc
        if not data:
            return b"" if content.at_eof() else None
        if self._remaining > 0:
            self._remaining -= len(data)
        return data

    def close(self) -> None:
        """Return the connection to the pool when the body was read, else drop it."""
        if self._response.content.at_eof() or self._remaining == 0:
            self._response.release()
        else:
            # Closing the socket is what tells the upstream to stop generating.
            self._response.close()


class UpstreamClient:
    """One connection pool per router process, shared by every backend."""

    def __init__(self, *, connections_per_host: int, keepalive_s: float) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=0,
                limit_per_host=connections_per_host,
                keepalive_timeout=keepalive_s,
                ttl_dns_cache=60,
            ),
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None),
            skip_auto_headers=SKIP_AUTO_HEADERS,
        )

    async def send(
        self, url: str, *, headers: list[tuple[str, str]], body: Body
    ) -> UpstreamResponse:
        """POST ``body`` to ``url`` as it is written (the client's query string, already
        percent-encoded, is not encoded a second time) and return once the response
        headers arrived."""
        target = URL(url, encoded=True)
        # A pooled connection the upstream closed while idle fails at once with
        # ServerDisconnected; one retry on a fresh connection is not a second attempt.
        for retry in (True, False):
            try:
                response = await self._session.post(
                    target, data=_payload(body), headers=headers, allow_redirects=False
                )
            except aiohttp.ServerDisconnectedError as exc:
                if retry:
                    continue
                raise UpstreamConnectError(str(exc) or "server disconnected") from exc
            except (aiohttp.ClientError, OSError) as exc:
                raise UpstreamConnectError(str(exc) or type(exc).__name__) from exc
            return UpstreamResponse(response)
        raise AssertionError("unreachable")  # pragma: no cover

    async def close(self) -> None:
        await self._session.close()
