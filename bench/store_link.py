"""The controller's Redis link against redis-py, on the call the hot path makes.

For 1, 8 and 64 concurrent callers on one uvloop event loop, runs a small script
(``ZADD`` plus a two-element reply, the shape of a grant) through

- redis-py's ``Script`` object (what the controller used before ``RedisLink``),
- redis-py ``execute_command("EVALSHA", ...)`` (the same without the script wrapper),
- :class:`hotseat_pool_controller.store.link.RedisLink` (one pipelined connection),

and prints calls per second and this process's CPU per call. A private redis-server on
loopback; nothing is left running. ``docs/adr/0004-activation-hot-path.md`` quotes a run.

Run: ``.venv/bin/python bench/store_link.py [--calls N]``
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import redis.asyncio as aioredis
import uvloop

from hotseat.launcher import start_redis
from hotseat_common.settings import RedisSettings
from hotseat_pool_controller.store.link import LuaScript, RedisLink

SOURCE = "redis.call('ZADD', KEYS[1], 1, ARGV[1]) return {1, 2}"

Call = Callable[[str], Awaitable[object]]


async def measure(call: Call, concurrency: int, calls: int) -> tuple[float, float]:
    """Calls per second and CPU seconds per call."""

    async def worker(count: int, offset: int) -> None:
        for i in range(count):
            await call(f"m{offset + i}")

    per_worker = calls // concurrency
    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker(per_worker, w * per_worker) for w in range(concurrency)))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    done = per_worker * concurrency
    return done / wall, cpu / done


async def run(url: str, calls: int) -> None:
    client: aioredis.Redis = aioredis.from_url(url, decode_responses=True)
    script = client.register_script(SOURCE)
    link = RedisLink(RedisSettings(redis_url=url))
    lua = LuaScript(SOURCE)
    sha = await client.script_load(SOURCE)
    clients: dict[str, Call] = {
        "redis-py Script": lambda m: script(keys=["k"], args=[m]),
        "redis-py EVALSHA": lambda m: client.execute_command("EVALSHA", sha, 1, "k", m),
        "RedisLink": lambda m: link.script(lua, ["k"], [m]),
    }
    print(f"{'client':<18} {'callers':>7} {'calls/s':>9} {'CPU/call':>10}")
    try:
        for concurrency in (1, 8, 64):
            for name, call in clients.items():
                await measure(call, concurrency, calls // 10)  # warm-up
                rate, cpu = await measure(call, concurrency, calls)
                print(f"{name:<18} {concurrency:>7} {rate:>9.0f} {cpu * 1e6:>7.1f} µs")
    finally:
        await link.aclose()
        await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000, help="calls per measurement")
    args = parser.parse_args()
    server = start_redis(Path(tempfile.mkdtemp(prefix="hotseat-link-bench-")))
    try:
        uvloop.run(run(server.url, args.calls))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
