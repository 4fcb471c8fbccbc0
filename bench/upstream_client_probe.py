"""What the router's upstream client costs: CPU per request of aiohttp with the router's
settings (``hotseat_router.upstream``) against a bare HTTP/1.1 client (an asyncio
protocol around httptools' response parser, a list of idle keep-alive connections, no
timeouts, no error handling), both on one uvloop event loop pinned to core 0, the fast
Node upstream on core 1, 8 concurrent tasks, three rounds alternating.

The bare client is a probe, not a candidate: it shows how much of the router's CPU per
request the upstream client's machinery is, so what a lean client could save at most.

    .venv/bin/python bench/upstream_client_probe.py [--seconds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import httptools
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "services" / "router" / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from client_choice import beside_upstream  # noqa: E402

from hotseat_router.upstream import SKIP_AUTO_HEADERS  # noqa: E402

PATH = b"/v1/chat/completions"
CONCURRENCY = 8


class _Exchange(asyncio.Protocol):
    """One keep-alive connection: the response's head, then its body piece by piece."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.chunks: deque[bytes] = deque()
        self.ended = False
        self.head: asyncio.Future[None] | None = None
        self._waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def begin(self) -> None:
        self.head = asyncio.get_running_loop().create_future()
        self.ended = False

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_headers_complete(self) -> None:
        if self.head is not None:
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.chunks.append(bytes(body))
        self._wake()

    def on_message_complete(self) -> None:
        self.ended = True
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def chunk(self) -> bytes:
        while not self.chunks:
            if self.ended:
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        return b"".join([self.chunks.popleft() for _ in range(len(self.chunks))])


class BareClient:
    def __init__(self, port: int) -> None:
        self._port = port
        self._idle: list[_Exchange] = []

    async def post(self, body: bytes) -> _Exchange:
        if self._idle:
            exchange = self._idle.pop()
        else:
            loop = asyncio.get_running_loop()
            _, exchange = await loop.create_connection(_Exchange, "127.0.0.1", self._port)
        exchange.begin()
        assert exchange.transport is not None
        exchange.transport.write(
            b"POST %s HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (PATH, len(body), body)
        )
        assert exchange.head is not None
        await exchange.head
        return exchange

    def release(self, exchange: _Exchange) -> None:
        self._idle.append(exchange)


async def cpu_per_request(call: Callable[[], Awaitable[None]], seconds: float) -> float:
    """CPU µs per request of ``call`` from :data:`CONCURRENCY` tasks for ``seconds``."""
    done = 0
    stop = time.monotonic() + seconds

    async def worker() -> None:
        nonlocal done
        while time.monotonic() < stop:
            await call()
            done += 1

    before = time.process_time()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return (time.process_time() - before) / max(done, 1) * 1e6


async def run(port: int, seconds: float) -> None:
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, limit_per_host=100, keepalive_timeout=30),
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=None),
        skip_auto_headers=SKIP_AUTO_HEADERS,
    )
    bare = BareClient(port)
    url = f"http://127.0.0.1:{port}{PATH.decode()}"
    for stream in (False, True):
        body = orjson.dumps({"model": "bench", "messages": [], "stream": stream})

        async def with_aiohttp(body: bytes = body) -> None:
            response = await session.post(
                url, data=body, headers=[("content-type", "application/json")],
                allow_redirects=False,
            )  # fmt: skip
            while await response.content.readany():
                pass
            response.release()

        async def with_bare(body: bytes = body) -> None:
            exchange = await bare.post(body)
            while await exchange.chunk():
                pass
            bare.release(exchange)

        rounds: dict[str, list[float]] = {"aiohttp": [], "bare": []}
        for _ in range(3):
            for name, call in (("aiohttp", with_aiohttp), ("bare", with_bare)):
                await cpu_per_request(call, 0.3)  # warm-up
                rounds[name].append(await cpu_per_request(call, seconds))
        for name, values in rounds.items():
            print(
                f"{'stream' if stream else 'plain':<6} {name:<8} c={CONCURRENCY}"
                f"  CPU {statistics.median(values):5.0f} µs/request"
                f"  (rounds {', '.join(f'{v:.0f}' for v in values)})",
                flush=True,
            )
    await session.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    return beside_upstream(lambda port: run(port, args.seconds))


if __name__ == "__main__":
    sys.exit(main())
