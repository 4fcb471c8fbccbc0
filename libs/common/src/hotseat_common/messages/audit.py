"""Audit events: flat JSON objects, one per request outcome and one per pool transition.

Published to JetStream on ``<prefix>.audit.<kind>.<outcome>`` with ``Nats-Msg-Id`` set
to the event id, so a republished event is dropped by the stream's de-dup window and,
past it, by the audit store's unique id.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Literal, Self

import orjson
from pydantic import Field, model_validator

from hotseat_common.errors import ErrorCode
from hotseat_common.messages.base import WireModel


class RequestOutcome(StrEnum):
    """A request's one terminal outcome; a request that ended in an error that names its
    outcome is spelled by that error's code."""

    SERVED = "served"
    POOL_ACTIVATION_TIMEOUT = ErrorCode.POOL_ACTIVATION_TIMEOUT.value
    POOL_INCUMBENT_BUSY = ErrorCode.POOL_INCUMBENT_BUSY.value
    POOL_QUEUE_FULL = ErrorCode.POOL_QUEUE_FULL.value
    ALL_BACKENDS_FAILED = ErrorCode.ALL_BACKENDS_FAILED.value
    NO_ROUTE = "no_route"
    FAIL_CLOSED = ErrorCode.FAIL_CLOSED.value
    CLIENT_DISCONNECTED = ErrorCode.CLIENT_DISCONNECTED.value
    REJECTED = "rejected"


class PoolOutcome(StrEnum):
    BUSY_SKIP = "busy_skip"
    SWAP_STARTED = "swap_started"
    SWAP_COMPLETED = "swap_completed"
    SWAP_FAILED = ErrorCode.SWAP_FAILED.value
    SWAP_CANCELLED = "swap_cancelled"
    SWAP_RETARGETED = "swap_retargeted"
    LEASE_EXPIRED = "lease_expired"
    RESIDENT_LOST = "resident_lost"


class RetargetReason(StrEnum):
    """Why a swap still unloading changed its target: the ``reason`` of its
    ``swap_retargeted`` event (docs/adr/0006)."""

    MORE_URGENT = "more_urgent"
    """A member whose waiter ranks ahead of the target's (priority, aging) waits now."""


class SwapReason(StrEnum):
    """Why a swap started: the ``reason`` of its ``swap_started`` event."""

    DEMAND = "demand"
    """Requests wait for the target."""
    SWAP_BACK = "swap_back"
    """Demand for the member resident before the current one, soon after the current one
    came in (the pool's ``thrashWindow``): the pool goes back and forth."""
    ADMIN = "admin"
    ADMIN_UNLOAD = "admin_unload"
    WARM_DEFAULT = "warm_default"
    PRELOAD = "preload"
    """A capacity pool's ``preload`` member, loaded as a controller starts (docs/adr/0008)."""
    IDLE_UNLOAD = "idle_unload"
    """The resident served nothing for its ``idleUnloadAfter``; the pool stays cold."""
    RETURN_TO_DEFAULT = "return_to_default"
    """The resident served nothing for its ``idleUnloadAfter``; the default comes back."""
    FITS = "fits"
    """A capacity pool: requests wait for the target, and it fits in the free memory
    beside the residents (nothing evicted; docs/adr/0008)."""
    EVICT_IDLE = "evict_idle"
    """A capacity pool: requests wait for the target, and idle residents are evicted to
    make room for it (``evicts`` names them)."""


SWAP_ENDINGS = frozenset({
    PoolOutcome.SWAP_COMPLETED, PoolOutcome.SWAP_FAILED, PoolOutcome.SWAP_CANCELLED
})  # fmt: skip
"""The outcomes that end a swap: each ``swap_started`` is followed by one of them."""


class SwapEndReason(StrEnum):
    """Why a swap ended the way it did, where its owner names it: the ``reason`` of a
    ``swap_cancelled`` that no demand left caused."""

    POOL_STATE_LOST = "pool_state_lost"
    """The store lost the pool's state (Redis restarted empty, or failed over) while the
    swap ran; the rebuild took residency from the members, so the target may be resident
    (docs/adr/0005, point 9)."""


_OUTCOME_VALUES = {
    "request": frozenset(o.value for o in RequestOutcome),
    "pool": frozenset(o.value for o in PoolOutcome),
}
"""Checked on every event the audit service ingests, so built once."""


def new_event_id() -> str:
    """128 random bits as 32 hex digits (the shape of a UUID's hex, without its version
    bits: a quarter of ``uuid4().hex``'s cost, paid once per request)."""
    return os.urandom(16).hex()


def derived_event_id(*parts: str) -> str:
    """An event id every sender derives alike from ``parts`` (32 hex digits, as
    :func:`new_event_id`): an event several processes may send is stored once."""
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:32]


def utcnow() -> datetime:
    return datetime.now(UTC)


class AuditEvent(WireModel):
    id: str = Field(default_factory=new_event_id, min_length=1, max_length=64)
    time: datetime = Field(default_factory=utcnow)
    kind: Literal["request", "pool"]
    outcome: str
    request_id: str | None = None
    router: str | None = None
    controller: str | None = None
    rule: str | None = None
    pool: str | None = None
    member: str | None = None
    backend: str | None = None
    status: int | None = None
    duration_ms: float | None = None
    from_member: str | None = None
    to_member: str | None = None
    epoch: int | None = None
    reason: str | None = None
    cache_saved_bytes: int | None = None
    """A swap's prompt-cache save: bytes written (docs/adr/0007)."""
    cache_saved_tokens: int | None = None
    cache_save_ms: float | None = None
    cache_restored_bytes: int | None = None
    """A swap's prompt-cache restore: bytes read."""
    cache_restored_tokens: int | None = None
    cache_restore_ms: float | None = None
    swap_id: str | None = None
    """The swap the event is about: on every ``swap_*`` event, and on a request event the
    request that caused the swap or waited for it (docs/audit.md)."""
    unload_ms: float | None = None
    """A swap's unloading phase (on its terminal event, when it got that far)."""
    load_ms: float | None = None
    """A swap's loading phase, prompt-cache restore included (on ``swap_completed`` and a
    ``swap_failed`` that began its load)."""
    prompt_tokens: int | None = None
    """A served request's prompt tokens, from the upstream's ``usage``."""
    completion_tokens: int | None = None
    """A served request's completion tokens, from the upstream's ``usage``."""
    api_key: str | None = None
    """Which client API key the request came with: a short digest, never the key."""
    evicts: str | None = None
    """A capacity pool's ``swap_started``: the members the plan evicts, comma-separated
    (docs/adr/0008); absent when it evicts nothing."""
    placement: str | None = None
    """A request for a model group: why it went to its ``pool`` (a
    :class:`~hotseat_common.messages.placement.PlacementReason`, docs/adr/0012)."""
    also: str | None = None
    """A capacity pool's ``swap_started``: the other members the plan loads beside its
    target, at the same time, comma-separated (docs/adr/0008); absent when it loads one."""

    @model_validator(mode="after")
    def _outcome_fits_kind(self) -> Self:
        allowed = RequestOutcome if self.kind == "request" else PoolOutcome
        if self.outcome not in _OUTCOME_VALUES[self.kind]:
            choices = ", ".join(o.value for o in allowed)
            raise ValueError(f"outcome {self.outcome!r} is not one of {choices}")
        return self


def request_event(outcome: RequestOutcome, **fields: object) -> AuditEvent:
    return AuditEvent.model_validate({"kind": "request", "outcome": outcome.value, **fields})


def pool_event(outcome: PoolOutcome, **fields: object) -> AuditEvent:
    return AuditEvent.model_validate({"kind": "pool", "outcome": outcome.value, **fields})


_FIELDS = frozenset(AuditEvent.model_fields)


def encode_event(
    kind: Literal["request", "pool"], outcome: str, fields: Mapping[str, object]
) -> tuple[str, bytes]:
    """A new event's id and the JSON :meth:`AuditEvent.to_bytes` would write for it, without
    building the model: for a caller whose values are typed already (the router, once per
    request, where validating them again cost five times the encoding). Fields that are
    ``None`` are left out, as ``to_bytes`` leaves them; a name :class:`AuditEvent` does
    not have is refused. tests/common/test_audit_encoding.py holds the two encodings to
    the same result."""
    event_id = new_event_id()
    doc: dict[str, object] = {
        "v": 1,
        "id": event_id,
        "time": utcnow(),
        "kind": kind,
        "outcome": outcome,
    }
    for name, value in fields.items():
        if value is None:
            continue
        if name not in _FIELDS:
            raise TypeError(f"an audit event has no field {name!r}")
        doc[name] = value
    return event_id, orjson.dumps(doc, option=orjson.OPT_UTC_Z)
