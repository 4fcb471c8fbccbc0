"""Sim backends served in the test's event loop, sharing the session Redis under a
per-test key prefix (so each test has its own simulated GPU ledger)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import pytest

from hotseat.launcher import Managed
from hotseat_common.config import HotseatConfig
from hotseat_common.keys import Keys
from tests.support.sim import SimHandle, run_sim

StartSim = Callable[..., Awaitable[SimHandle]]


@pytest.fixture
def keys(prefix: str) -> Keys:
    return Keys(prefix)


@pytest.fixture
async def start_sim(redis_server: Managed, prefix: str) -> AsyncIterator[StartSim]:
    async with AsyncExitStack() as stack:

        async def start(config: HotseatConfig, backend: str, **options: Any) -> SimHandle:
            return await stack.enter_async_context(
                run_sim(config, backend, redis_url=redis_server.url, key_prefix=prefix, **options)
            )

        yield start
