"""The query API: ``GET /v1/events``, ``GET /v1/swaps/{swap_id}``, ``GET /v1/summary`` and
``GET /v1/dead-letters``.

Errors have one body shape, ``{"error": {"code", "message", "fields"?}}``: 422 for a
parameter that does not validate (every bad field listed), 400 for a cursor that is not
valid for the filters it came with (or was not signed with this deployment's cursor
key), 503 when the store cannot answer. Every value a store would refuse (a date-time
outside years 1..9999 once in UTC, an id beyond 64 bits, NUL in text) is refused here
first, the same on both stores.
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, cast

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, BeforeValidator

from hotseat_audit.query import (
    EARLIEST,
    KINDS,
    OUTCOMES,
    Cursor,
    EventFilter,
    InvalidCursor,
    OutOfRange,
    Summary,
    as_utc,
)
from hotseat_audit.store import AuditStore, StoreError
from hotseat_audit.store.base import MAX_PAGE
from hotseat_audit.swaps import SwapReport, swap_report
from hotseat_common.errors import ErrorCode

DEFAULT_PAGE = 100
MAX_ID = 2**63 - 1
"""The largest dead-letter id either store can hold (a signed 64-bit integer)."""
DEFAULT_SUMMARY_WINDOW = timedelta(hours=24)


class ApiError(Exception):
    """An error answered with ``status`` and the common error body."""

    def __init__(
        self, status: int, code: ErrorCode, message: str, fields: list[dict[str, str]] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.fields = fields

    def response(self) -> JSONResponse:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.fields is not None:
            body["fields"] = self.fields
        return JSONResponse({"error": body}, status_code=self.status)


def invalid(fields: list[dict[str, str]]) -> ApiError:
    message = "; ".join(f"{f['field']}: {f['message']}" for f in fields)
    return ApiError(422, ErrorCode.INVALID_PARAMETER, message, fields)


def install_error_handlers(app: FastAPI) -> None:
    async def on_api_error(_request: Request, exc: Exception) -> JSONResponse:
        return cast("ApiError", exc).response()

    async def on_validation_error(_request: Request, exc: Exception) -> JSONResponse:
        errors = cast("RequestValidationError", exc).errors()
        fields = [
            {
                "field": ".".join(str(p) for p in err["loc"] if p not in {"query", "body"}),
                "message": str(err["msg"]),
            }
            for err in errors
        ]
        return invalid(fields).response()

    async def on_store_error(_request: Request, exc: Exception) -> JSONResponse:
        return ApiError(503, ErrorCode.STORE_UNAVAILABLE, str(exc)).response()

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StoreError, on_store_error)


def get_store(request: Request) -> AuditStore:
    """The store the lifespan opened."""
    return cast("AuditStore", request.state.store)


StoreDep = Annotated[AuditStore, Depends(get_store)]
Values = Annotated[list[str] | None, Query()]


def _enum_items(allowed: frozenset[str]) -> dict[str, Any]:
    """Documents a repeatable filter's allowed values as an enum."""
    return {"items": {"type": "string", "enum": sorted(allowed)}}


Outcomes = Annotated[list[str] | None, Query(json_schema_extra=_enum_items(OUTCOMES))]
Kinds = Annotated[list[str] | None, Query(json_schema_extra=_enum_items(KINDS))]
MAX_UNIX_S = 253402300799
"""9999-12-31T23:59:59Z, the last second a date-time can name."""


def _unix_seconds(value: object) -> object:
    """A number is Unix time in seconds (never milliseconds); anything else goes on to be
    parsed as an RFC 3339 date-time."""
    if not isinstance(value, str):
        return value
    try:
        seconds = float(value)
    except ValueError:
        return value
    if not 0 <= seconds <= MAX_UNIX_S:
        raise ValueError(f"Unix time must be between 0 and {MAX_UNIX_S} seconds")
    return datetime.fromtimestamp(seconds, UTC)


Time = Annotated[
    datetime | None,
    BeforeValidator(_unix_seconds),
    Query(
        description="RFC 3339 date-time, or Unix time in seconds",
        json_schema_extra={
            "anyOf": [
                {"type": "string", "format": "date-time"},
                {"type": "number", "minimum": 0, "maximum": MAX_UNIX_S},
                {"type": "null"},
            ]
        },
    ),
]


class EventsPage(BaseModel):
    events: list[dict[str, Any]]
    """Events, newest first, as published (fields that do not apply are left out)."""
    next: str | None
    """Pass as ``cursor`` with the same filters for the next page; null on the last one."""


class PoolMemberSummary(BaseModel):
    pool: str
    member: str | None
    total: int
    by_outcome: dict[str, int]


class RuleSummary(BaseModel):
    rule: str | None
    """``null``: requests that no rule matched."""
    total: int
    by_outcome: dict[str, int]


class SummaryBody(BaseModel):
    since: datetime
    until: datetime
    total: int
    by_outcome: dict[str, int]
    by_kind: dict[str, int]
    by_pool: list[PoolMemberSummary]
    by_rule: list[RuleSummary] = []
    """Request events by rule, busiest first."""

    @classmethod
    def of(cls, summary: Summary) -> SummaryBody:
        pools = sorted(summary.by_pool.values(), key=lambda p: (p.pool, p.member or ""))
        return cls(
            since=summary.since,
            until=summary.until,
            total=summary.total,
            by_outcome=dict(summary.by_outcome.most_common()),
            by_kind=dict(summary.by_kind),
            by_pool=[
                PoolMemberSummary(
                    pool=p.pool,
                    member=p.member,
                    total=p.total,
                    by_outcome=dict(p.by_outcome.most_common()),
                )
                for p in pools
            ],
            by_rule=[
                RuleSummary(rule=r.rule, total=r.total, by_outcome=dict(r.by_outcome.most_common()))
                for r in sorted(summary.by_rule.values(), key=lambda r: (-r.total, r.rule or ""))
            ],
        )


class DeadLetterBody(BaseModel):
    id: int
    stream: str
    stream_seq: int
    subject: str
    published: datetime | None
    received_at: datetime
    reason: str
    detail: str
    payload: str
    """The raw message, base64."""
    payload_text: str | None
    """The raw message as text, when it is valid UTF-8."""


class DeadLettersPage(BaseModel):
    dead_letters: list[DeadLetterBody]
    next: int | None
    """Pass as ``before`` for older dead letters; null on the last page."""


def _utc(name: str, moment: datetime | None) -> datetime | None:
    if moment is None:
        return None
    try:
        return as_utc(moment)
    except OutOfRange as exc:
        raise invalid([{"field": name, "message": str(exc)}]) from exc


def _window(since: datetime | None, until: datetime | None) -> tuple[datetime | None, ...]:
    since_utc = _utc("since", since)
    until_utc = _utc("until", until)
    if since_utc is not None and until_utc is not None and since_utc >= until_utc:
        raise invalid([{"field": "until", "message": "must be later than since"}])
    return since_utc, until_utc


def _check_choices(name: str, values: list[str] | None, allowed: frozenset[str]) -> None:
    bad = [v for v in values or () if v not in allowed]
    if bad:
        choices = ", ".join(sorted(allowed))
        raise invalid([{"field": name, "message": f"{bad[0]!r} is not one of {choices}"}])


def _check_text(filters: dict[str, list[str] | None]) -> None:
    """No filter value may hold NUL: PostgreSQL text cannot hold one (such a query failed
    there), so it is refused on every store alike and a query answers the same on both."""
    for name, values in filters.items():
        if any("\x00" in v for v in values or ()):
            raise invalid([{"field": name, "message": "must not contain NUL (\\x00)"}])


def _swap_route(api: APIRouter) -> None:
    @api.get("/swaps/{swap_id}", responses={404: {"description": "No event carries this id"}})
    async def get_swap(store: StoreDep, swap_id: str) -> SwapReport:
        """One swap: its cause (the reason it started, and the request that started it),
        every request that caused it or waited for it, and how long each phase took."""
        _check_text({"swap_id": [swap_id]})
        report = await swap_report(store, swap_id)
        if report is None:
            raise ApiError(404, ErrorCode.SWAP_NOT_FOUND, f"no event carries swap id {swap_id!r}")
        return report


def build_router(cursor_key: bytes) -> APIRouter:
    """The query routes; ``cursor_key`` signs and checks the events cursors."""
    api = APIRouter(prefix="/v1")

    @api.get(
        "/events",
        responses={400: {"description": "The cursor is not the `next` of a page of this query"}},
    )
    async def list_events(  # noqa: PLR0917 - one parameter per documented filter
        store: StoreDep,
        outcome: Outcomes = None,
        kind: Kinds = None,
        pool: Values = None,
        member: Values = None,
        router: Values = None,
        rule: Values = None,
        request_id: Values = None,
        swap_id: Values = None,
        since: Time = None,
        until: Time = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_PAGE,
        cursor: str | None = None,
    ) -> EventsPage:
        """Events matching every given filter (a repeated filter matches any of its values),
        newest first; ``since`` is inclusive, ``until`` exclusive."""
        _check_choices("outcome", outcome, OUTCOMES)
        _check_choices("kind", kind, KINDS)
        _check_text(
            {
                "pool": pool,
                "member": member,
                "router": router,
                "rule": rule,
                "request_id": request_id,
                "swap_id": swap_id,
            }
        )
        since_utc, until_utc = _window(since, until)
        filters = EventFilter(
            outcome=tuple(outcome or ()),
            kind=tuple(kind or ()),
            pool=tuple(pool or ()),
            member=tuple(member or ()),
            router=tuple(router or ()),
            rule=tuple(rule or ()),
            request_id=tuple(request_id or ()),
            swap_id=tuple(swap_id or ()),
            since=since_utc,
            until=until_utc,
        )
        after = None
        if cursor:  # an empty cursor is the first page
            try:
                after = Cursor.decode(cursor, filters, cursor_key)
            except InvalidCursor as exc:
                raise ApiError(400, ErrorCode.INVALID_CURSOR, str(exc)) from exc
        events = await store.events(filters, limit=limit + 1, after=after)
        page, more = events[:limit], len(events) > limit
        last = page[-1] if more else None
        next_cursor = Cursor(last.time, last.id).encode(filters, cursor_key) if last else None
        return EventsPage(
            events=[e.model_dump(mode="json", exclude_none=True) for e in page],
            next=next_cursor,
        )

    _swap_route(api)

    @api.get("/summary")
    async def summary(store: StoreDep, since: Time = None, until: Time = None) -> SummaryBody:
        """Counts by outcome, kind and pool/member for ``since <= time < until`` (default:
        the last 24 hours)."""
        since_utc, until_utc = _window(since, until)
        end = until_utc or datetime.now(UTC)
        start = since_utc or end - min(DEFAULT_SUMMARY_WINDOW, end - EARLIEST)
        if start >= end:
            raise invalid([{"field": "since", "message": "must be earlier than until"}])
        return SummaryBody.of(await store.summary(start, end))

    @api.get("/dead-letters")
    async def dead_letters(
        store: StoreDep,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_PAGE,
        before: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
    ) -> DeadLettersPage:
        """Messages that were not valid events, newest first, with the reason."""
        rows = await store.dead_letters(limit=limit + 1, before=before)
        page, more = rows[:limit], len(rows) > limit
        body = []
        for row in page:
            try:
                text: str | None = row.payload.decode()
            except UnicodeDecodeError:
                text = None
            body.append(
                DeadLetterBody(
                    id=row.id,
                    stream=row.stream,
                    stream_seq=row.stream_seq,
                    subject=row.subject,
                    published=row.published,
                    received_at=row.received_at,
                    reason=row.reason,
                    detail=row.detail,
                    payload=base64.b64encode(row.payload).decode(),
                    payload_text=text,
                )
            )
        return DeadLettersPage(dead_letters=body, next=page[-1].id if more else None)

    return api
