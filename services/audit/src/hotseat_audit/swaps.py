"""One swap's story from its events: who caused it, who waited for it, how long each phase
took (``GET /v1/swaps/{swap_id}``, ``hotseat audit swap ID``).

Every event of a swap carries its id: its ``swap_*`` events from the controller, and the
request event of every request that caused it or waited for it (docs/audit.md). The
report is read with one indexed query (``swap_id``), page by page, and put together here:

- **cause**: the reason of its ``swap_started`` event (``demand``, ``admin``,
  ``warm_default`` ...) and, for demand, the request that started it (the one whose
  acquire found the incumbent idle, or the one that set a busy incumbent draining); that
  request's own event when it is stored;
- **waiters**: the request events carrying the id, oldest first, each with its outcome
  and how long it took; the cause among them is marked;
- **phases**: the unloading and loading times the controller measured (on the swap's
  terminal event), and the whole swap from ``swap_started`` to its end.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel

from hotseat_audit.query import Cursor, EventFilter
from hotseat_audit.store import AuditStore
from hotseat_audit.store.base import MAX_PAGE
from hotseat_common.messages.audit import AuditEvent, PoolOutcome

ENDINGS = frozenset({
    PoolOutcome.SWAP_COMPLETED.value,
    PoolOutcome.SWAP_FAILED.value,
    PoolOutcome.SWAP_CANCELLED.value,
})  # fmt: skip
RETARGETED = PoolOutcome.SWAP_RETARGETED.value


class SwapCause(BaseModel):
    reason: str | None
    """The ``reason`` of ``swap_started``: demand, swap_back, admin, warm_default ..."""
    request_id: str | None
    """The request that started it (demand), when one did."""
    request: dict[str, Any] | None
    """That request's own event, once it is stored."""


class SwapWaiter(BaseModel):
    request_id: str | None
    outcome: str
    member: str | None
    rule: str | None
    time: datetime
    """When the request ended."""
    duration_ms: float | None
    caused: bool
    """This request started the swap."""


class SwapPhases(BaseModel):
    unload_ms: float | None
    """From ``swap_started`` until the load began (the incumbent's unload, its prompt-cache
    save included)."""
    load_ms: float | None
    """The target's load, its prompt-cache restore included, until the commit."""
    total_ms: float | None
    """From ``swap_started`` to the event that ended it."""


class SwapReport(BaseModel):
    swap_id: str
    pool: str | None
    from_member: str | None
    to_member: str | None
    outcome: str
    """``swap_completed``, ``swap_failed``, ``swap_cancelled``, or ``in_flight`` (no
    ending stored yet)."""
    started: datetime | None
    ended: datetime | None
    cause: SwapCause
    phases: SwapPhases
    waiters: list[SwapWaiter]
    events: list[dict[str, Any]]
    """The swap's own events (``swap_*``), oldest first, as published."""


async def swap_events(store: AuditStore, swap_id: str) -> list[AuditEvent]:
    """Every stored event carrying ``swap_id``, oldest first."""
    filters = EventFilter(swap_id=(swap_id,))
    found: list[AuditEvent] = []
    after: Cursor | None = None
    while True:
        page = await store.events(filters, limit=MAX_PAGE, after=after)
        found += page
        if len(page) < MAX_PAGE:
            break
        after = Cursor(page[-1].time, page[-1].id)
    found.reverse()
    return found


async def swap_report(store: AuditStore, swap_id: str) -> SwapReport | None:
    """The swap's report; ``None`` when no event carries ``swap_id``."""
    events = await swap_events(store, swap_id)
    if not events:
        return None
    own = [e for e in events if e.kind == "pool"]
    requests = [e for e in events if e.kind == "request"]
    started = next((e for e in own if e.outcome == PoolOutcome.SWAP_STARTED), None)
    ended = next((e for e in reversed(own) if e.outcome in ENDINGS), None)
    about = started or ended or events[0]
    # A swap retargeted before its load (docs/adr/0006) loads another member than it
    # started for: the last event naming a target says which.
    aimed = next(
        (e for e in reversed(own) if e.outcome in ENDINGS or e.outcome == RETARGETED), None
    )
    cause_id = started.request_id if started is not None else None
    cause_event = next((e for e in requests if cause_id and e.request_id == cause_id), None)
    total_ms = None
    if started is not None and ended is not None:
        total_ms = round((ended.time - started.time).total_seconds() * 1000, 3)
    return SwapReport(
        swap_id=swap_id,
        pool=about.pool,
        from_member=about.from_member,
        to_member=(aimed or about).to_member,
        outcome=ended.outcome if ended is not None else "in_flight",
        started=started.time if started is not None else None,
        ended=ended.time if ended is not None else None,
        cause=SwapCause(
            reason=started.reason if started is not None else None,
            request_id=cause_id,
            request=_dump(cause_event) if cause_event is not None else None,
        ),
        phases=SwapPhases(
            unload_ms=ended.unload_ms if ended is not None else None,
            load_ms=ended.load_ms if ended is not None else None,
            total_ms=total_ms,
        ),
        waiters=[
            SwapWaiter(
                request_id=e.request_id,
                outcome=e.outcome,
                member=e.member,
                rule=e.rule,
                time=e.time,
                duration_ms=e.duration_ms,
                caused=bool(cause_id) and e.request_id == cause_id,
            )
            for e in requests
        ],
        events=[_dump(e) for e in own],
    )


def _dump(event: AuditEvent) -> dict[str, Any]:
    return event.model_dump(mode="json", exclude_none=True)
