"""What happened on a stack, told for a failure message, so that one failure is enough
to diagnose a fault test that fails once in many runs::

    async with explained(stack):       # a failed assertion inside tells the story
        ...
        assert result.clean, result

What it tells, one line per fact, oldest first: the oracle's verdict over the sims'
ledger (every cut named with the unload that made it), the ledger itself, the audit trail
(pool transitions and request outcomes), each sim's state now, and whether each
controller, router and sim still runs, with the events it logged (the log files stay in
the test's directory: keep them with ``--basetemp``). A part that cannot be read says why
instead: the story is told after a failure, whatever state the stack is in.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import httpx
import orjson

from hotseat_sim.timeline import LedgerEntry

if TYPE_CHECKING:
    from tests.support.stack import Stack

LEDGER_LINES = 80
AUDIT_LINES = 80
LOG_LINES = 60

_QUIET_LOGGERS = frozenset({"uvicorn.error", "uvicorn.access"})
_REPEATED = frozenset({"supervisor_store_unreachable", "store_unreachable"})
"""Events logged at every tick or request while a store is down: counted, not listed."""
_LOG_SKIP = frozenset({"event", "level", "logger", "timestamp", "service", "instance"})
_AUDIT_FIELDS = (
    "member",
    "from_member",
    "to_member",
    "epoch",
    "reason",
    "request_id",
    "backend",
    "status",
    "swap_id",
    "controller",
    "router",
)


async def what_happened(stack: Stack, gpu: str = "gpu0") -> str:
    """The verdict, the ledger, the audit trail and the logged events of ``stack``."""
    parts = [
        await _view("verdict", lambda: _verdict(stack, gpu)),
        await _view("ledger", lambda: _ledger(stack, gpu)),
        await _view("audit", lambda: _audit(stack)),
        await _view("sims", lambda: _sims(stack)),
        _logs(stack),
    ]
    return "\n".join(parts)


async def _view(name: str, read: Callable[[], Awaitable[str]]) -> str:
    try:
        return await read()
    except Exception as exc:  # a story told after a failure never fails itself
        return f"== {name}: unreadable ({type(exc).__name__}: {exc})"


async def _verdict(stack: Stack, gpu: str) -> str:
    verdict = await stack.verdict(gpu)
    lines = [f"== verdict of {gpu}: {'ok' if verdict.ok else 'VIOLATED'} {verdict.summary()}"]
    lines += [f"  cut: {_entry(c.request)} by {_entry(c.by)} ({c.cause})" for c in verdict.cut]
    lines += [f"  unloaded while serving: {_entry(e)}" for e in verdict.unloaded_while_serving]
    lines += [
        f"  overlap: {o.second} loaded while {o.first} held the GPU: {_entry(o.at)}"
        for o in verdict.overlaps
    ]
    for name in ("oom", "served_while_not_resident", "refused", "over_capacity"):
        lines.extend(f"  {name}: {_entry(e)}" for e in getattr(verdict, name))
    return "\n".join(lines)


async def _ledger(stack: Stack, gpu: str) -> str:
    entries = await stack.ledger(gpu)
    shown = entries[-LEDGER_LINES:]
    head = f"== ledger of {gpu} ({len(entries)} entries, last {len(shown)})"
    return "\n".join([head, *(f"  {_entry(e)}" for e in shown)])


def _entry(entry: LedgerEntry) -> str:
    fields = " ".join(
        f"{k}={v}" for k, v in entry.fields.items() if k not in {"boot", "seq", "gpu"}
    )
    when = datetime.fromtimestamp(entry.time, UTC).isoformat(timespec="milliseconds")
    return f"{when} {entry.member} {entry.event.value} {fields}".rstrip()


async def _audit(stack: Stack) -> str:
    events = await stack.audit()
    shown = events[-AUDIT_LINES:]
    lines = [f"== audit ({len(events)} events, last {len(shown)}; buffered ones not yet in)"]
    for event in shown:
        about = " ".join(f"{k}={event[k]}" for k in _AUDIT_FIELDS if event.get(k) not in {None, ""})
        lines.append(f"  {event.get('time')} {event.get('kind')} {event.get('outcome')} {about}")
    return "\n".join(lines)


async def _sims(stack: Stack) -> str:
    """Each running sim's own state now (``/control/state``: phase, epoch, in flight)."""
    lines = ["== sims now"]
    async with httpx.AsyncClient(timeout=5) as client:
        for name, sim in stack.sims.items():
            if not sim.alive():
                lines.append(f"  {name}: not running (exit {sim.popen.returncode})")
                continue
            try:
                state = (await client.get(f"{sim.url}/control/state")).json()
            except httpx.HTTPError as exc:
                lines.append(f"  {name}: no answer ({type(exc).__name__})")
                continue
            lines.append(f"  {name}: {state}")
    return "\n".join(lines)


def _logs(stack: Stack) -> str:
    """Whether each controller, router and sim still runs (an exit code otherwise: a
    negative one is the signal that ended it), and the events it logged (not its HTTP
    server's chatter; the events a store outage repeats at every tick are counted)."""
    lines = ["== processes and their logged events"]
    for proc in [*stack.controllers.values(), *stack.routers, *stack.sims.values()]:
        events, repeated = _log_events(proc.log_text().splitlines())
        shown = events[-LOG_LINES:]
        state = "running" if proc.alive() else f"exited {proc.popen.returncode}"
        counts = ", ".join(f"{name} x{n}" for name, n in sorted(repeated.items()))
        lines.append(
            f"-- {proc.name}, {state} ({len(events)} events, last {len(shown)}"
            f"{'; ' + counts if counts else ''})"
        )
        lines.extend(f"  {line}" for line in shown)
    return "\n".join(lines)


def _log_events(raw: Iterable[str]) -> tuple[list[str], Counter[str]]:
    events: list[str] = []
    repeated: Counter[str] = Counter()
    for line in raw:
        try:
            record: dict[str, Any] = orjson.loads(line)
        except orjson.JSONDecodeError:
            events.append(line)
            continue
        if record.get("logger") in _QUIET_LOGGERS:
            continue
        name = str(record.get("event"))
        if name in _REPEATED:
            repeated[name] += 1
            continue
        about = " ".join(f"{k}={_short(v)}" for k, v in record.items() if k not in _LOG_SKIP)
        events.append(f"{record.get('timestamp')} {record.get('level')} {name} {about}".rstrip())
    return events, repeated


def _short(value: object, limit: int = 160) -> str:
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "..."


@asynccontextmanager
async def explained(stack: Stack, gpu: str = "gpu0") -> AsyncIterator[None]:
    """A failed assertion inside the block carries :func:`what_happened` in its message."""
    try:
        yield
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{await what_happened(stack, gpu)}") from exc
