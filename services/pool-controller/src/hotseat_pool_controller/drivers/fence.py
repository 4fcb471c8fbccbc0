"""A host-local epoch fence: the highest swap epoch that acted on a pool's members here.

Every start and stop a ``process`` driver issues passes through the fence of its pool
(``<dataDir>/<pool>/fence``): under an exclusive ``flock`` it reads the highest epoch
recorded so far, refuses a command of an older epoch (a swap owner that was frozen past
its heartbeat, thawed after another replica took the pool over) and records its own
before the command is issued. The lock is held only for the check, the record and the
issuing (a signal, a spawn), never while a process starts up or shuts down, so controllers
on one host never wait on each other for long.

This fences every controller that shares the data directory on one host; controllers on
other hosts cannot drive local processes anyway (docs/drivers.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

from hotseat_pool_controller.drivers.base import DriverError, Fenced

LOCK_TIMEOUT_S = 10.0
LOCK_RETRY_S = 0.005


class EpochFence:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.highest_seen = 0
        """The highest epoch this process recorded (what a shutdown may still act under)."""

    def _read(self, fd: int) -> int:
        os.lseek(fd, 0, os.SEEK_SET)
        raw = os.read(fd, 4096)
        if not raw.strip():
            return 0
        try:
            return int(json.loads(raw)["epoch"])
        except (ValueError, KeyError, TypeError):
            return 0  # a torn or foreign file: the next record repairs it

    def _write(self, fd: int, epoch: int) -> None:
        data = json.dumps({"epoch": epoch}).encode()
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, data)
        os.fsync(fd)

    async def _lock(self) -> int:
        """The fence file, exclusively locked (non-blocking tries: a timeout leaves no
        thread behind that could take the lock later and never give it back)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            async with asyncio.timeout(LOCK_TIMEOUT_S):
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        await asyncio.sleep(LOCK_RETRY_S)
                    else:
                        return fd
        except BaseException:
            os.close(fd)
            raise

    @contextlib.asynccontextmanager
    async def hold(self, epoch: int | None, action: str) -> AsyncIterator[None]:
        """Check and record ``epoch`` (``None``: act under the highest this process has
        recorded, e.g. at shutdown), then run the block that issues the command."""
        try:
            fd = await self._lock()
        except (OSError, TimeoutError) as exc:
            raise DriverError(f"{action}: cannot lock the epoch fence {self.path}: {exc}") from exc
        try:
            recorded = self._read(fd)
            mine = self.highest_seen if epoch is None else epoch
            if recorded > mine:
                raise Fenced(
                    f"{action}: refused, epoch {mine} is older than epoch {recorded} that "
                    "already acted on this pool (this controller lost the swap)"
                )
            if mine > recorded:
                self._write(fd, mine)
            self.highest_seen = max(self.highest_seen, mine)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
