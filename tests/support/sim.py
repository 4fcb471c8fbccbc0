"""Run a Hotseat sim backend inside the test's event loop, on a real port.

Usable by any test that needs a simulated inference server::

    config = sim_pool_config({"a": {"memoryGiB": 6}, "b": {"memoryGiB": 20}}, gpu_gib=24)
    async with run_sim(config, "a", redis_url=redis_server.url, key_prefix=prefix) as sim:
        await sim.load(epoch=1)
        await sim.wait_for_state("ready")
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn
from openai import AsyncOpenAI

from hotseat.launcher import free_port
from hotseat_common.config import HotseatConfig, parse_config
from hotseat_common.keys import Keys
from hotseat_sim.app import create_app
from hotseat_sim.profile import resolve_profile
from hotseat_sim.settings import SimSettings
from hotseat_sim.timeline import LedgerEntry, read_timeline

FAST_SIM = {"loadSeconds": 0.1, "unloadSeconds": 0.05, "tokensPerSecond": 200, "slots": 2}


def sim_pool_config(
    members: Mapping[str, Mapping[str, Any]],
    *,
    pool: str = "gpu0",
    gpu_gib: float = 24,
    ports: Mapping[str, int] | None = None,
    unpooled: Mapping[str, int] | None = None,
    default: str | None = None,
) -> HotseatConfig:
    """One pool of sim members (fast timings unless overridden), each behind a backend of
    the same name at ``127.0.0.1:<port>``, plus optional unpooled backends."""
    ports = dict(ports or {})
    backends: list[dict[str, Any]] = [
        {
            "name": name,
            "address": f"http://127.0.0.1:{ports.get(name) or free_port()}",
            "pool": {"name": pool, "member": name},
        }
        for name in members
    ]
    backends += [
        {"name": name, "address": f"http://127.0.0.1:{port}"}
        for name, port in (unpooled or {}).items()
    ]
    pool_section: dict[str, Any] = {
        "name": pool,
        "driver": {"kind": "sim", "gpuMemoryGiB": gpu_gib},
        "members": [{"name": n, "sim": {**FAST_SIM, **sim}} for n, sim in members.items()],
    }
    if default is not None:
        pool_section["default"] = default
    first = next(iter(members))
    return parse_config(
        {
            "backends": backends,
            "pools": [pool_section],
            "rules": [{"name": "all", "match": {"models": ["*"]}, "route": {"backends": [first]}}],
        }
    )


@dataclass
class SimHandle:
    url: str
    member: str
    http: httpx.AsyncClient
    server: uvicorn.Server
    task: asyncio.Task[None]

    def openai(self) -> AsyncOpenAI:
        """A real OpenAI SDK client pointed at this sim (no retries)."""
        return AsyncOpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0)

    async def state(self) -> dict[str, Any]:
        response = await self.http.get("/control/state")
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body

    async def load(self, epoch: int | None = None) -> httpx.Response:
        return await self.http.post("/control/load", json={} if epoch is None else {"epoch": epoch})

    async def unload(self, epoch: int | None = None) -> httpx.Response:
        return await self.http.post(
            "/control/unload", json={} if epoch is None else {"epoch": epoch}
        )

    async def wait_for_state(self, *states: str, timeout: float = 20.0) -> dict[str, Any]:
        """Until the model is in one of ``states``: the long poll ``/control/state?until=``
        answers at the transition; fail if ``timeout`` passes first."""
        response = await self.http.get(
            "/control/state",
            params={"until": ",".join(states), "timeout": timeout},
            timeout=timeout + 10,
        )
        response.raise_for_status()
        state: dict[str, Any] = response.json()
        if state["state"] not in states:
            raise AssertionError(f"{self.member} stayed {state} instead of {states}")
        return state

    async def stop(self) -> None:
        if not self.task.done():
            self.server.should_exit = True
            await asyncio.wait_for(self.task, 15)


@asynccontextmanager
async def run_sim(
    config: HotseatConfig,
    backend: str,
    *,
    redis_url: str,
    key_prefix: str,
    loaded: bool = False,
    port: int | None = None,
) -> AsyncIterator[SimHandle]:
    """Serve ``backend`` of ``config`` in this event loop; ``port`` defaults to the
    backend's address port."""
    profile = resolve_profile(config, backend)
    address = config.backend(backend)
    assert address is not None
    port = port or int(address.address.rsplit(":", 1)[1])
    settings = SimSettings(
        host="127.0.0.1",
        port=port,
        redis_url=redis_url,
        key_prefix=key_prefix,
        loaded=loaded,
        backend=backend,
        shutdown_grace=2,
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings, profile),
            http="httptools",
            ws="none",
            lifespan="on",
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=2,
        )
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError(f"sim {backend} exited during start-up")
        await asyncio.sleep(0.01)  # uvicorn's Server offers a flag, no event, for started
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        handle = SimHandle(url, profile.member, http, server, task)
        try:
            yield handle
        finally:
            await handle.stop()
            sock.close()


async def wait_for_timeline(
    redis: Any,
    keys: Keys,
    gpu: str,
    predicate: Callable[[list[LedgerEntry]], bool],
    *,
    timeout: float = 20.0,
) -> list[LedgerEntry]:
    """The ledger of ``gpu`` once ``predicate`` holds (sims append asynchronously): each
    miss blocks on the ledger stream (``XREAD BLOCK``) until its next entry arrives."""
    stream = keys.sim_ledger(gpu)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        newest = await redis.xrevrange(stream, count=1)
        last_id = newest[0][0] if newest else "0-0"
        timeline = await read_timeline(redis, keys, gpu)
        if predicate(timeline):
            return timeline
        left = deadline - loop.time()
        if left <= 0:
            events = [(e.event.value, e.member, dict(e.fields)) for e in timeline]
            raise AssertionError(f"ledger of {gpu} never matched: {events}")
        # Entries after last_id wake this at once, including any read_timeline just saw.
        await redis.xread({stream: last_id}, count=1, block=max(1, int(min(left, 1.0) * 1000)))
