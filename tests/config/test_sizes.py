"""Sizes: a count of bytes, or a number and a unit (``KB`` is 1000 bytes, ``KiB`` 1024)."""

from __future__ import annotations

import pytest

from hotseat_common.sizes import parse_size


@pytest.mark.parametrize(
    ("value", "size"),
    [
        (0, 0),
        (4096, 4096),
        ("512B", 512),
        ("2KB", 2000),
        ("2KiB", 2048),
        ("1.5GB", 1_500_000_000),
        ("20GiB", 20 * 1024**3),
        ("1TiB", 1024**4),
        (" 3MiB ", 3 * 1024**2),
    ],
)
def test_sizes_parse_to_bytes(value: object, size: int) -> None:
    """Counts pass through; strings are a number times the unit's power of 1000 or 1024."""
    assert parse_size(value) == size


@pytest.mark.parametrize("value", [-1, "20 GiB", "20gib", "GiB", "1.5", True, 1.5, None, "1e9B"])
def test_what_is_not_a_size_is_refused(value: object) -> None:
    """Negative counts, spaces, unknown or lower-case units, fractions of a byte count and
    non-numbers are refused with the reason."""
    with pytest.raises(ValueError, match=r"size|negative"):
        parse_size(value)
