"""The web console at ``/ui`` and the live pool stream it reads (docs/console.md).

The page is three static files shipped in this package (no CDN, nothing to build). It
reads ``GET /v1/pool-updates`` (server-sent events of every pool's view), and, when the
controller knows the audit service (``HOTSEAT_AUDIT_URL``), ``/ui/api/timeline/{pool}``
and ``/ui/api/outcomes``, which this controller builds from the audit API. It changes
nothing by itself: a forced swap or unload is a ``POST /v1/pools/...`` with the admin
token the user types, answered by the admin API like any other.
"""

from __future__ import annotations

import asyncio
from asyncio import Task
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, HTTPException, Query
from fastapi.responses import FileResponse, RedirectResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from pydantic import BaseModel

from hotseat_common.messages import POOL_UPDATES_PATH, PoolList
from hotseat_common.service import when_shutdown_begins
from hotseat_common.subjects import Subjects
from hotseat_pool_controller.console.audit import AuditReader, AuditUnavailable
from hotseat_pool_controller.console.feed import PoolFeed
from hotseat_pool_controller.console.timeline import TIMELINE_OUTCOMES, Timeline, build_timeline
from hotseat_pool_controller.runtime.answers import PoolAnswers
from hotseat_pool_controller.runtime.placement import GroupPlacer

__all__ = ["Console", "serve_console"]

STATIC = Path(__file__).parent / "static"
UI_PATH = "/ui"
RETRY_MS = 2000
"""How soon a browser reconnects a dropped stream (the SSE ``retry:`` field)."""
NO_AUDIT = "the controller does not know the audit service: set HOTSEAT_AUDIT_URL"
Minutes = Annotated[int, Query(ge=1, le=24 * 60, description="The window, in minutes")]


class ConsolePool(BaseModel):
    name: str
    members: list[str]


class ConsoleInfo(BaseModel):
    pools: list[ConsolePool]
    audit: bool
    """The controller knows the audit service: the timeline and outcomes can be shown."""
    admin: bool
    """Admin actions are enabled (an admin token is configured); each still needs it."""


class RuleOutcomes(BaseModel):
    rule: str | None
    """``None``: requests no rule matched."""
    total: int
    by_outcome: dict[str, int]


class Outcomes(BaseModel):
    since: datetime
    until: datetime
    rules: list[RuleOutcomes]
    audit_error: str | None = None


def _window(minutes: int) -> tuple[datetime, datetime]:
    until = datetime.now(UTC)
    return until - timedelta(minutes=minutes), until


def serve_console(
    app: FastAPI,
    pools: Mapping[str, PoolAnswers],
    feed: PoolFeed,
    audit: AuditReader | None,
    *,
    admin: bool,
) -> None:
    """Mount ``/ui``, its assets, its API and ``GET /v1/pool-updates`` on ``app``."""
    app.mount(f"{UI_PATH}/assets", StaticFiles(directory=STATIC), name="console-assets")
    router = APIRouter(tags=["console"])

    @router.get(UI_PATH, include_in_schema=False)
    async def console_page() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    @router.get(f"{UI_PATH}/", include_in_schema=False)
    async def console_slash() -> RedirectResponse:
        return RedirectResponse(UI_PATH)

    @router.get(
        POOL_UPDATES_PATH,
        response_class=StreamingResponse,
        responses={200: {"content": {"text/event-stream": {}}}},
    )
    async def pool_updates() -> StreamingResponse:
        """Server-sent events: ``event: pools`` with a ``PoolList`` at once and on every
        change (a pool's announcement, or a read every second while anyone watches),
        ``event: unavailable`` while the pools cannot be read."""

        return StreamingResponse(
            _sse(feed),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @router.get(f"{UI_PATH}/api/info")
    async def console_info() -> ConsoleInfo:
        return ConsoleInfo(
            pools=[
                ConsolePool(name=p.name, members=list(p.policy.members)) for p in pools.values()
            ],
            audit=audit is not None,
            admin=admin,
        )

    @router.get(f"{UI_PATH}/api/timeline/{{name}}")
    async def console_timeline(name: str, minutes: Minutes = 60) -> Timeline:
        """The pool's residency and swaps over the last ``minutes``, from the audit events."""
        pool = pools.get(name)
        if pool is None:
            raise HTTPException(404, f"no pool {name!r}")
        return await timeline_of(pool, audit, minutes)

    @router.get(f"{UI_PATH}/api/outcomes")
    async def console_outcomes(minutes: Minutes = 60) -> Outcomes:
        """Request outcomes per rule over the last ``minutes`` (the audit summary)."""
        return await outcomes_of(audit, minutes)

    app.include_router(router)


async def _sse(feed: PoolFeed) -> AsyncIterator[str]:
    yield f"retry: {RETRY_MS}\n\n"
    async for item in feed.watch():
        if item is None:
            yield ": keep-alive\n\n"
        else:
            event, body = item
            yield f"event: {event}\ndata: {body}\n\n"


class Console:
    """The console's parts: the live feed of the pools and the audit reader (when the
    audit URL is set)."""

    def __init__(
        self,
        pools: Mapping[str, PoolAnswers],
        *,
        interval: float,
        audit_url: str | None,
        groups: Mapping[str, GroupPlacer] | None = None,
    ) -> None:
        self.pools = pools
        self.groups: Mapping[str, GroupPlacer] = groups if groups is not None else {}
        self.feed = PoolFeed(lambda: read_pools(pools, self.groups), interval=interval)
        self.audit = AuditReader(audit_url) if audit_url else None

    def mount(self, app: FastAPI, *, admin: bool) -> None:
        serve_console(app, self.pools, self.feed, self.audit, admin=admin)
        when_shutdown_begins(app, self.feed.close)

    async def start(self, nc: NatsClient, subjects: Subjects, stack: AsyncExitStack) -> Task[None]:
        """Follow the pool announcements (any replica's) and run the feed; the task runs
        until cancelled."""

        async def changed(_msg: Msg) -> None:
            self.feed.changed()

        await nc.subscribe(subjects.pool_events_all, cb=changed)
        if self.audit is not None:
            stack.push_async_callback(self.audit.aclose)
        return asyncio.create_task(self.feed.run(), name="pool-feed")


async def timeline_of(pool: PoolAnswers, audit: AuditReader | None, minutes: int) -> Timeline:
    view = await pool.view()
    since, until = _window(minutes)
    if audit is None:
        empty = build_timeline(view, [], [], since=since, until=until)
        return empty.model_copy(update={"audit_error": NO_AUDIT})
    try:
        swaps, more_swaps = await audit.events(
            [("kind", "pool"), ("pool", pool.name), *(("outcome", o) for o in TIMELINE_OUTCOMES)],
            since=since,
            until=until,
        )
        requests, more_requests = await _swap_requests(audit, pool.name, swaps, since, until)
    except AuditUnavailable as exc:
        empty = build_timeline(view, [], [], since=since, until=until)
        return empty.model_copy(update={"audit_error": str(exc)})
    return build_timeline(
        view, swaps, requests, since=since, until=until, truncated=more_swaps or more_requests
    )


SWAP_IDS_PER_QUERY = 50


async def _swap_requests(
    audit: AuditReader,
    pool: str,
    swaps: list[dict[str, Any]],
    since: datetime,
    until: datetime,
) -> tuple[list[dict[str, Any]], bool]:
    """The request events of the window's swaps: those carrying their swap ids (one
    indexed query per 50 swaps), and, only when some swap event has no id (written before
    swap ids), every request event of the pool in the window for the time-based match."""
    ids = sorted({str(e["swap_id"]) for e in swaps if e.get("swap_id")})
    requests: list[dict[str, Any]] = []
    truncated = False
    for start in range(0, len(ids), SWAP_IDS_PER_QUERY):
        chunk = ids[start : start + SWAP_IDS_PER_QUERY]
        found, more = await audit.events(
            [("kind", "request"), ("pool", pool), *(("swap_id", i) for i in chunk)],
            since=since,
            until=until,
        )
        requests.extend(found)
        truncated = truncated or more
    if any(e.get("swap_id") is None and e.get("outcome") != "resident_lost" for e in swaps):
        found, more = await audit.events(
            [("kind", "request"), ("pool", pool)], since=since, until=until
        )
        requests.extend(e for e in found if not e.get("swap_id"))
        truncated = truncated or more
    return requests, truncated


async def outcomes_of(audit: AuditReader | None, minutes: int) -> Outcomes:
    since, until = _window(minutes)
    if audit is None:
        return Outcomes(since=since, until=until, rules=[], audit_error=NO_AUDIT)
    try:
        summary = await audit.summary(since=since, until=until)
    except AuditUnavailable as exc:
        return Outcomes(since=since, until=until, rules=[], audit_error=str(exc))
    rules = [RuleOutcomes.model_validate(r) for r in summary.get("by_rule", [])]
    return Outcomes(since=since, until=until, rules=rules)


async def read_pools(
    pools: Mapping[str, PoolAnswers], groups: Mapping[str, GroupPlacer] | None = None
) -> PoolList:
    """Every pool's view, and every model group's (docs/adr/0012)."""
    return PoolList(
        pools=[await p.view() for p in pools.values()],
        groups=[await g.view() for g in (groups or {}).values()],
    )
