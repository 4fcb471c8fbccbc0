"""llama.cpp's slot save, restore and erase, for the sim (``POST /slots/{id}?action=...``).

A saved slot is one JSON line (the format, the model it belongs to, the slot's tokens),
then zeros up to the size the real cache would take, ``cacheBytesPerToken`` per token,
written sparse so that a file of gigabytes costs no disk. A save or restore takes that
size over ``cacheIoBytesPerSecond``. It waits while a request runs in the slot and holds
the slot meanwhile, as llama.cpp defers the task; a request that arrives takes another
slot or waits. Answers and errors have llama.cpp's shapes: ``n_saved``/``n_written``,
``n_restored``/``n_read``, ``timings``; 501 without a save directory (llama-server
without ``--slot-save-path``), 400 for a bad slot id, file name or file.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from hotseat_sim.runtime import SimRuntime

FORMAT = "hotseat-sim-slot/1"
_FORBIDDEN = frozenset('/\\:*?"<>|')
RESTORE_FAILED = "Unable to restore slot: No available space in KV cache or invalid slot save file"


class SlotActionError(Exception):
    """Refused, with llama.cpp's status and error type."""

    def __init__(self, status: int, message: str, kind: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


def _invalid(message: str) -> SlotActionError:
    return SlotActionError(400, message, "invalid_request_error")


def check_filename(name: object) -> str:
    """The file name, if llama.cpp would accept it (no directories, no ``..``)."""
    if (
        not isinstance(name, str)
        or not name
        or len(name) > 255
        or any(c in _FORBIDDEN or ord(c) < 0x20 for c in name)
        or ".." in name
        or name[0] == " "
        or name[-1] in " ."
    ):
        raise _invalid("Invalid filename")
    return name


def _directory(sim: SimRuntime) -> Path:
    if sim.profile.slot_dir is None:
        raise SlotActionError(
            501,
            "This server does not support slots action. Start it with `--slot-save-path`",
            "not_supported_error",
        )
    return sim.profile.slot_dir


def _slot_id(sim: SimRuntime, slot_id: int) -> int:
    if not 0 <= slot_id < len(sim.slots.slots):
        raise _invalid("Invalid slot ID")
    return slot_id


def _model(sim: SimRuntime) -> str:
    return f"{sim.profile.pool}/{sim.profile.member}/{sim.profile.model}"


def _write(path: Path, header: bytes, size: int) -> None:
    with path.open("wb") as file:
        file.write(header)
        file.truncate(size)  # the rest is a hole: the size of a real cache, no disk used


def _read_header(path: Path) -> tuple[dict[str, Any], int]:
    with path.open("rb") as file:
        line = file.readline(1 << 24)
    return json.loads(line), path.stat().st_size


async def _take_time(sim: SimRuntime, size: int) -> None:
    await asyncio.sleep(size / sim.profile.sim.cache_io_bytes_per_second)


async def save(sim: SimRuntime, slot_id: int, filename: object) -> dict[str, Any]:
    path = _directory(sim) / check_filename(filename)
    async with sim.slots.reserved(_slot_id(sim, slot_id)) as slot:
        began = time.monotonic()
        tokens = list(slot.cached(sim.model.generation))
        header = json.dumps({"format": FORMAT, "model": _model(sim), "tokens": tokens}).encode()
        size = max(len(header) + 1, len(tokens) * sim.profile.sim.cache_bytes_per_token)
        try:
            await asyncio.to_thread(_write, path, header + b"\n", size)
        except OSError as exc:
            raise SlotActionError(500, f"Unable to save slot: {exc}", "server_error") from exc
        await _take_time(sim, size)
        return {
            "id_slot": slot_id,
            "filename": path.name,
            "n_saved": len(tokens),
            "n_written": size,
            "timings": {"save_ms": round((time.monotonic() - began) * 1000, 3)},
        }


async def restore(sim: SimRuntime, slot_id: int, filename: object) -> dict[str, Any]:
    path = _directory(sim) / check_filename(filename)
    async with sim.slots.reserved(_slot_id(sim, slot_id)) as slot:
        began = time.monotonic()
        try:
            header, size = await asyncio.to_thread(_read_header, path)
        except (OSError, ValueError) as exc:
            slot.cache.clear()
            raise _invalid(RESTORE_FAILED) from exc
        tokens = header.get("tokens") if isinstance(header, dict) else None
        if (
            header.get("format") != FORMAT
            or header.get("model") != _model(sim)
            or not (isinstance(tokens, list) and all(isinstance(t, str) for t in tokens))
        ):
            slot.cache.clear()
            raise _invalid(RESTORE_FAILED)
        await _take_time(sim, size)
        slot.cached(sim.model.generation)  # the cache now belongs to this load
        slot.cache[:] = tokens
        return {
            "id_slot": slot_id,
            "filename": path.name,
            "n_restored": len(tokens),
            "n_read": size,
            "timings": {"restore_ms": round((time.monotonic() - began) * 1000, 3)},
        }


async def erase(sim: SimRuntime, slot_id: int) -> dict[str, Any]:
    _directory(sim)
    async with sim.slots.reserved(_slot_id(sim, slot_id)) as slot:
        erased = len(slot.cached(sim.model.generation))
        slot.cache.clear()
        return {"id_slot": slot_id, "n_erased": erased}
