"""Run a process under a shifted wall clock with libfaketime (Debian package ``faketime``,
installed by ``scripts/system_deps.sh``).

Only the wall clock moves (``CLOCK_REALTIME``, ``time()``, ``gettimeofday``); the
monotonic clock that asyncio runs on is left alone, like an NTP offset on a real host.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu/faketime", "/usr/lib/aarch64-linux-gnu/faketime",
                "/usr/lib/faketime")  # fmt: skip


def library() -> Path | None:
    for directory in LIBRARY_DIRS:
        path = Path(directory) / "libfaketime.so.1"
        if path.exists():
            return path
    return None


def faketime_env(offset: str) -> dict[str, str]:
    """Environment for a child whose wall clock is ``offset`` away (``-120s``, ``+1h``)."""
    path = library()
    if path is None:
        message = "libfaketime is not installed (run scripts/system_deps.sh)"
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail(message)
        pytest.skip(message)
    return {
        "LD_PRELOAD": str(path),
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }
