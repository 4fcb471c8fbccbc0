"""Turning one JetStream message into an event to store, or a dead letter with a reason.

Pure functions: no I/O, so every way a payload can be wrong is tested without a server.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

import orjson
from pydantic import ValidationError

from hotseat_common import PROTOCOL_VERSION
from hotseat_common.messages.audit import AuditEvent

MAX_DETAIL = 1000


class DeadLetterReason(StrEnum):
    """Why a message could not be stored as an event (also the metric label)."""

    MALFORMED_JSON = "malformed_json"
    NOT_AN_OBJECT = "not_an_object"
    UNKNOWN_VERSION = "unknown_version"
    INVALID_EVENT = "invalid_event"


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a message came from in the stream."""

    stream: str
    stream_seq: int
    subject: str
    published: datetime | None = None


@dataclass(frozen=True, slots=True)
class Incoming:
    """A valid event and the stream position it was read from."""

    event: AuditEvent
    stream_seq: int | None = None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message that is not a valid event, kept verbatim with the reason."""

    origin: Origin
    payload: bytes
    reason: DeadLetterReason
    detail: str


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err["loc"]) or "event"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)[:MAX_DETAIL]


def _with_nul(event: AuditEvent) -> str | None:
    """The first text field holding NUL: no store keeps it (PostgreSQL text refuses it, and
    the whole batch with it, again and again), so such an event is a dead letter."""
    for name, value in event:
        if isinstance(value, str) and "\x00" in value:
            return name
    return None


def decode(payload: bytes, origin: Origin) -> Incoming | DeadLetter:
    """Parse ``payload`` as an :class:`AuditEvent` or explain why it is not one."""

    def dead(reason: DeadLetterReason, detail: str) -> DeadLetter:
        return DeadLetter(origin=origin, payload=payload, reason=reason, detail=detail[:MAX_DETAIL])

    def checked(event: AuditEvent) -> Incoming | DeadLetter:
        field = _with_nul(event) if b"\\u0000" in payload else None  # JSON spells NUL so
        if field is not None:
            return dead(DeadLetterReason.INVALID_EVENT, f"{field}: contains NUL (\\u0000)")
        return Incoming(event=event, stream_seq=origin.stream_seq)

    try:  # the common case, in one pass
        return checked(AuditEvent.model_validate_json(payload))
    except ValidationError:
        pass  # find out why, step by step

    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        return dead(DeadLetterReason.MALFORMED_JSON, str(exc))
    if not isinstance(data, dict):
        return dead(
            DeadLetterReason.NOT_AN_OBJECT, f"expected a JSON object, got {type(data).__name__}"
        )
    version = data.get("v", PROTOCOL_VERSION)
    if version != PROTOCOL_VERSION:
        return dead(
            DeadLetterReason.UNKNOWN_VERSION,
            f"v={version!r}; this audit service understands v={PROTOCOL_VERSION}",
        )
    try:
        event = AuditEvent.model_validate(data)
    except ValidationError as exc:
        return dead(DeadLetterReason.INVALID_EVENT, _describe(exc))
    return checked(event)
