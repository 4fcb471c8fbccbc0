"""A pool's residency timeline, built from its audit events: who was resident when, and
each swap with its cause, its waiters and how it ended.

A pure function of the events (as ``GET /v1/events`` returns them) and the pool's view
now, so that what the console draws is decided here, in one place a test can read. The
swaps pair by their ``swap_id`` when the events carry one, else by ``epoch`` (a
``swap_started`` is followed by exactly one terminal event with its epoch). A request
belongs to a swap by its ``swap_id`` when it has one, and the swap's cause is the request
its ``swap_started`` names; for events written before swap ids, a request served by
the swap's target that began before the swap completed and ended after it must have
waited for it (the target served nothing before it was resident, and a busy member is
never unloaded), so it counts as a waiter of that swap.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel

from hotseat_common.messages import PoolOutcome, PoolView

TERMINAL = frozenset(
    {
        PoolOutcome.SWAP_COMPLETED.value,
        PoolOutcome.SWAP_FAILED.value,
        PoolOutcome.SWAP_CANCELLED.value,
    }
)
TIMELINE_OUTCOMES = (
    PoolOutcome.SWAP_STARTED.value,
    *sorted(TERMINAL),
    PoolOutcome.RESIDENT_LOST.value,
)
"""The pool events a timeline is built from."""
IN_FLIGHT = "in_flight"
MAX_LISTED_WAITERS = 25
"""Waiters listed per swap (all are counted)."""


class TimelineRequest(BaseModel):
    request_id: str | None
    rule: str | None
    outcome: str
    started: datetime
    """When the request reached its router (its event's time less its duration)."""
    duration_ms: float | None


class TimelineSwap(BaseModel):
    swap_id: str | None
    epoch: int | None
    from_member: str | None
    to_member: str | None
    reason: str | None
    """Why it started: ``demand``, ``swap_back``, ``admin``, ``warm_default``..."""
    started: datetime
    ended: datetime | None
    """``None`` while it runs."""
    outcome: str
    """``swap_completed``, ``swap_failed``, ``swap_cancelled``, or ``in_flight``."""
    duration_ms: float | None
    """The event's own duration, else from its start to its end (when both are known)."""
    unload_ms: float | None = None
    """Its unloading phase, as the controller measured it (on its terminal event)."""
    load_ms: float | None = None
    """Its loading phase."""
    cause_request_id: str | None = None
    """The request that started it (``swap_started`` names it, for demand)."""
    cause: TimelineRequest | None
    """That request's own event among the waiters; for events without swap ids, the
    earliest waiter of a demand swap."""
    waiters: list[TimelineRequest]
    """The requests that waited for it, earliest first (at most 25 listed)."""
    waiters_total: int


class ResidencySpan(BaseModel):
    member: str
    start: datetime
    end: datetime
    before_window: bool
    """Resident already when the window began."""


class Timeline(BaseModel):
    pool: str
    since: datetime
    until: datetime
    residency: list[ResidencySpan]
    swaps: list[TimelineSwap]
    """Oldest first."""
    truncated: bool = False
    """The window held more events than were read: the oldest are missing."""
    audit_error: str | None = None
    """Why the audit service could not be read (the timeline is then empty)."""


def _time(event: Mapping[str, Any]) -> datetime:
    return datetime.fromisoformat(str(event["time"]))


def _request(event: Mapping[str, Any]) -> TimelineRequest:
    end = _time(event)
    duration = event.get("duration_ms")
    started = end - timedelta(milliseconds=float(duration)) if duration is not None else end
    return TimelineRequest(
        request_id=event.get("request_id"),
        rule=event.get("rule"),
        outcome=str(event["outcome"]),
        started=started,
        duration_ms=duration,
    )


class _Swap:
    def __init__(self, started: datetime) -> None:
        self.swap_id: str | None = None
        self.epoch: int | None = None
        self.from_member: str | None = None
        self.to_member: str | None = None
        self.reason: str | None = None
        self.started = started
        self.ended: datetime | None = None
        self.outcome = IN_FLIGHT
        self.duration_ms: float | None = None
        self.unload_ms: float | None = None
        self.load_ms: float | None = None
        self.cause_request_id: str | None = None
        self.waiters: list[TimelineRequest] = []
        self.also: list[str] = []
        """A capacity pool's plan: the other members it loads at once (ADR 0008)."""
        self.failed_alone: set[str] = set()
        """Those of them whose load failed alone (the plan went on)."""

    def take(self, event: Mapping[str, Any]) -> None:
        for name in ("swap_id", "epoch", "from_member", "to_member"):
            if getattr(self, name) is None and event.get(name) is not None:
                setattr(self, name, event[name])

    def model(self) -> TimelineSwap:
        waiters = sorted(self.waiters, key=lambda r: r.started)
        cause = None
        if self.cause_request_id is not None:
            cause = next((w for w in waiters if w.request_id == self.cause_request_id), None)
        elif self.swap_id is None and waiters and self.reason in {"demand", "swap_back"}:
            cause = waiters[0]
        return TimelineSwap(
            swap_id=self.swap_id,
            epoch=self.epoch,
            from_member=self.from_member,
            to_member=self.to_member,
            reason=self.reason,
            started=self.started,
            ended=self.ended,
            outcome=self.outcome,
            duration_ms=self.duration_ms,
            unload_ms=self.unload_ms,
            load_ms=self.load_ms,
            cause_request_id=self.cause_request_id,
            cause=cause,
            waiters=waiters[:MAX_LISTED_WAITERS],
            waiters_total=len(waiters),
        )


def _key(event: Mapping[str, Any]) -> tuple[str, object] | None:
    if event.get("swap_id") is not None:
        return ("id", event["swap_id"])
    if event.get("epoch") is not None:
        return ("epoch", event["epoch"])
    return None


class _Residency:
    """Who is resident, member by member. In a one-resident pool (``exclusive``) a swap's
    start ends whoever was resident and a completion ends any other; in a capacity pool
    only the members an event names come and go (ADR 0008)."""

    def __init__(self, since: datetime, *, exclusive: bool) -> None:
        self.since = since
        self.exclusive = exclusive
        self.spans: list[ResidencySpan] = []
        self.open: dict[str, datetime] = {}
        self.seen: set[str] = set()
        self.any_seen = False

    def _close(self, member: str, at: datetime) -> None:
        start = self.open.pop(member)
        if at > start:
            self.spans.append(
                ResidencySpan(member=member, start=start, end=at, before_window=start == self.since)
            )

    def leave(self, member: str | None, at: datetime) -> None:
        """``member`` stops being resident at ``at``; the first event that names it may
        say it was resident before the window."""
        first = not self.any_seen if self.exclusive else member not in self.seen
        if member and first and member not in self.open:
            self.open[member] = self.since
        if member:
            self.seen.add(member)
        self.any_seen = True
        leaving = list(self.open) if self.exclusive else [m for m in (member,) if m in self.open]
        for name in leaving:
            self._close(name, at)

    def enter(self, member: str | None, at: datetime) -> None:
        self.any_seen = True
        if self.exclusive:
            for name in list(self.open):
                self._close(name, at)
        if member:
            self.seen.add(member)
            if member in self.open:
                self._close(member, at)
            self.open[member] = at

    def finish(self, until: datetime, current: Iterable[str]) -> list[ResidencySpan]:
        """Close the open spans at ``until``; the residents now that no event named were
        resident throughout."""
        for member in current:
            quiet = not self.any_seen if self.exclusive else member not in self.seen
            if quiet and member not in self.open:
                self.open[member] = self.since
        for member in list(self.open):
            self._close(member, until)
        return sorted(self.spans, key=lambda span: (span.start, span.member))


def _failed_alone(
    open_swaps: Mapping[tuple[str, object], _Swap],
    key: tuple[str, object] | None,
    event: Mapping[str, Any],
) -> bool:
    """``event`` ends one of the other members a capacity pool's plan loads at once, which
    failed alone (ADR 0008): the plan goes on, and ends with its own event."""
    going = open_swaps.get(key) if key is not None else None
    member = event.get("to_member")
    if going is None or member not in going.also:
        return False
    going.failed_alone.add(str(member))
    return True


def _pair_swaps(
    events: Iterable[Mapping[str, Any]], since: datetime, residency: _Residency
) -> list[_Swap]:
    swaps: list[_Swap] = []
    open_swaps: dict[tuple[str, object], _Swap] = {}
    for event in events:
        outcome, at = event.get("outcome"), _time(event)
        key = _key(event)
        if outcome == PoolOutcome.RESIDENT_LOST.value:
            residency.leave(event.get("member"), at)
            continue
        if outcome == PoolOutcome.SWAP_STARTED.value:
            swap = _Swap(at)
            swap.take(event)
            swap.reason = event.get("reason")
            swap.cause_request_id = event.get("request_id")
            swap.also = [m for m in str(event.get("also") or "").split(",") if m]
            swaps.append(swap)
            if key is not None:
                open_swaps[key] = swap
            residency.leave(event.get("from_member"), at)
            continue
        if outcome not in TERMINAL or _failed_alone(open_swaps, key, event):
            continue
        found = open_swaps.pop(key, None) if key is not None else None
        if found is None:  # started before the window
            duration = event.get("duration_ms")
            started = at - timedelta(milliseconds=float(duration)) if duration else since
            found = _Swap(max(started, since))
            swaps.append(found)
            residency.leave(event.get("from_member"), found.started)
        found.take(event)
        found.ended, found.outcome = at, str(outcome)
        duration = event.get("duration_ms")
        if duration is None and found.started > since:  # its start is known: measure it
            duration = round((at - found.started).total_seconds() * 1000, 3)
        found.duration_ms = duration
        found.unload_ms, found.load_ms = event.get("unload_ms"), event.get("load_ms")
        if outcome == PoolOutcome.SWAP_COMPLETED.value:
            residency.enter(event.get("to_member") or found.to_member, at)
            # The others it loaded at once: each joined as it was ready, by the plan's end.
            for member in [m for m in found.also if m not in found.failed_alone]:
                residency.enter(member, at)
    return swaps


def _attribute(swaps: list[_Swap], requests: Iterable[Mapping[str, Any]]) -> None:
    by_id = {s.swap_id: s for s in swaps if s.swap_id is not None}
    for event in requests:
        swap_id = event.get("swap_id")
        if swap_id is not None:
            swap = by_id.get(swap_id)
            if swap is not None:
                swap.waiters.append(_request(event))
            continue
        request = _request(event)
        end = _time(event)
        for swap in swaps:
            if (
                swap.swap_id is None
                and swap.outcome == PoolOutcome.SWAP_COMPLETED.value
                and swap.ended is not None
                and event.get("member") == swap.to_member
                and request.started < swap.ended <= end
            ):
                swap.waiters.append(request)
                break


def build_timeline(
    view: PoolView,
    pool_events: Iterable[Mapping[str, Any]],
    request_events: Iterable[Mapping[str, Any]],
    *,
    since: datetime,
    until: datetime,
    truncated: bool = False,
) -> Timeline:
    """The timeline of ``view``'s pool over ``[since, until)`` from its pool events (swap
    and ``resident_lost`` outcomes) and its request events, in any order."""
    ordered = sorted(pool_events, key=_time)
    residency = _Residency(since, exclusive=view.capacity_gib is None)
    swaps = _pair_swaps(ordered, since, residency)
    current = view.residents or ([view.resident] if view.resident else [])
    spans = residency.finish(until, current)
    _attribute(swaps, request_events)
    return Timeline(
        pool=view.name,
        since=since,
        until=until,
        residency=spans,
        swaps=[s.model() for s in swaps],
        truncated=truncated,
    )
