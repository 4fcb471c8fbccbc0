"""Waiting for state that no event announces: poll a check until it holds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any


async def eventually(
    check: Callable[[], Awaitable[Any]], *, timeout: float = 10.0, interval: float = 0.05
) -> Any:
    """Poll ``check`` until it returns a truthy value (for state no event announces);
    ``timeout`` only bounds a test that would otherwise hang, it measures nothing."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(interval)  # the poll interval of a state with no event
    raise AssertionError(f"condition not met within {timeout}s (last: {last!r})")
