"""The ``http`` driver: members stay up and are loaded and unloaded by calling URLs.

Fits servers that can drop a model from the GPU without exiting: vLLM's sleep mode
(``POST /sleep?level=1``, ``POST /wake_up``) or Ollama's keep-alive (``POST /api/generate``
with ``keep_alive`` -1 or 0). docs/drivers.md has the recipes.

A member's state is read from two probes:

- its health URL (default: the fronting backend's address + ``/health``), and
- optionally a *loaded check*: a URL answering JSON and a field whose value means
  "loaded", for servers whose health answers 200 either way (a sleeping vLLM does).

It is **ready** when the health URL answers 200 and the loaded check (if any) passes. It
is **gone** when its server refuses connections, when the loaded check fails, or, without
a loaded check, when the health URL answers anything but 200. Anything else (a timeout, a
malformed answer) is unknown: never ready, never confirmed gone.

``load`` calls the load URL unless the member is ready already, then waits until it is
ready. ``unload`` calls the unload URL unless the member is gone already (without a
loaded check, a member still loading looks gone, so then only a refused connection skips
the call), then waits until it is gone. The call and the wait after it are each bounded by
``requestTimeout``.

Prompt caches (``cache.carryOver``, docs/adr/0007): a llama.cpp server started with
``--slot-save-path`` naming the member's ``cache.dir`` (as this controller sees it) has its
slots saved before the unload call and restored after the load, keyed by the identity of
``cache.modelFile``. The driver cannot see which model the remote process loaded, nor when
it started: it trusts ``cache.modelFile``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Literal

import httpx

from hotseat_common import headers
from hotseat_common.config.model import HotseatConfig, LoadedCheck, Pool
from hotseat_common.config.model import HttpDriver as HttpDriverConfig
from hotseat_common.logging import get_logger
from hotseat_pool_controller.drivers.base import (
    NOT_RUNNING,
    CacheFailure,
    CacheReport,
    DriverError,
)
from hotseat_pool_controller.drivers.model_identity import IdentityError, cache_key, file_identity
from hotseat_pool_controller.drivers.probes import fetch_idle, field_values, json_equal
from hotseat_pool_controller.drivers.slot_cache import CarriesSlotCaches, SlotCaches

__all__ = ["HttpDriver"]

log = get_logger(__name__)

POLL_INTERVAL_S = 0.05
"""How often a member is probed while the driver waits for it to be ready or gone."""


class State(StrEnum):
    READY = "ready"
    GONE = "gone"
    UNKNOWN = "unknown"
    """Neither: loading, unloading, or the probes could not tell."""


@dataclass(frozen=True)
class _Spec:
    name: str
    method: str
    load_url: str
    unload_url: str
    load_body: dict[str, object] | None
    unload_body: dict[str, object] | None
    health_url: str
    slots_url: str
    loaded_check: LoadedCheck | None
    model_file: Path | None


@dataclass(frozen=True)
class _Probe:
    state: State
    detail: str
    down: bool = False
    """The server refuses connections."""


class HttpDriver(CarriesSlotCaches):
    """Loads and unloads members by calling their URLs; see the module docstring."""

    def __init__(self, config: HotseatConfig, pool: Pool) -> None:
        if not isinstance(pool.driver, HttpDriverConfig):
            raise DriverError(f"pool {pool.name}: not an http pool")
        self._pool = pool.name
        self._timeout = pool.driver.request_timeout
        self._specs: dict[str, _Spec] = {}
        for member in pool.members:
            http = member.http
            if http is None:
                raise DriverError(f"pool {pool.name}: member {member.name} has no http block")
            backend = config.member_backend(pool.name, member.name)
            base = backend.address if backend is not None else None
            if base is None and (http.health_url is None or http.slots_url is None):
                raise DriverError(
                    f"pool {pool.name}: member {member.name} needs a backend, or both "
                    "healthUrl and slotsUrl"
                )
            self._specs[member.name] = _Spec(
                name=member.name,
                method=http.method,
                load_url=http.load_url,
                unload_url=http.unload_url,
                load_body=http.load_body,
                unload_body=http.unload_body,
                health_url=http.health_url or f"{base}/health",
                slots_url=http.slots_url or f"{base}/slots",
                loaded_check=http.loaded_check,
                model_file=(
                    Path(member.cache.model_file).expanduser()
                    if member.cache is not None and member.cache.model_file
                    else None
                ),
            )
        self._locks = {name: asyncio.Lock() for name in self._specs}
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(self._timeout, connect=min(self._timeout, 5.0)),
            limits=httpx.Limits(max_connections=32),
        )
        self._caches = SlotCaches(pool)

    # --- the ResidencyDriver interface ------------------------------------------------

    async def load(self, member: str, *, epoch: int) -> None:
        spec = self._spec(member)
        async with self._locks[member]:
            if (await self._probe(spec)).state is State.READY:
                return
            await self._call(spec, spec.load_url, spec.load_body, "load", epoch)
            await self._wait_for(spec, State.READY)

    async def unload(self, member: str, *, epoch: int) -> None:
        spec = self._spec(member)
        async with self._locks[member]:
            probe = await self._probe(spec)
            if probe.down or (spec.loaded_check is not None and probe.state is State.GONE):
                return  # the server is down, or its loaded check says the model is out
            await self._call(spec, spec.unload_url, spec.unload_body, "unload", epoch)
            await self._wait_for(spec, State.GONE)

    async def is_ready(self, member: str) -> bool:
        return (await self._probe(self._spec(member))).state is State.READY

    async def fence(self, epoch: int) -> None:
        """Nothing to record: the epoch travels with each command's header."""

    async def confirm_gone(self, member: str) -> bool:
        """Gone only on proof: the server refuses connections, or its loaded check says
        the model is not loaded. A health URL answering non-200 proves nothing (a server
        under load may answer so while it still serves)."""
        spec = self._spec(member)
        probe = await self._probe(spec)
        return probe.down or (spec.loaded_check is not None and probe.state is State.GONE)

    async def is_idle(self, member: str) -> bool:
        spec = self._spec(member)
        return await fetch_idle(self._client, member, spec.slots_url)

    async def residency(self) -> dict[str, bool]:
        """Loaded unless confirmed gone: an unknown member might hold the GPU."""
        probes = await asyncio.gather(*(self._probe(spec) for spec in self._specs.values()))
        return {
            name: probe.state is not State.GONE
            for name, probe in zip(self._specs, probes, strict=True)
        }

    async def aclose(self) -> None:
        await self._client.aclose()
        await self._caches.aclose()

    # --- prompt caches (docs/adr/0007) --------------------------------------------------

    async def _carry(self, member: str, action: Literal["save", "restore"]) -> CacheReport:
        spec = self._spec(member)
        if (await self._probe(spec)).state is not State.READY:
            return CacheReport(member, action, note=NOT_RUNNING)
        if spec.model_file is None:
            return self._caches.skipped(member, action, CacheFailure.ERROR, "no cache.modelFile")
        try:
            key = cache_key([await asyncio.to_thread(file_identity, spec.model_file)])
        except IdentityError as exc:
            return self._caches.skipped(member, action, CacheFailure.ERROR, str(exc))
        base = spec.slots_url.rsplit("/", 1)[0]
        return await self._caches.step(action, member, base, key)

    # --- internals --------------------------------------------------------------------

    def _spec(self, member: str) -> _Spec:
        try:
            return self._specs[member]
        except KeyError:
            raise DriverError(f"pool {self._pool}: no member {member!r}") from None

    async def _call(
        self, spec: _Spec, url: str, body: dict[str, object] | None, action: str, epoch: int
    ) -> None:
        started = time.monotonic()
        try:
            response = await self._client.request(
                spec.method, url, json=body, headers={headers.EPOCH: str(epoch)}
            )
        except httpx.ConnectError as exc:
            if action == "unload":
                return  # nothing listens: the server is down, and its model with it
            raise DriverError(f"{action} {spec.name}: {url}: {exc}") from exc
        except httpx.HTTPError as exc:
            raise DriverError(f"{action} {spec.name}: {url}: {type(exc).__name__}: {exc}") from exc
        if not response.is_success:
            raise DriverError(
                f"{action} {spec.name}: {spec.method} {url} answered HTTP "
                f"{response.status_code}: {response.text[:500]}"
            )
        log.info("http_member_called", pool=self._pool, member=spec.name, action=action,
                 epoch=epoch, status=response.status_code,
                 seconds=round(time.monotonic() - started, 3))  # fmt: skip

    async def _wait_for(self, spec: _Spec, wanted: State) -> None:
        deadline = time.monotonic() + self._timeout
        while True:
            probe = await self._probe(spec)
            if probe.state is wanted:
                return
            if time.monotonic() >= deadline:
                raise DriverError(
                    f"{spec.name}: not {wanted} within {self._timeout}s (requestTimeout); "
                    f"last seen: {probe.state} ({probe.detail})"
                )
            await asyncio.sleep(POLL_INTERVAL_S)

    async def _probe(self, spec: _Spec) -> _Probe:
        try:
            health = await self._client.get(spec.health_url)
        except httpx.ConnectError as exc:
            return _Probe(State.GONE, f"{spec.health_url} refuses connections: {exc}", down=True)
        except httpx.HTTPError as exc:
            return _Probe(State.UNKNOWN, f"{spec.health_url}: {type(exc).__name__}: {exc}")
        healthy = health.status_code == 200
        health_detail = f"{spec.health_url} answered {health.status_code}"
        check = spec.loaded_check
        if check is None:
            return _Probe(State.READY if healthy else State.GONE, health_detail)
        try:
            response = await self._client.get(check.url)
            response.raise_for_status()
            document = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            return _Probe(State.UNKNOWN, f"{check.url}: {type(exc).__name__}: {exc}")
        loaded = any(json_equal(v, check.equals) for v in field_values(document, check.field))
        detail = (
            f"{health_detail}; {check.url} {check.field}={'' if loaded else 'not '}{check.equals!r}"
        )
        if not loaded:
            return _Probe(State.GONE, detail)
        return _Probe(State.READY if healthy else State.UNKNOWN, detail)
