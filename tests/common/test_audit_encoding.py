"""The router's fast audit encoding writes what the model would: every request outcome,
with and without optional fields, read back by the audit service's own decoder."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hotseat_common.messages.audit import AuditEvent, RequestOutcome, encode_event, request_event

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
