"""Deciding and applying one transition of a pool: a pure decision on a fresh snapshot
(asked again with the incumbent's ``/slots`` when the decision needs them), applied by
the store, then reported, and the swap it orders started."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from hotseat_common.logging import get_logger
from hotseat_pool_controller.drivers.base import DriverError, ResidencyDriver
from hotseat_pool_controller.model import Decision, PoolSnapshot
from hotseat_pool_controller.runtime.outcomes import Outcomes
from hotseat_pool_controller.runtime.swaps import Swaps
from hotseat_pool_controller.store.pool import PoolStore

log = get_logger(__name__)

IDLE_CHECK_TIMEOUT_S = 2.0

Decide = Callable[[PoolSnapshot, bool | None], Decision]
"""A decision on a snapshot and, once consulted, whether the incumbent's slots are busy."""


class Transitions:
    def __init__(
        self, store: PoolStore, driver: ResidencyDriver, outcomes: Outcomes, swaps: Swaps
    ) -> None:
        self._store = store
        self._driver = driver
        self._outcomes = outcomes
        self._swaps = swaps
        self._pool = store.policy.name

    async def decide(self, decide: Decide, attempt: str = "") -> Decision:
        decision, _ = await self._store.decide(lambda s: decide(s, None), attempt)
        if decision.need_idle_check is not None:
            busy = await self._slots_busy(decision.need_idle_check)
            decision, _ = await self._store.decide(lambda s: decide(s, busy), attempt)
        await self._outcomes.report(decision, "decision")
        if decision.swap is not None:
            self._swaps.start(decision.swap)
        return decision

    async def _slots_busy(self, member: str) -> bool:
        """Fail closed: a /slots check that errors or stalls counts as busy."""
        try:
            async with asyncio.timeout(IDLE_CHECK_TIMEOUT_S):
                return not await self._driver.is_idle(member)
        except (DriverError, TimeoutError) as exc:
            log.warning("idle_check_failed", pool=self._pool, member=member, error=str(exc))
            return True
