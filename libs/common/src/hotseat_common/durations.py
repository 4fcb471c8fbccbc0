"""Durations written as strings like ``300s``, ``2m``, ``1h30m`` or ``250ms``."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator, PlainSerializer

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: object) -> float:
    """Return seconds for ``value``: a non-negative number of seconds or a duration string."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration (use e.g. '300s', '2m')")  # noqa: TRY004
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"{value!r} is negative")
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a duration (use e.g. '300s', '2m')")  # noqa: TRY004
    text = value.strip()
    pos = 0
    total = 0.0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if pos == 0 or pos != len(text):
        raise ValueError(f"{value!r} is not a duration (use e.g. '300s', '2m', '1h30m', '250ms')")
    return total


def format_duration(seconds: float) -> str:
    """Render seconds back as the shortest exact duration string."""
    if seconds == int(seconds):
        whole = int(seconds)
        if whole and whole % 3600 == 0:
            return f"{whole // 3600}h"
        if whole and whole % 60 == 0:
            return f"{whole // 60}m"
        return f"{whole}s"
    return f"{round(seconds * 1000)}ms"


Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
]
"""Seconds as a float, parsed from and written as a duration string."""
