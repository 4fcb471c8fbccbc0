"""The ``http`` driver against real HTTP servers standing in for vLLM and Ollama."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from hotseat.launcher import free_port
from hotseat_common import headers
from hotseat_common.config.model import HotseatConfig, Pool
from hotseat_pool_controller.drivers import DriverError, build_driver
from hotseat_pool_controller.drivers.http import HttpDriver


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    body: Any


@dataclass
class Recorder:
    calls: list[Call] = field(default_factory=list)
    epochs: list[str | None] = field(default_factory=list)
    """The x-hotseat-epoch header of each command (everything but probes)."""

    async def record(self, request: web.Request) -> Any:
        raw = await request.read()
        body = json.loads(raw) if raw else None
        self.calls.append(Call(request.method, request.path_qs, body))
        if request.method != "GET":
            self.epochs.append(request.headers.get(headers.EPOCH))
        return body

    def commands(self) -> list[Call]:
        """The calls that change state (everything but probes)."""
        return [c for c in self.calls if c.method != "GET"]


class FakeVllm(Recorder):
    """vLLM's sleep-mode endpoints: /sleep?level=N, /wake_up, /is_sleeping, /health."""

    def __init__(self, *, sleeping: bool = True, wake_delay: float = 0.0) -> None:
        super().__init__()
        self.sleeping = sleeping
        self.wake_delay = wake_delay
        self.slots_busy = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def sleep(self, request: web.Request) -> web.Response:  # vLLM's POST /sleep, no wait
        await self.record(request)
        self.sleeping = True
        return web.Response()

    async def wake_up(self, request: web.Request) -> web.Response:
        await self.record(request)
        if self.wake_delay <= 0:
            self.sleeping = False
        else:
            task = asyncio.create_task(self._wake_later())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return web.Response()

    async def _wake_later(self) -> None:
        await asyncio.sleep(self.wake_delay)  # a model slow to wake: the behaviour scripted
        self.sleeping = False

    async def is_sleeping(self, request: web.Request) -> web.Response:
        await self.record(request)
        return web.json_response({"is_sleeping": self.sleeping})

    async def health(self, request: web.Request) -> web.Response:
        await self.record(request)
        return web.Response()  # a sleeping vLLM is healthy too

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/sleep", self.sleep),
            web.post("/wake_up", self.wake_up),
            web.get("/is_sleeping", self.is_sleeping),
            web.get("/health", self.health),
        ]

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class FakeOllama(Recorder):
    """Ollama's keep-alive loading: /api/generate without a prompt, /api/ps, /api/version."""

    def __init__(self) -> None:
        super().__init__()
        self.loaded: list[str] = []

    async def generate(self, request: web.Request) -> web.Response:
        body = await self.record(request)
        name = body["model"] if ":" in body["model"] else body["model"] + ":latest"
        if body.get("keep_alive") == 0:
            self.loaded = [m for m in self.loaded if m != name]
            return web.json_response(
                {"model": body["model"], "done": True, "done_reason": "unload"}
            )
        if name not in self.loaded:
            self.loaded.append(name)
        return web.json_response({"model": body["model"], "done": True, "done_reason": "load"})

    async def ps(self, request: web.Request) -> web.Response:
        await self.record(request)
        return web.json_response({"models": [{"name": m, "model": m} for m in self.loaded]})

    async def version(self, request: web.Request) -> web.Response:
        await self.record(request)
        return web.json_response({"version": "0.0.0"})

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/api/generate", self.generate),
            web.get("/api/ps", self.ps),
            web.get("/api/version", self.version),
        ]


class FakeGeneric(Recorder):
    """A server with no loaded check: /health is 503 until loaded; /slots like llama.cpp."""

    def __init__(self) -> None:
        super().__init__()
        self.loaded = False
        self.busy = False
        self.fail_load = False

    async def load(self, request: web.Request) -> web.Response:
        await self.record(request)
        if self.fail_load:
            return web.Response(status=500, text="CUDA out of memory")
        self.loaded = True
        return web.Response()

    async def unload(self, request: web.Request) -> web.Response:
        await self.record(request)
        self.loaded = False
        return web.Response()

    async def health(self, request: web.Request) -> web.Response:
        await self.record(request)
        return web.Response(status=200 if self.loaded else 503)

    async def slots(self, request: web.Request) -> web.Response:
        await self.record(request)
        return web.json_response([{"id": 0, "is_processing": self.busy}, {"id": 1, "state": 0}])

    def routes(self) -> list[web.RouteDef]:
        return [
            web.put("/admin/load", self.load),
            web.put("/admin/unload", self.unload),
            web.get("/health", self.health),
            web.get("/slots", self.slots),
        ]


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Any], Any]]:
    """Start a fake server on a free port; returns its base URL."""
    runners: list[web.AppRunner] = []
    fakes: list[Any] = []

    async def start(fake: Any) -> str:
        app = web.Application()
        app.add_routes(fake.routes())
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        fakes.append(fake)
        return f"http://127.0.0.1:{port}"

    yield start
    for fake in fakes:
        if isinstance(fake, FakeVllm):
            await fake.close()
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def drivers() -> AsyncIterator[list[HttpDriver]]:
    made: list[HttpDriver] = []
    yield made
    for driver in made:
        await driver.aclose()


def make_driver(
    made: list[HttpDriver],
    members: dict[str, tuple[str, dict[str, Any]]],
    *,
    request_timeout: float = 5.0,
) -> HttpDriver:
    """A driver for pool gpu0 whose members are ``name -> (backend address, http block)``."""
    config = HotseatConfig.model_validate(
        {
            "backends": [
                {"name": name, "address": address, "pool": {"name": "gpu0", "member": name}}
                for name, (address, _) in members.items()
            ],
            "pools": [
                {
                    "name": "gpu0",
                    "driver": {"kind": "http", "requestTimeout": request_timeout},
                    "members": [
                        {"name": name, "http": block} for name, (_, block) in members.items()
                    ],
                }
            ],
        }
    )
    pool = config.pool("gpu0")
    assert isinstance(pool, Pool)
    driver = build_driver(config, pool)
    assert isinstance(driver, HttpDriver)
    made.append(driver)
    return driver


def vllm_block(base: str) -> dict[str, Any]:
    """The documented vLLM recipe."""
    return {
        "loadUrl": f"{base}/wake_up",
        "unloadUrl": f"{base}/sleep?level=1",
        "loadedCheck": {"url": f"{base}/is_sleeping", "field": "is_sleeping", "equals": False},
    }


async def test_vllm_recipe_makes_exactly_the_documented_calls(serve, drivers):
    """load is one POST /wake_up, unload one POST /sleep?level=1, both without a body."""
    vllm = FakeVllm(sleeping=True)
    base = await serve(vllm)
    driver = make_driver(drivers, {"coder": (base, vllm_block(base))})
    assert not await driver.is_ready("coder")
    assert await driver.residency() == {"coder": False}
    await driver.load("coder", epoch=1)
    assert vllm.commands() == [Call("POST", "/wake_up", None)]
    assert not vllm.sleeping
    assert await driver.is_ready("coder")
    assert await driver.residency() == {"coder": True}
    await driver.unload("coder", epoch=2)
    assert vllm.commands() == [Call("POST", "/wake_up", None), Call("POST", "/sleep?level=1", None)]
    assert vllm.sleeping
    assert not await driver.is_ready("coder")
    probed = {c.path for c in vllm.calls if c.method == "GET"}
    assert probed == {"/health", "/is_sleeping"}
    assert vllm.epochs == ["1", "2"], "every command carries its swap's epoch"


async def test_load_returns_only_once_the_loaded_check_passes(serve, drivers):
    """A wake-up that takes effect later holds load until /is_sleeping says false."""
    vllm = FakeVllm(sleeping=True, wake_delay=0.5)
    base = await serve(vllm)
    driver = make_driver(drivers, {"coder": (base, vllm_block(base))})
    started = time.monotonic()
    await driver.load("coder", epoch=1)
    assert time.monotonic() - started >= 0.5
    assert not vllm.sleeping


async def test_calls_are_skipped_when_the_member_is_there_already(serve, drivers):
    """Loading an awake member or unloading a sleeping one makes no call at all."""
    vllm = FakeVllm(sleeping=False)
    base = await serve(vllm)
    driver = make_driver(drivers, {"coder": (base, vllm_block(base))})
    await driver.load("coder", epoch=1)
    assert vllm.commands() == []
    await driver.unload("coder", epoch=2)
    await driver.unload("coder", epoch=3)
    assert vllm.commands() == [Call("POST", "/sleep?level=1", None)]


async def test_ollama_recipe_swaps_two_models_on_one_server(serve, drivers):
    """Ollama members load with keep_alive -1 and unload with keep_alive 0, checked in /api/ps."""
    ollama = FakeOllama()
    base = await serve(ollama)

    def block(model: str) -> dict[str, Any]:
        return {
            "loadUrl": f"{base}/api/generate",
            "unloadUrl": f"{base}/api/generate",
            "loadBody": {"model": model, "keep_alive": -1},
            "unloadBody": {"model": model, "keep_alive": 0},
            "healthUrl": f"{base}/api/version",
            "loadedCheck": {"url": f"{base}/api/ps", "field": "models[].name", "equals": model},
        }

    driver = make_driver(
        drivers,
        {
            "small": (base, block("qwen2.5:3b")),
            "coder": (base, block("qwen2.5-coder:14b")),
        },
    )
    await driver.load("small", epoch=1)
    assert ollama.loaded == ["qwen2.5:3b"]
    assert await driver.residency() == {"small": True, "coder": False}
    await driver.unload("small", epoch=2)
    await driver.load("coder", epoch=2)
    assert ollama.loaded == ["qwen2.5-coder:14b"]
    assert ollama.commands() == [
        Call("POST", "/api/generate", {"model": "qwen2.5:3b", "keep_alive": -1}),
        Call("POST", "/api/generate", {"model": "qwen2.5:3b", "keep_alive": 0}),
        Call("POST", "/api/generate", {"model": "qwen2.5-coder:14b", "keep_alive": -1}),
    ]
    assert await driver.is_ready("coder")
    assert not await driver.is_ready("small")


async def test_generic_server_without_a_loaded_check_is_judged_by_health(serve, drivers):
    """Without a loaded check, health 200 means loaded; method and JSON bodies are sent as set."""
    fake = FakeGeneric()
    base = await serve(fake)
    block = {
        "loadUrl": f"{base}/admin/load",
        "unloadUrl": f"{base}/admin/unload",
        "method": "PUT",
        "loadBody": {"model": "m", "epochless": True},
        "unloadBody": {"model": "m"},
    }
    driver = make_driver(drivers, {"m": (base, block)})
    assert not await driver.is_ready("m")
    await driver.load("m", epoch=1)
    assert await driver.is_ready("m")
    await driver.unload("m", epoch=2)
    assert not await driver.is_ready("m")
    assert fake.commands() == [
        Call("PUT", "/admin/load", {"model": "m", "epochless": True}),
        Call("PUT", "/admin/unload", {"model": "m"}),
    ]


async def test_failed_load_call_is_a_driver_error_with_the_answer(serve, drivers):
    """A load URL that answers 500 fails the load with its status and body."""
    fake = FakeGeneric()
    fake.fail_load = True
    base = await serve(fake)
    block = {"loadUrl": f"{base}/admin/load", "unloadUrl": f"{base}/admin/unload", "method": "PUT"}
    driver = make_driver(drivers, {"m": (base, block)})
    with pytest.raises(DriverError, match=r"answered HTTP 500: CUDA out of memory"):
        await driver.load("m", epoch=1)


async def test_load_not_ready_within_the_request_timeout_fails(serve, drivers):
    """A member that never wakes fails the load after requestTimeout, naming what it saw."""
    # A wake of an hour: only the request timeout can end the load within the test.
    vllm = FakeVllm(sleeping=True, wake_delay=3600)
    base = await serve(vllm)
    driver = make_driver(drivers, {"coder": (base, vllm_block(base))}, request_timeout=0.5)
    with pytest.raises(DriverError, match=r"not ready within 0.5s .*is_sleeping=not False"):
        await driver.load("coder", epoch=1)


async def test_a_server_that_is_down_counts_as_unloaded(drivers):
    """Nothing listening: unload succeeds (nothing holds the GPU), load fails clearly."""
    base = f"http://127.0.0.1:{free_port()}"
    driver = make_driver(drivers, {"coder": (base, vllm_block(base))})
    await driver.unload("coder", epoch=1)
    assert await driver.residency() == {"coder": False}
    with pytest.raises(DriverError, match="load coder"):
        await driver.load("coder", epoch=1)


async def test_an_unreadable_loaded_check_is_unknown_never_gone(serve, drivers):
    """A loaded check that errors keeps the member counted as loaded and not ready."""
    vllm = FakeVllm(sleeping=False)
    base = await serve(vllm)
    block = vllm_block(base)
    block["loadedCheck"] = {"url": f"{base}/missing", "field": "is_sleeping", "equals": False}
    driver = make_driver(drivers, {"coder": (base, block)}, request_timeout=0.3)
    assert await driver.residency() == {"coder": True}
    assert not await driver.is_ready("coder")
    with pytest.raises(DriverError, match=r"not gone within 0\.3s"):
        await driver.unload("coder", epoch=1)


async def test_is_idle_reads_slots_and_fails_closed(serve, drivers):
    """is_idle follows /slots (both llama.cpp shapes) and raises where there is no /slots."""
    fake = FakeGeneric()
    fake_base = await serve(fake)
    vllm = FakeVllm()
    vllm_base = await serve(vllm)
    generic = {"loadUrl": f"{fake_base}/admin/load", "unloadUrl": f"{fake_base}/admin/unload"}
    driver = make_driver(
        drivers, {"m": (fake_base, generic), "coder": (vllm_base, vllm_block(vllm_base))}
    )
    assert await driver.is_idle("m")
    fake.busy = True
    assert not await driver.is_idle("m")
    with pytest.raises(DriverError, match="cannot tell whether idle"):
        await driver.is_idle("coder")
