"""Which async HTTP client the router should use upstream: httpx or aiohttp, measured.

Each client POSTs a chat completion to the fast Node upstream and reads the whole body,
from N concurrent tasks on one uvloop event loop pinned to core 0 (the upstream runs on
core 1). Prints requests/s and p50/p99 per client, non-streaming and streaming.

    .venv/bin/python bench/client_choice.py [--seconds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson
import uvloop

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from hotseat.launcher import free_port  # noqa: E402

Call = Callable[[], Awaitable[None]]


async def drive(call: Call, concurrency: int, seconds: float) -> tuple[float, float, float]:
    latencies: list[float] = []
    stop = time.monotonic() + seconds

    async def worker() -> None:
        while time.monotonic() < stop:
            started = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - started)

    began = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.monotonic() - began
    quantiles = statistics.quantiles(latencies, n=100)
    return len(latencies) / elapsed, quantiles[49] * 1000, quantiles[98] * 1000


async def run(url: str, seconds: float) -> None:
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
    hx = httpx.AsyncClient(timeout=30, limits=limits)
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, limit_per_host=1000),
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
    )
    for stream in (False, True):
        body = orjson.dumps({"model": "bench", "messages": [], "stream": stream})
        headers = {"content-type": "application/json"}

        async def with_httpx(body: bytes = body, headers: dict[str, str] = headers) -> None:
            async with hx.stream("POST", url, content=body, headers=headers) as response:
                async for _ in response.aiter_raw():
                    pass

        async def with_aiohttp(body: bytes = body, headers: dict[str, str] = headers) -> None:
            async with session.post(url, data=body, headers=headers) as response:
                while await response.content.readany():
                    pass

        for name, call in (("httpx", with_httpx), ("aiohttp", with_aiohttp)):
            await drive(call, 8, 0.5)
            for concurrency in (1, 64):
                rps, p50, p99 = await drive(call, concurrency, seconds)
                mode = "stream" if stream else "plain"
                print(
                    f"{name:<8} {mode:<6} c={concurrency:<3} {rps:8.0f} req/s"
                    f"  p50 {p50:6.2f} ms  p99 {p99:6.2f} ms",
                    flush=True,
                )
    await hx.aclose()
    await session.close()


def beside_upstream(run: Callable[[int], Coroutine[Any, Any, None]]) -> int:
    """Start the fast Node upstream on core 1, pin this process to core 0 and run
    ``run(port)`` on uvloop."""
    port = free_port()
    node = subprocess.Popen(
        ["taskset", "-c", "1", "node", str(ROOT / "bench" / "fast_upstream.js"), str(port)],
        stdout=subprocess.PIPE,
    )
    try:
        if node.stdout is None or b"ready" not in node.stdout.readline():
            return 1
        os.sched_setaffinity(0, {0})
        uvloop.run(run(port))
    finally:
        node.terminate()
        node.wait(5)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    return beside_upstream(
        lambda port: run(f"http://127.0.0.1:{port}/v1/chat/completions", args.seconds)
    )


if __name__ == "__main__":
    sys.exit(main())
