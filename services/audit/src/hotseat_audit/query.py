"""What a caller may ask the store: event filters, keyset cursors and summaries.

Pages are ordered newest first by ``(time, id)``. A cursor is the position of the last
event of a page plus a fingerprint of the filters it was made for, encoded as opaque
URL-safe text; a cursor presented with other filters is refused rather than silently
paging through a different result set.

A cursor is signed: ``<payload>.<mac>``, both base64url, the MAC an HMAC-SHA256 over the
payload with the deployment's cursor key. A cursor that was edited, made up, or signed
with another key is refused before anything in it is read, so a client can only send
back a position the service itself handed out.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from hotseat_common.messages.audit import PoolOutcome, RequestOutcome

FILTER_FIELDS = (
    "outcome",
    "kind",
    "pool",
    "member",
    "router",
    "rule",
    "request_id",
    "swap_id",
)
"""Event columns a query may filter on by equality (several values mean any of them)."""

OUTCOMES = frozenset(o.value for o in RequestOutcome) | frozenset(o.value for o in PoolOutcome)
KINDS = frozenset({"request", "pool"})

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)
EARLIEST = datetime.min.replace(tzinfo=UTC)
LATEST = datetime.max.replace(tzinfo=UTC)

CURSOR_MAC_CONTEXT = b"hotseat-audit-cursor-v1\x00"
"""Prefixed to the payload before it is signed, so a MAC made with the cursor key for
anything else never passes as a cursor's."""
NOT_VALID = "cursor is not valid: pass the `next` value of a page"


class InvalidCursor(ValueError):
    """The cursor is not one this service issued for these filters."""


class OutOfRange(ValueError):
    """A date-time whose UTC equivalent is before year 1 or after year 9999."""


def as_utc(moment: datetime) -> datetime:
    """Read a naive timestamp as UTC; convert an aware one to UTC.

    Raises :class:`OutOfRange` when the UTC time cannot be represented (such as
    ``0001-01-01T00:00:00+14:00``)."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    try:
        return moment.astimezone(UTC)
    except OverflowError as exc:
        raise OutOfRange("is outside 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59.999999Z") from exc


def to_micros(moment: datetime) -> int:
    return (as_utc(moment) - EPOCH) // MICROSECOND


def from_micros(micros: int) -> datetime:
    return EPOCH + timedelta(microseconds=micros)


MIN_MICROS = to_micros(EARLIEST)
MAX_MICROS = to_micros(LATEST)


def _b64encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _b64decode(text: str) -> bytes:
    """Strict base64url: a character outside the alphabet is an error, not skipped."""
    return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)


def cursor_mac(key: bytes, payload: bytes) -> bytes:
    return hmac.new(key, CURSOR_MAC_CONTEXT + payload, hashlib.sha256).digest()


@dataclass(frozen=True, slots=True)
class EventFilter:
    """Equality filters (OR within a field, AND across fields) and a half-open time window."""

    outcome: tuple[str, ...] = ()
    kind: tuple[str, ...] = ()
    pool: tuple[str, ...] = ()
    member: tuple[str, ...] = ()
    router: tuple[str, ...] = ()
    rule: tuple[str, ...] = ()
    request_id: tuple[str, ...] = ()
    swap_id: tuple[str, ...] = ()
    since: datetime | None = None
    """Inclusive lower bound on the event time."""
    until: datetime | None = None
    """Exclusive upper bound on the event time."""

    def equalities(self) -> list[tuple[str, tuple[str, ...]]]:
        """The filtered columns with their accepted values, in a fixed order."""
        return [(name, values) for name in FILTER_FIELDS if (values := getattr(self, name))]

    def fingerprint(self) -> str:
        """A short digest that changes whenever the filters change."""
        canonical = {
            "eq": {name: sorted(values) for name, values in self.equalities()},
            "since": to_micros(self.since) if self.since else None,
            "until": to_micros(self.until) if self.until else None,
        }
        return hashlib.sha256(orjson.dumps(canonical, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Cursor:
    """The position just after the last event of a page (newest first)."""

    time: datetime
    id: str

    def encode(self, filters: EventFilter, key: bytes) -> str:
        """The signed cursor text: ``<payload>.<mac>``, URL-safe."""
        raw = orjson.dumps({"t": to_micros(self.time), "i": self.id, "f": filters.fingerprint()})
        return f"{_b64encode(raw)}.{_b64encode(cursor_mac(key, raw))}"

    @classmethod
    def decode(cls, text: str, filters: EventFilter, key: bytes) -> Cursor:
        """The position in ``text``, if this deployment signed it for ``filters``.

        The MAC is checked (in constant time) before the payload is parsed; the payload
        is still checked for shape and range, so a cursor is never trusted further than
        a value the service could have written."""
        payload_text, dot, mac_text = text.partition(".")
        try:
            if not dot:
                raise InvalidCursor(NOT_VALID)
            raw, mac = _b64decode(payload_text), _b64decode(mac_text)
        except (binascii.Error, ValueError) as exc:
            raise InvalidCursor(NOT_VALID) from exc
        if not hmac.compare_digest(mac, cursor_mac(key, raw)):
            raise InvalidCursor(NOT_VALID)
        try:
            data = orjson.loads(raw)
            micros, event_id, fingerprint = data["t"], data["i"], data["f"]
        except (ValueError, TypeError, KeyError) as exc:
            raise InvalidCursor(NOT_VALID) from exc
        if not (
            type(micros) is int
            and MIN_MICROS <= micros <= MAX_MICROS
            and isinstance(event_id, str)
            and "\x00" not in event_id
        ):
            raise InvalidCursor(NOT_VALID)
        if fingerprint != filters.fingerprint():
            raise InvalidCursor("cursor was issued for different filters: repeat the same filters")
        return cls(time=from_micros(micros), id=event_id)


@dataclass(slots=True)
class PoolMemberCount:
    pool: str
    member: str | None
    total: int = 0
    by_outcome: Counter[str] = field(default_factory=Counter)


@dataclass(slots=True)
class RuleCount:
    rule: str | None
    total: int = 0
    by_outcome: Counter[str] = field(default_factory=Counter)


@dataclass(slots=True)
class Summary:
    """Counts of stored events in a window, by outcome and by pool/member."""

    since: datetime
    until: datetime
    total: int = 0
    by_outcome: Counter[str] = field(default_factory=Counter)
    by_kind: Counter[str] = field(default_factory=Counter)
    by_pool: dict[tuple[str, str | None], PoolMemberCount] = field(default_factory=dict)
    by_rule: dict[str | None, RuleCount] = field(default_factory=dict)
    """Request events only (``None``: no rule matched)."""

    @classmethod
    def of_rows(cls, since: datetime, until: datetime, rows: Iterable[Sequence[Any]]) -> Summary:
        """From ``(kind, outcome, pool, member, rule, count)`` rows (the stores' GROUP BY)."""
        summary = cls(since=since, until=until)
        for kind, outcome, pool, member, rule, count in rows:
            summary.add(kind, outcome, pool, member, int(count), rule=rule)
        return summary

    def add(
        self,
        kind: str,
        outcome: str,
        pool: str | None,
        member: str | None,
        n: int,
        *,
        rule: str | None = None,
    ) -> None:
        self.total += n
        self.by_outcome[outcome] += n
        self.by_kind[kind] += n
        if pool is not None:
            entry = self.by_pool.get((pool, member))
            if entry is None:
                entry = self.by_pool[(pool, member)] = PoolMemberCount(pool, member)
            entry.total += n
            entry.by_outcome[outcome] += n
        if kind == "request":
            per_rule = self.by_rule.get(rule)
            if per_rule is None:
                per_rule = self.by_rule[rule] = RuleCount(rule)
            per_rule.total += n
            per_rule.by_outcome[outcome] += n
