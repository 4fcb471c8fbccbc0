"""The ``sim`` driver: drives Hotseat's sim backends through their control API.

Prompt caches (``cache.carryOver``): a sim serves llama.cpp's slot save and restore in
the member's slot directory (the same config tells both sides where); the key of its
saved slots names the member, its model and, when ``cache.modelFile`` is set, that
file's identity (docs/adr/0007)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Literal

import httpx

from hotseat_common.config.model import HotseatConfig, Pool
from hotseat_pool_controller.drivers.base import (
    NOT_RUNNING,
    CacheFailure,
    CacheReport,
    DriverError,
)
from hotseat_pool_controller.drivers.model_identity import IdentityError, cache_key, file_identity
from hotseat_pool_controller.drivers.slot_cache import CarriesSlotCaches, SlotCaches

LONG_POLL_S = 10.0
HTTP_TIMEOUT = httpx.Timeout(5.0, connect=2.0)
CONNECT_GRACE_S = 10.0
CONNECT_RETRY_S = 0.2
LOADED_STATES = frozenset({"ready", "loading", "unloading"})
GONE = "gone"
"""What :meth:`SimDriver._observed` reports when nothing listens at a sim's address."""


class SimDriver(CarriesSlotCaches):
    def __init__(self, config: HotseatConfig, pool: Pool) -> None:
        self._addresses: dict[str, str] = {}
        self._identities: dict[str, tuple[str, Path | None]] = {}
        for member in pool.members:
            backend = config.member_backend(pool.name, member.name)
            if backend is not None:
                self._addresses[member.name] = backend.address
                model_file = member.cache.model_file if member.cache is not None else None
                self._identities[member.name] = (
                    f"{pool.name}/{member.name}/{backend.model or backend.name}",
                    Path(model_file).expanduser() if model_file else None,
                )
        self._client = httpx.AsyncClient(
            timeout=HTTP_TIMEOUT, limits=httpx.Limits(max_connections=32)
        )
        self._caches = SlotCaches(pool)

    def _url(self, member: str, path: str) -> str:
        try:
            return self._addresses[member] + path
        except KeyError:
            raise DriverError(f"member {member!r} has no backend address") from None

    async def _state(self, member: str) -> dict[str, object]:
        response = await self._client.get(self._url(member, "/control/state"))
        response.raise_for_status()
        state: dict[str, object] = response.json()
        return state

    async def _command(self, member: str, action: str, epoch: int) -> None:
        try:
            response = await self._client.post(
                self._url(member, f"/control/{action}"), json={"epoch": epoch}
            )
        except httpx.HTTPError as exc:
            raise DriverError(f"{action} {member}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            raise DriverError(f"{action} {member}: HTTP {response.status_code} {response.text}")

    async def _wait_for(self, member: str, wanted: str, *, failed_ok: bool) -> None:
        """Long-poll the sim's state until it is ``wanted`` (no fixed polling interval)."""
        until = f"{wanted},failed"
        while True:
            try:
                response = await self._client.get(
                    self._url(member, "/control/state"),
                    params={"until": until, "timeout": LONG_POLL_S},
                    timeout=httpx.Timeout(LONG_POLL_S + 5, connect=2.0),
                )
                response.raise_for_status()
                state = response.json()
            except httpx.HTTPError as exc:
                raise DriverError(f"{member}: state unavailable: {exc}") from exc
            current = state.get("state")
            if current == wanted or (failed_ok and current == "failed"):
                return
            if current == "failed":
                raise DriverError(f"{member}: load failed: {state.get('error')}")

    async def load(self, member: str, *, epoch: int) -> None:
        # A server that is restarting (crashed, rescheduled) is given a moment to listen.
        deadline = asyncio.get_running_loop().time() + CONNECT_GRACE_S
        while True:
            try:
                await self._command(member, "load", epoch)
                break
            except DriverError as exc:
                if not isinstance(exc.__cause__, httpx.ConnectError):
                    raise
                if asyncio.get_running_loop().time() >= deadline:
                    raise
                await asyncio.sleep(CONNECT_RETRY_S)
        await self._wait_for(member, "ready", failed_ok=False)

    async def unload(self, member: str, *, epoch: int) -> None:
        try:
            await self._command(member, "unload", epoch)
        except DriverError as exc:
            if isinstance(exc.__cause__, httpx.ConnectError):
                return  # nothing listens there: the sim process is gone, and its model with it
            raise
        await self._wait_for(member, "unloaded", failed_ok=True)

    async def is_ready(self, member: str) -> bool:
        try:
            response = await self._client.get(self._url(member, "/health"))
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def fence(self, epoch: int) -> None:
        for member in self._addresses:
            try:
                await self._command(member, "fence", epoch)
            except DriverError:
                continue  # a sim that is down obeys nobody; one that is stalled catches up

    async def confirm_gone(self, member: str) -> bool:
        """Gone when nothing listens at its address (the process exited) or the sim reports
        its model unloaded or failed; a sim that does not answer (stalled) is not gone."""
        state = await self._observed(member)
        return state in {GONE, "unloaded", "failed"}

    async def _observed(self, member: str) -> str | None:
        """The sim's state (``/control/state``), :data:`GONE` when nothing listens at its
        address, ``None`` when it does not answer (stalled, or slow under load)."""
        try:
            state = await self._state(member)
        except httpx.ConnectError:
            return GONE
        except httpx.HTTPError:
            return None
        return str(state.get("state"))

    async def is_idle(self, member: str) -> bool:
        try:
            response = await self._client.get(self._url(member, "/slots"))
            response.raise_for_status()
            slots = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise DriverError(f"{member}: /slots unavailable: {exc}") from exc
        return not any(slot.get("is_processing") for slot in slots)

    async def residency(self) -> dict[str, bool]:
        """Loaded unless confirmed gone: a sim that does not answer may hold the GPU, and
        serve under its streams; the rebuild makes it the resident, unhealthy, never takes
        it for gone on that alone (docs/adr/0005)."""
        states = await asyncio.gather(*(self._observed(m) for m in self._addresses))
        return {
            member: state is None or state in LOADED_STATES
            for member, state in zip(self._addresses, states, strict=True)
        }

    async def aclose(self) -> None:
        await self._client.aclose()
        await self._caches.aclose()

    # --- prompt caches (docs/adr/0007) --------------------------------------------------

    def carries(self, member: str) -> bool:
        return self._caches.carries(member) and member in self._addresses

    async def _carry(self, member: str, action: Literal["save", "restore"]) -> CacheReport:
        try:
            ready = (await self._state(member)).get("state") == "ready"
        except httpx.HTTPError:
            ready = False
        if not ready:
            return CacheReport(member, action, note=NOT_RUNNING)
        name, model_file = self._identities[member]
        parts = [name]
        if model_file is not None:
            try:
                parts.append(await asyncio.to_thread(file_identity, model_file))
            except IdentityError as exc:
                return self._caches.skipped(member, action, CacheFailure.ERROR, str(exc))
        key = cache_key(parts)
        return await self._caches.step(action, member, self._addresses[member], key)
