"""The controller's own CPU per acquire+release pair: the hot path (an acquire granted in
one round trip, then its release) called in process against a private redis-server, with
no NATS and no router, so what it prints is the controller's Python and its Redis link.

Run: ``.venv/bin/python bench/controller_hot_path.py [pairs]`` (default 4000).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from hotseat.launcher import start_redis
from hotseat_common.config.model import BusySignal
from hotseat_common.keys import Keys
from hotseat_common.messages import AcquireRequest, Granted
from hotseat_common.metrics import PoolMetrics
from hotseat_common.settings import RedisSettings
from hotseat_pool_controller.model import PoolPolicy
from hotseat_pool_controller.runtime.announcer import Announcer
from hotseat_pool_controller.runtime.pool import PoolRuntime
from hotseat_pool_controller.store.link import RedisLink
from hotseat_pool_controller.store.pool import PoolStore

WARM_UP = 500


class _NoDriver:
    """The hot path never reaches a driver."""

    async def aclose(self) -> None:
        return None


async def main(pairs: int) -> None:
    redis = start_redis(Path(tempfile.mkdtemp(prefix="hotseat-hot-path-")))
    try:
        link = RedisLink(RedisSettings(redis_url=redis.url))
        policy = PoolPolicy("p", ("a", "b"), 1000, 30_000, 600_000, 5_000, BusySignal.LEASES, None)
        store = PoolStore(link, Keys("bench" + uuid.uuid4().hex[:6]), policy)
        info = await link.execute("INFO", "server")
        run_id = next(
            line.split(":", 1)[1].strip()
            for line in info.splitlines()
            if line.startswith("run_id:")
        )
        state = store.keys.pool_state("p")
        await link.execute(
            "HSET", state, "phase", "idle", "resident", "a", "epoch", "3", "store", run_id
        )
        metrics = PoolMetrics(CollectorRegistry())
        nowhere: Any = None  # the hot path publishes nothing
        announcer = Announcer(nowhere, nowhere, nowhere, metrics, "c1")
        runtime = PoolRuntime(nowhere, policy, store, _NoDriver(), announcer, "c1")  # type: ignore[arg-type]
        answers = runtime.answers

        async def pair(i: int) -> None:
            request = AcquireRequest(
                pool="p", member="a", attempt=f"r-{i}", request_id=f"q{i}", router="r", hold_s=30
            )
            reply = await answers.acquire(request)
            assert isinstance(reply, Granted), reply
            await answers.release("a", reply.lease_id)

        for i in range(WARM_UP):
            await pair(i)
        for concurrency in (1, 8):
            cpu, wall = time.process_time(), time.perf_counter()
            for start in range(0, pairs, concurrency):
                await asyncio.gather(*(pair(start + j) for j in range(concurrency)))
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            print(f"{concurrency} concurrent: {cpu / pairs * 1e6:.1f} µs CPU per pair, "
                  f"{pairs / wall:.0f} pairs/s")  # fmt: skip
        await link.aclose()
    finally:
        redis.stop()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 4000))
