"""HTTP header names that cross process boundaries (the controller's drivers to backends)."""

from __future__ import annotations

EPOCH = "x-hotseat-epoch"
"""Sent by the ``http`` driver with every load and unload: the swap's fencing epoch. A
backend that remembers the highest epoch it obeyed and refuses a lower one (HTTP 409)
fences a controller that lost the swap (docs/drivers.md)."""
