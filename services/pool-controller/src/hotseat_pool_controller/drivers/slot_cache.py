"""Saving a member's llama.cpp slots before its unload and restoring them after its load.

The server's API (``--slot-save-path DIR``)::

    GET  /slots                              [{"id", "is_processing", "n_prompt_tokens"?}]
    POST /slots/{id}?action=save    {"filename": NAME}  -> {"n_saved", "n_written", "timings"}
    POST /slots/{id}?action=restore {"filename": NAME}  -> {"n_restored", "n_read", "timings"}

501 means the server cannot (no ``--slot-save-path``; a slot holding images).

Files live in the member's own directory as ``hotseat-<key>-slot<N>.bin``, the key naming
the model they belong to (:mod:`.model_identity`). A save writes ``<name>.part`` and
renames it into place only when it saved tokens, so a failed or cut save never replaces
a good file and a restore never reads half a file. Files of another key are deleted (they
can never be restored); after each save the least recently used files are deleted until
the member's and the pool's budgets hold (:mod:`..decisions.cache_budget`).

Nothing here raises for a failed save or restore: the report says what failed, and the
swap goes on (docs/adr/0007).
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

from hotseat_common.config.model import Pool
from hotseat_common.logging import get_logger
from hotseat_common.paths import slot_dir
from hotseat_pool_controller.decisions.cache_budget import CacheFile, decide_drops
from hotseat_pool_controller.drivers.base import CacheFailure, CacheReport, SlotFailure

__all__ = ["CarriesSlotCaches", "MemberSlots", "SlotCaches", "cache_file_name"]

log = get_logger(__name__)

_FILE = re.compile(r"hotseat-(?P<key>[0-9a-f]+)-slot(?P<slot>\d+)\.bin")
PART_SUFFIX = ".part"
HTTP_TIMEOUT = httpx.Timeout(None, connect=2.0, pool=5.0)
"""A save or restore takes as long as the disk needs; the member's own timeout bounds it."""


def cache_file_name(key: str, slot: int) -> str:
    return f"hotseat-{key}-slot{slot}.bin"


@dataclass(frozen=True, slots=True)
class MemberSlots:
    """One carrying member's settings, resolved from the config."""

    member: str
    directory: Path
    max_bytes: int | None
    save_timeout: float
    restore_timeout: float


@dataclass
class _Tally:
    """What a step did so far (kept when its timeout cuts it)."""

    slots: int = 0
    tokens: int = 0
    bytes: int = 0
    failures: list[SlotFailure] = field(default_factory=list)
    dropped_stale: int = 0
    dropped_budget: int = 0
    note: str | None = None

    def fail(self, reason: CacheFailure, detail: str, slot: int | None = None) -> None:
        self.failures.append(SlotFailure(reason, detail, slot))

    def report(
        self, member: str, action: Literal["save", "restore"], seconds: float
    ) -> CacheReport:
        return CacheReport(
            member=member,
            action=action,
            slots=self.slots,
            tokens=self.tokens,
            bytes=self.bytes,
            seconds=seconds,
            failures=tuple(self.failures),
            dropped_stale=self.dropped_stale,
            dropped_budget=self.dropped_budget,
            note=self.note,
        )


class _Refused(Exception):
    def __init__(self, reason: CacheFailure, detail: str, status: int | None = None) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.status = status
        """The server's HTTP status, when it answered."""


class SlotCaches:
    """The saved slots of one pool's carrying members."""

    def __init__(self, pool: Pool) -> None:
        self._members = {
            member.name: MemberSlots(
                member=member.name,
                directory=slot_dir(pool, member),
                max_bytes=member.cache.max_bytes,
                save_timeout=member.cache.save_timeout,
                restore_timeout=member.cache.restore_timeout,
            )
            for member in pool.members
            if member.cache is not None and member.cache.carry_over
        }
        self._pool_budget = pool.cache.max_bytes
        self._budget_lock = asyncio.Lock()
        self._client = httpx.AsyncClient(
            timeout=HTTP_TIMEOUT, limits=httpx.Limits(max_connections=16), trust_env=False
        )

    def carries(self, member: str) -> bool:
        return member in self._members

    def directory(self, member: str) -> Path:
        return self._members[member].directory

    async def prepare(self, member: str) -> None:
        """Create the member's directory (``llama-server`` refuses a missing one)."""
        await asyncio.to_thread(self._members[member].directory.mkdir, parents=True, exist_ok=True)

    async def aclose(self) -> None:
        await self._client.aclose()

    # --- the two steps ----------------------------------------------------------------

    async def save(self, member: str, base_url: str, key: str) -> CacheReport:
        """Save every idle, non-empty slot of ``member`` under ``key``, then keep the budgets."""
        spec = self._members[member]
        return await self._bounded(
            spec, "save", spec.save_timeout, lambda tally: self._save(spec, base_url, key, tally)
        )

    async def restore(self, member: str, base_url: str, key: str) -> CacheReport:
        """Restore every file of ``key`` into its slot, if that slot holds nothing."""
        spec = self._members[member]
        return await self._bounded(
            spec,
            "restore",
            spec.restore_timeout,
            lambda tally: self._restore(spec, base_url, key, tally),
        )

    async def step(
        self, action: Literal["save", "restore"], member: str, base_url: str, key: str
    ) -> CacheReport:
        """:meth:`save` or :meth:`restore`."""
        if action == "save":
            return await self.save(member, base_url, key)
        return await self.restore(member, base_url, key)

    def skipped(
        self, member: str, action: Literal["save", "restore"], reason: CacheFailure, detail: str
    ) -> CacheReport:
        """A step not attempted for a reason the driver found (e.g. the model changed)."""
        return CacheReport(member, action, failures=(SlotFailure(reason, detail),))

    async def _bounded(
        self,
        spec: MemberSlots,
        action: Literal["save", "restore"],
        timeout: float,
        work: Callable[[_Tally], Coroutine[Any, Any, None]],
    ) -> CacheReport:
        tally = _Tally()
        began = time.monotonic()
        try:
            async with asyncio.timeout(timeout):
                await work(tally)
        except TimeoutError:
            tally.fail(CacheFailure.TIMEOUT, f"not done within {timeout:g}s")
        except _Refused as exc:
            tally.fail(exc.reason, exc.detail)
        except OSError as exc:
            tally.fail(CacheFailure.ERROR, f"{spec.directory}: {exc}")
        return tally.report(spec.member, action, time.monotonic() - began)

    async def _save(self, spec: MemberSlots, base_url: str, key: str, tally: _Tally) -> None:
        await asyncio.to_thread(self._tidy, spec.directory, key, tally)
        slots = await self._slots(base_url)
        if any(slot.get("is_processing") for slot in slots):
            raise _Refused(CacheFailure.BUSY, "a slot is processing: nothing saved")
        for slot in slots:
            slot_id, n_tokens = slot.get("id"), slot.get("n_prompt_tokens")
            if not isinstance(slot_id, int) or not isinstance(n_tokens, int) or n_tokens <= 0:
                continue  # empty, or untouched since its start or its restore (its file holds it)
            await self._save_slot(spec, base_url, key, slot_id, tally)
        if not tally.slots and not tally.failures:
            tally.note = "no slot holds a prompt"
        await self._keep_budgets(tally)

    async def _save_slot(
        self, spec: MemberSlots, base_url: str, key: str, slot: int, tally: _Tally
    ) -> None:
        final = spec.directory / cache_file_name(key, slot)
        part = final.with_name(final.name + PART_SUFFIX)
        try:
            answer = await self._action(base_url, slot, "save", part.name)
        except _Refused as exc:
            tally.fail(exc.reason, exc.detail, slot)
            await asyncio.to_thread(part.unlink, missing_ok=True)
            return
        saved = _count(answer, "n_saved")
        if saved <= 0:
            await asyncio.to_thread(part.unlink, missing_ok=True)
            return
        await asyncio.to_thread(os.replace, part, final)
        tally.slots += 1
        tally.tokens += saved
        tally.bytes += _count(answer, "n_written")

    async def _restore(self, spec: MemberSlots, base_url: str, key: str, tally: _Tally) -> None:
        files = await asyncio.to_thread(self._tidy, spec.directory, key, tally)
        if not files:
            tally.note = "nothing saved for this model"
            return
        slots = {s.get("id"): s for s in await self._slots(base_url)}
        for slot, path in sorted(files.items()):
            found = slots.get(slot)
            if found is None:
                tally.fail(CacheFailure.ERROR, f"the server has no slot {slot}", slot)
                continue
            if found.get("is_processing") or (found.get("n_prompt_tokens") or 0) > 0:
                continue  # never replace a cache in use
            try:
                answer = await self._action(base_url, slot, "restore", path.name)
            except _Refused as exc:
                tally.fail(exc.reason, exc.detail, slot)
                if exc.status == 400:  # the server refused the file: it would refuse it again
                    await asyncio.to_thread(path.unlink, missing_ok=True)
                continue
            await asyncio.to_thread(os.utime, path)  # used now: the budget keeps it longest
            tally.slots += 1
            tally.tokens += _count(answer, "n_restored")
            tally.bytes += _count(answer, "n_read")

    # --- the server -------------------------------------------------------------------

    async def _slots(self, base_url: str) -> list[dict[str, Any]]:
        url = f"{base_url}/slots"
        try:
            response = await self._client.get(url)
            response.raise_for_status()
            slots = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            detail = f"cannot tell whether idle from {url}: {exc}"
            raise _Refused(CacheFailure.BUSY, detail) from exc
        if not isinstance(slots, list) or not all(isinstance(s, dict) for s in slots):
            raise _Refused(CacheFailure.BUSY, f"{url} answered no list of slots")
        return slots

    async def _action(self, base_url: str, slot: int, action: str, filename: str) -> dict[str, Any]:
        url = f"{base_url}/slots/{slot}"
        try:
            response = await self._client.post(
                url, params={"action": action}, json={"filename": filename}
            )
        except httpx.HTTPError as exc:
            raise _Refused(CacheFailure.ERROR, f"{action} slot {slot}: {exc!r}") from exc
        status = response.status_code
        if status == 501:
            detail = f"{action} slot {slot}: {_message(response)}"
            raise _Refused(CacheFailure.UNSUPPORTED, detail, status)
        if not response.is_success:
            detail = f"{action} slot {slot}: HTTP {status}: {_message(response)}"
            raise _Refused(CacheFailure.ERROR, detail, status)
        try:
            answer = response.json()
        except ValueError as exc:
            raise _Refused(CacheFailure.ERROR, f"{action} slot {slot}: not JSON") from exc
        if not isinstance(answer, dict):
            raise _Refused(CacheFailure.ERROR, f"{action} slot {slot}: not a JSON object")
        return answer

    # --- the files --------------------------------------------------------------------

    def _tidy(self, directory: Path, key: str, tally: _Tally) -> dict[int, Path]:
        """Delete leftovers (``.part`` files, files of another key); the files of ``key``
        by slot. Runs in a thread."""
        files: dict[int, Path] = {}
        if not directory.is_dir():
            return files
        for path in directory.iterdir():
            if path.name.startswith("hotseat-") and path.name.endswith(PART_SUFFIX):
                path.unlink(missing_ok=True)
                continue
            match = _FILE.fullmatch(path.name)
            if match is None:
                continue
            if match["key"] == key:
                files[int(match["slot"])] = path
            else:
                path.unlink(missing_ok=True)
                tally.dropped_stale += 1
        return files

    async def _keep_budgets(self, tally: _Tally) -> None:
        async with self._budget_lock:
            tally.dropped_budget += await asyncio.to_thread(self._drop_over_budget)

    def _drop_over_budget(self) -> int:
        files: list[CacheFile] = []
        for spec in self._members.values():
            if not spec.directory.is_dir():
                continue
            for path in spec.directory.iterdir():
                if _FILE.fullmatch(path.name) is None:
                    continue
                try:
                    stat = path.stat()
                except FileNotFoundError:
                    continue
                files.append(CacheFile(spec.member, str(path), stat.st_size, stat.st_mtime))
        budgets = {spec.member: spec.max_bytes for spec in self._members.values()}
        drops = decide_drops(files, budgets, self._pool_budget)
        for drop in drops:
            Path(drop.name).unlink(missing_ok=True)
            log.info("cache_file_dropped", member=drop.member, file=drop.name, bytes=drop.size,
                     reason="budget")  # fmt: skip
        return len(drops)


class CarriesSlotCaches:
    """The :class:`~.base.CarriesCaches` methods of a driver, over its own ``_carry``
    (which finds the member's server and the key of its slots)."""

    _caches: SlotCaches

    def carries(self, member: str) -> bool:
        return self._caches.carries(member)

    async def save_caches(self, member: str) -> CacheReport:
        return await self._carry(member, "save")

    async def restore_caches(self, member: str) -> CacheReport:
        return await self._carry(member, "restore")

    async def _carry(self, member: str, action: Literal["save", "restore"]) -> CacheReport:
        raise NotImplementedError


def _count(answer: dict[str, Any], key: str) -> int:
    value = answer.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])[:300]
    return response.text[:300]
