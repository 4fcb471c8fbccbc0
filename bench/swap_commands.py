"""Redis work per swap, counted: the controller's round trips (by script) and the
commands Redis ran (``INFO commandstats``, those inside scripts one by one) for one
held request's whole way through a swap, with nothing else on the store.

In process, against a private redis-server: the controller's real pool runtime (acquire
answers, transitions, the swap runner) with an instant residency driver and no
supervisor; the swap's heartbeat is due far later than the swap ends, so the counts are
the same at every run. One sample: a request for the member not resident asks (and
waits; the swap starts), the swap runs to its commit, the request asks again (granted)
and releases its lease. The state-change notifications are counted, not published, and
timed: from the commit's reply read (the apply script returning) to the notification
handed to the announcer, on one otherwise idle event loop.

Run: ``.venv/bin/python bench/swap_commands.py [swaps]`` (default 20).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from hotseat.launcher import start_redis
from hotseat_common.config.model import BusySignal, PoolActivation
from hotseat_common.keys import Keys
from hotseat_common.messages import AcquireRequest, Granted
from hotseat_common.metrics import PoolMetrics
from hotseat_common.settings import RedisSettings
from hotseat_pool_controller.model import AuditIntent, PoolPolicy, PoolSnapshot
from hotseat_pool_controller.runtime.announcer import Announcer
from hotseat_pool_controller.runtime.pool import PoolRuntime
from hotseat_pool_controller.store import scripts
from hotseat_pool_controller.store.link import LuaScript, RedisLink
from hotseat_pool_controller.store.pool import PoolStore

MEMBERS = ("a", "b")
SCRIPTS = ("SNAPSHOT", "APPLY", "RENEW", "RELEASE", "CANCEL", "REAP", "GRANT_FAST")


class InstantDriver:
    """Loads and unloads at once; every member idle."""

    def __init__(self) -> None:
        self.loaded = {"a"}

    async def load(self, member: str, *, epoch: int) -> None:
        self.loaded.add(member)

    async def unload(self, member: str, *, epoch: int) -> None:
        self.loaded.discard(member)

    async def is_ready(self, member: str) -> bool:
        return member in self.loaded

    async def is_idle(self, member: str) -> bool:
        return True

    async def confirm_gone(self, member: str) -> bool:
        return member not in self.loaded

    async def fence(self, epoch: int) -> None:
        return None

    async def residency(self) -> dict[str, bool]:
        return {m: m in self.loaded for m in MEMBERS}

    async def aclose(self) -> None:
        return None


class CountingAnnouncer(Announcer):
    """Counts and times the state-change notifications; publishes nothing, audits
    nothing."""

    notifications = 0
    committed = 0.0
    """When the last commit's reply was read (``time.perf_counter``)."""
    delays: list[float] = []  # noqa: RUF012 - one announcer per run

    async def state_changed(self, pool: str, snap: PoolSnapshot, reason: str) -> None:
        CountingAnnouncer.notifications += 1
        CountingAnnouncer.delays.append(time.perf_counter() - CountingAnnouncer.committed)

    def audit(self, pool: str, intent: AuditIntent) -> None:
        return None


async def commandstats(link: RedisLink) -> Counter[str]:
    text = await link.execute("INFO", "commandstats")
    if isinstance(text, bytes):
        text = text.decode()
    calls: Counter[str] = Counter()
    for line in text.splitlines():
        if line.startswith("cmdstat_"):
            name, _, fields = line.removeprefix("cmdstat_").partition(":")
            calls[name] = int(dict(f.split("=") for f in fields.split(","))["calls"])
    return calls


async def main(swaps: int) -> None:
    redis = start_redis(Path(tempfile.mkdtemp(prefix="hotseat-swap-commands-")))
    try:
        link = RedisLink(RedisSettings(redis_url=redis.url))
        policy = PoolPolicy(
            "p", MEMBERS, 1000, 30_000, 600_000, 5_000, BusySignal.LEASES, None,
            heartbeat_ttl_ms=600_000,
        )  # fmt: skip
        store = PoolStore(link, Keys("bench" + uuid.uuid4().hex[:6]), policy)
        info = await link.execute("INFO", "server")
        if isinstance(info, bytes):
            info = info.decode()
        run_id = next(
            line.split(":", 1)[1].strip()
            for line in info.splitlines()
            if line.startswith("run_id:")
        )
        await link.execute(
            "HSET", store.keys.pool_state("p"), "phase", "idle", "resident", "a", "epoch", "3",
            "store", run_id,
        )  # fmt: skip
        nowhere: Any = None
        announcer = CountingAnnouncer(
            nowhere, nowhere, nowhere, PoolMetrics(CollectorRegistry()), "c1"
        )
        runtime = PoolRuntime(nowhere, policy, store, InstantDriver(), announcer, "c1")  # type: ignore[arg-type]
        answers = runtime.answers

        names = {LuaScript(getattr(scripts, n)).sha: n.lower() for n in SCRIPTS}
        trips: Counter[str] = Counter()
        script = link.script

        async def counted(lua: LuaScript, *args: Any, **kwargs: Any) -> Any:
            name = names.get(lua.sha, "other")
            trips[name] += 1
            result = await script(lua, *args, **kwargs)
            if name == "apply":
                CountingAnnouncer.committed = time.perf_counter()
            return result

        link.script = counted  # type: ignore[method-assign]

        async def one_swap(i: int, member: str) -> None:
            request = AcquireRequest(
                pool="p", member=member, mode=PoolActivation.WAIT, attempt=f"held-{i}",
                request_id=f"q{i}", router="r", hold_s=30,
            )  # fmt: skip
            first = await answers.acquire(request)
            assert not isinstance(first, Granted), first
            while runtime.swaps.tasks:
                await asyncio.wait(runtime.swaps.tasks)
            granted = await answers.acquire(request)
            assert isinstance(granted, Granted), granted
            await answers.release(member, granted.lease_id)

        await one_swap(0, "b")  # warm-up: every script loaded
        trips.clear()
        notified = CountingAnnouncer.notifications
        CountingAnnouncer.delays.clear()
        before = await commandstats(link)
        for i in range(1, swaps + 1):
            await one_swap(i, "a" if i % 2 else "b")
        after = await commandstats(link)
        link.script = script  # type: ignore[method-assign]
        ran = after - before
        del ran["info"]  # the counts' own reads
        print(f"per swap, over {swaps} swaps (ask, swap to the commit, ask again, release):")
        print(f"  round trips {sum(trips.values()) / swaps:.2f}: "
              + ", ".join(f"{k} {v / swaps:.2f}" for k, v in sorted(trips.items())))  # fmt: skip
        print(f"  Redis commands {sum(ran.values()) / swaps:.2f}: "
              + ", ".join(f"{k} {v / swaps:.2f}" for k, v in sorted(ran.items())))  # fmt: skip
        notifications = CountingAnnouncer.notifications - notified
        print(f"  state-change notifications {notifications / swaps:.2f}")
        delays = sorted(CountingAnnouncer.delays)
        print(f"  commit's reply -> its notification: p50 {delays[len(delays) // 2] * 1e3:.3f} ms,"
              f" max {delays[-1] * 1e3:.3f} ms ({len(delays)})")  # fmt: skip
        await link.aclose()
    finally:
        redis.stop()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 20))
