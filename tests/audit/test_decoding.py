"""Decoding a stream message into an event or a dead letter with the right reason."""

from __future__ import annotations

import orjson
import pytest

from hotseat_audit.decoding import DeadLetter, DeadLetterReason, Incoming, Origin, decode
from tests.audit.support import request_events

ORIGIN = Origin(stream="S", stream_seq=42, subject="p.audit.request.served")


def test_valid_event_decodes_with_its_stream_position() -> None:
    """A published event decodes to the same event, tagged with its stream sequence."""
    event = request_events(1)[0]
    decoded = decode(event.to_bytes(), ORIGIN)
    assert isinstance(decoded, Incoming)
    assert decoded.event == event
    assert decoded.stream_seq == 42


def test_an_event_holding_nul_is_a_dead_letter() -> None:
    """A text field with NUL (which PostgreSQL cannot store) makes the event a dead letter
    naming the field; the text "\\u0000" spelled out is an ordinary value."""
    nul = request_events(1)[0].model_copy(update={"request_id": "a\x00b"})
    decoded = decode(nul.to_bytes(), ORIGIN)
    assert isinstance(decoded, DeadLetter)
    assert decoded.reason is DeadLetterReason.INVALID_EVENT
    assert decoded.detail.startswith("request_id: contains NUL")
    spelled = request_events(1)[0].model_copy(update={"reason": "see \\u0000"})
    assert isinstance(decode(spelled.to_bytes(), ORIGIN), Incoming)


def test_missing_version_is_read_as_current() -> None:
    """An event without ``v`` is read as the current protocol version."""
    data = orjson.loads(request_events(1)[0].to_bytes())
    del data["v"]
    assert isinstance(decode(orjson.dumps(data), ORIGIN), Incoming)


@pytest.mark.parametrize(
    ("payload", "reason", "detail"),
    [
        (b"{oops", DeadLetterReason.MALFORMED_JSON, "line 1"),
        (b"", DeadLetterReason.MALFORMED_JSON, ""),
        (b'"served"', DeadLetterReason.NOT_AN_OBJECT, "str"),
        (b"[]", DeadLetterReason.NOT_AN_OBJECT, "list"),
        (
            b'{"v": 2, "kind": "request", "outcome": "served"}',
            DeadLetterReason.UNKNOWN_VERSION,
            "v=2",
        ),
        (
            b'{"kind": "request", "outcome": "swap_started"}',
            DeadLetterReason.INVALID_EVENT,
            "swap_started",
        ),
        (b'{"kind": "gpu", "outcome": "served"}', DeadLetterReason.INVALID_EVENT, "kind"),
        (
            b'{"kind": "request", "outcome": "served", "colour": 1}',
            DeadLetterReason.INVALID_EVENT,
            "colour",
        ),
        (
            b'{"kind": "request", "outcome": "served", "time": "yesterday"}',
            DeadLetterReason.INVALID_EVENT,
            "time",
        ),
        (
            b'{"kind": "request", "outcome": "served", "id": ""}',
            DeadLetterReason.INVALID_EVENT,
            "id",
        ),
    ],
)
def test_bad_payloads_become_dead_letters(
    payload: bytes, reason: DeadLetterReason, detail: str
) -> None:
    """Each kind of bad payload is a dead letter with its reason, a detail, and the raw bytes."""
    decoded = decode(payload, ORIGIN)
    assert isinstance(decoded, DeadLetter)
    assert decoded.reason is reason
    assert detail in decoded.detail
    assert decoded.detail
    assert decoded.payload == payload
    assert decoded.origin == ORIGIN
