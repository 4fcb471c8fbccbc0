"""The router's fast audit encoding writes what the model would: every request outcome,
with and without optional fields, read back by the audit service's own decoder."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hotseat_common.messages.audit import (
    AuditEvent,
    PoolOutcome,
    RequestOutcome,
    derived_event_id,
    encode_event,
    new_event_id,
    pool_event,
    request_event,
)

_TEXT = st.text(min_size=1, max_size=40)
_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "request_id": _TEXT,
        "router": _TEXT,
        "rule": st.none() | _TEXT,
        "backend": st.none() | _TEXT,
        "pool": st.none() | _TEXT,
        "member": st.none() | _TEXT,
        "status": st.none() | st.integers(100, 599),
        "duration_ms": st.floats(0, 1e7, allow_nan=False).map(lambda x: round(x, 3)),
        "reason": st.none() | _TEXT,
        "swap_id": st.none() | _TEXT,
        "prompt_tokens": st.none() | st.integers(0, 10**7),
        "completion_tokens": st.none() | st.integers(0, 10**7),
        "api_key": st.none() | _TEXT,
    },
)


@given(outcome=st.sampled_from(RequestOutcome), fields=_FIELDS)
def test_encoded_event_is_the_models_event(
    outcome: RequestOutcome, fields: dict[str, object]
) -> None:
    event_id, data = encode_event("request", outcome.value, fields)
    decoded = AuditEvent.from_bytes(data)
    built = request_event(outcome, id=event_id, time=decoded.time, **fields)
    assert decoded == built
    # Same keys as the model's own encoding: nothing None, nothing extra.
    assert orjson.loads(data).keys() == orjson.loads(built.to_bytes()).keys()


def test_event_ids_differ_and_time_is_utc() -> None:
    ids = {encode_event("request", "served", {})[0] for _ in range(1000)}
    assert len(ids) == 1000
    _, data = encode_event("request", "served", {})
    assert AuditEvent.from_bytes(data).time.utcoffset() is not None
    assert orjson.loads(data)["time"].endswith("Z")


def test_a_field_the_event_does_not_have_is_refused() -> None:
    with pytest.raises(TypeError, match="no field 'tokens'"):
        encode_event("request", "served", {"tokens": 3})


@given(parts=st.lists(_TEXT, min_size=1, max_size=3), other=_TEXT)
def test_a_derived_event_id_is_the_same_for_every_sender(parts: list[str], other: str) -> None:
    """An event several controllers may send (the end of a swap the store lost) has the id
    each of them derives alike, of the shape of a new one, and another for other parts."""
    event_id = derived_event_id(*parts)
    assert event_id == derived_event_id(*parts)
    assert len(event_id) == len(new_event_id()) == 32
    int(event_id, 16)
    assert derived_event_id(*parts[:-1], parts[-1] + other) != event_id
    assert derived_event_id(*parts, other) != event_id
    event = pool_event(PoolOutcome.SWAP_CANCELLED, id=event_id, swap_id=parts[0])
    assert AuditEvent.from_bytes(event.to_bytes()).id == event_id
