"""Sizes in bytes written as a count or a string like ``512MiB``, ``20GiB`` or ``1.5GB``."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator

_SIZE = re.compile(r"(\d+(?:\.\d+)?)(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)")
_UNIT_BYTES = {
    "B": 1,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "TiB": 1024**4,
}
_HINT = "use e.g. 512MiB, 20GiB, 1.5GB or a count of bytes"


def parse_size(value: object) -> int:
    """Return bytes for ``value``: a non-negative whole number of bytes or a size string."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{value!r} is not a size ({_HINT})")  # noqa: TRY004 - pydantic wants ValueError
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{value!r} is negative")
        return value
    match = _SIZE.fullmatch(value.strip())
    if match is None:
        raise ValueError(f"{value!r} is not a size ({_HINT})")
    return int(float(match.group(1)) * _UNIT_BYTES[match.group(2)])


ByteSize = Annotated[int, BeforeValidator(parse_size)]
"""Bytes as an int, parsed from a count or a size string (``KB`` is 1000, ``KiB`` 1024)."""
