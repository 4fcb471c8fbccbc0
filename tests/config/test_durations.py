"""Durations: strings like ``300s``, ``2m``, ``1h30m``, ``250ms`` or plain seconds."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hotseat_common.durations import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("300s", 300.0),
        ("2m", 120.0),
        ("10m", 600.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("1m30s", 90.0),
        ("250ms", 0.25),
        ("1s500ms", 1.5),
        ("1.5m", 90.0),
        ("0s", 0.0),
        ("  5s  ", 5.0),
    ],
)
def test_parse_duration_strings(text: str, seconds: float):
    """Each unit (ms, s, m, h), decimals and combined parts add up to the right seconds."""
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(("number", "seconds"), [(0, 0.0), (15, 15.0), (2.5, 2.5)])
def test_parse_duration_plain_numbers_are_seconds(number: float, seconds: float):
    """A bare YAML number is a count of seconds."""
    result = parse_duration(number)
    assert result == seconds
    assert isinstance(result, float)


@pytest.mark.parametrize(
    "text", ["", "5", "s", "5 m", "1h 30m", "-3s", "3x", "5sec", "1e3s", "1m30", "PT5M", "5S"]
)
def test_parse_duration_rejects_malformed_strings(text: str):
    """Anything that is not a run of number+unit parts is rejected, naming the value."""
    with pytest.raises(ValueError, match="is not a duration") as caught:
        parse_duration(text)
    assert repr(text) in str(caught.value)
    assert "'300s'" in str(caught.value)


@pytest.mark.parametrize("value", [True, False, None, [5], {"s": 5}])
def test_parse_duration_rejects_other_types(value: object):
    """Booleans, null, lists and mappings are not durations (a YAML ``yes`` is not 1s)."""
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(value)


@pytest.mark.parametrize("value", [-1, -0.5])
def test_parse_duration_rejects_negative_seconds(value: float):
    """A negative number of seconds is rejected as negative."""
    with pytest.raises(ValueError, match="is negative"):
        parse_duration(value)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (300.0, "5m"),
        (600.0, "10m"),
        (3600.0, "1h"),
        (7200.0, "2h"),
        (5400.0, "90m"),
        (90.0, "90s"),
        (15.0, "15s"),
        (0.0, "0s"),
        (0.25, "250ms"),
        (1.5, "1500ms"),
    ],
)
def test_format_duration_shortest_exact_form(seconds: float, text: str):
    """Seconds render as the largest unit that is exact: h, then m, then s, else ms."""
    assert format_duration(seconds) == text


@given(st.integers(min_value=0, max_value=10**9))
def test_format_then_parse_round_trips_milliseconds(millis: int):
    """Any whole number of milliseconds survives format_duration -> parse_duration."""
    seconds = millis / 1000
    assert math.isclose(parse_duration(format_duration(seconds)), seconds, abs_tol=1e-9)
