"""The writing side of the simulated GPU ledger (readers and checks: :mod:`.timeline`).

All sims of one pool share a Redis HASH of resident members (member -> GiB) and a STREAM
of events. Admitting a load is one Lua script: the sum of the other residents' GiB plus
this member's must fit the GPU, else the script records ``oom`` and refuses. Every write
of one sim goes through a single writer task, in the order the sim's state changed, so a
``serve_start`` can never land after the ``unload_start`` that ended the member's
readiness. Callers that need the outcome await it; the rest is fire-and-forget.

Every entry carries the writing process's ``boot`` id and a ``seq`` that grows by one per
entry written: a write that failed leaves a gap the oracle counts as a lost write (a
ledger that silently misses an ``unload_start`` could hide a cut request). A failed write
is also logged at error level and counted (``write_failures``, in ``/control/state``).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Self, cast

import redis.asyncio as aioredis

from hotseat_common.keys import Keys
from hotseat_common.logging import get_logger
from hotseat_sim.timeline import LedgerEvent

log = get_logger(__name__)

# KEYS: resident hash, ledger stream.
# ARGV: member, GiB, capacity ('' = unlimited), maxlen, then field/value pairs to record.
_ADMIT = """
local used = 0
local held = redis.call('HGETALL', KEYS[1])
for i = 1, #held, 2 do
  if held[i] ~= ARGV[1] then used = used + tonumber(held[i + 1]) end
end
local fields = {'member', ARGV[1], 'gib', ARGV[2], 'used', tostring(used), 'capacity', ARGV[3]}
for i = 5, #ARGV do fields[#fields + 1] = ARGV[i] end
if ARGV[3] ~= '' and used + tonumber(ARGV[2]) > tonumber(ARGV[3]) + 1e-9 then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'event', 'oom', unpack(fields))
  return {0, tostring(used)}
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'event', 'load_start', unpack(fields))
return {1, tostring(used)}
"""

# KEYS: resident hash, ledger stream.
# ARGV: member, maxlen, '1' to do nothing unless the member holds memory, then field pairs.
_RELEASE = """
local held = redis.call('HGET', KEYS[1], ARGV[1])
if not held and ARGV[3] == '1' then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
local fields = {'member', ARGV[1], 'gib', held or '0'}
for i = 4, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'event', 'unloaded', unpack(fields))
return 1
"""


_LOOK_BACK = 1000
"""Entries read back, newest first, to find one whose write timed out."""


@dataclass(frozen=True, slots=True)
class Admission:
    admitted: bool
    used_gib: float
    """GiB the other residents held when the load was decided."""


def _pairs(fields: dict[str, object]) -> list[str]:
    out: list[str] = []
    for name, value in fields.items():
        if value is not None and value != "":
            out.extend((name, str(value)))
    return out


@dataclass
class _Op:
    run: Callable[[], Awaitable[Any]]
    result: asyncio.Future[Any] | None


class Ledger:
    """One sim's writer to the ledger of its simulated GPU."""

    def __init__(
        self, redis: aioredis.Redis, keys: Keys, gpu: str, member: str, *, max_entries: int
    ) -> None:
        self.boot = uuid.uuid4().hex[:12]
        """This process's id in the ledger (a restarted sim starts a new sequence)."""
        self.write_failures = 0
        self._seq = 0
        self._redis = redis
        self._resident = keys.sim_resident(gpu)
        self._stream = keys.sim_ledger(gpu)
        self.member = member
        self._max = str(max_entries)
        self._admit = redis.register_script(_ADMIT)
        self._release = redis.register_script(_RELEASE)
        self._queue: asyncio.Queue[_Op | None] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        self._writer = asyncio.create_task(self._write_loop(), name="sim-ledger-writer")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Write what is queued, then stop the writer."""
        if self._writer is None:
            return
        self._queue.put_nowait(None)
        with contextlib.suppress(asyncio.CancelledError):
            await self._writer
        self._writer = None

    async def _landed(self) -> dict[str, str] | None:
        """The next entry's fields if it is in the ledger (called by the writer only).

        A command whose reply did not come within the client's timeout may still have run:
        this process was frozen or starved after sending it, and on waking its timer fired
        before it read the reply. The entry's ``boot`` and ``seq`` tell whether it landed;
        only one that did not is a failed write.
        """
        seq = str(self._seq + 1)
        with contextlib.suppress(aioredis.RedisError):
            newest: list[tuple[str, dict[str, str]]] = cast(
                "Any", await self._redis.xrevrange(self._stream, count=_LOOK_BACK)
            )
            for _id, fields in newest:
                if fields.get("boot") == self.boot and fields.get("seq") == seq:
                    return fields
        return None

    def _stamp(self) -> list[str]:
        """The identity fields of the next entry (called by the writer only)."""
        return ["boot", self.boot, "seq", str(self._seq + 1)]

    async def _write_loop(self) -> None:
        while (op := await self._queue.get()) is not None:
            try:
                value = await op.run()
            except Exception as exc:
                # The entry may be missing from the ledger: its sequence number is spent,
                # so the gap shows (the oracle counts it), and the failure is loud here.
                self._seq += 1
                self.write_failures += 1
                log.error(  # noqa: TRY400 - the error text is the point, not a traceback
                    "sim_ledger_write_failed",
                    member=self.member,
                    seq=self._seq,
                    error=str(exc) or type(exc).__name__,
                )
                if op.result is not None and not op.result.done():
                    op.result.set_exception(exc)
            else:
                if op.result is not None and not op.result.done():
                    op.result.set_result(value)

    def _submit(self, run: Callable[[], Awaitable[Any]]) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Op(run, future))
        return future

    def post(self, event: LedgerEvent, **fields: object) -> None:
        """Append ``event`` for this member after everything queued before it."""
        values = {"event": event.value, "member": self.member, **fields}
        pairs = _pairs(values)

        async def run() -> None:
            stamped = [*pairs, *self._stamp()]
            mapping: dict[Any, Any] = dict(zip(stamped[::2], stamped[1::2], strict=True))
            try:
                await self._redis.xadd(
                    self._stream, mapping, maxlen=int(self._max), approximate=True
                )
            except aioredis.TimeoutError:
                if await self._landed() is None:
                    raise
            self._seq += 1

        self._queue.put_nowait(_Op(run, None))

    async def admit(self, gib: float, capacity: float | None, **fields: object) -> Admission:
        """Reserve ``gib`` if it fits ``capacity`` (``load_start``), else record ``oom``."""

        async def run() -> Admission:
            args = [self.member, repr(gib), "" if capacity is None else repr(capacity), self._max]
            try:
                ok, used = await self._admit(
                    keys=[self._resident, self._stream],
                    args=[*args, *_pairs(fields), *self._stamp()],
                )
            except aioredis.TimeoutError:
                if (entry := await self._landed()) is None:
                    raise
                ok, used = entry["event"] == LedgerEvent.LOAD_START.value, entry["used"]
            self._seq += 1  # both answers (load_start or oom) wrote an entry
            return Admission(bool(int(ok)), float(used))

        result: Admission = await asyncio.shield(self._submit(run))
        return result

    async def release(self, *, only_if_held: bool = False, **fields: object) -> bool:
        """Free this member's memory and record ``unloaded``; True when something was freed."""

        async def run() -> bool:
            args = [
                self.member,
                self._max,
                "1" if only_if_held else "0",
                *_pairs(fields),
                *self._stamp(),
            ]
            try:
                wrote = bool(
                    int(await self._release(keys=[self._resident, self._stream], args=args))
                )
            except aioredis.TimeoutError:
                if await self._landed() is None:
                    raise
                wrote = True
            if wrote:
                self._seq += 1
            return wrote

        result: bool = await asyncio.shield(self._submit(run))
        return result
