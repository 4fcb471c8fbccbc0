"""Deciding and applying one transition of a pool: a pure decision on a fresh snapshot
(asked again with the ``/slots`` it needs read, as many times as it names new members to
read), applied by the store, then reported, and the swap it orders started."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from hotseat_pool_controller.decisions.busy import SlotsRead
from hotseat_pool_controller.drivers.base import ResidencyDriver
from hotseat_pool_controller.model import Decision, PoolSnapshot
from hotseat_pool_controller.runtime.outcomes import Outcomes
from hotseat_pool_controller.runtime.slots import slots_busy
from hotseat_pool_controller.runtime.swaps import Swaps
from hotseat_pool_controller.store.pool import PoolStore

Decide = Callable[[PoolSnapshot, SlotsRead], Decision]
"""A decision on a snapshot and the members' ``/slots`` read so far."""


class Transitions:
    def __init__(
        self, store: PoolStore, driver: ResidencyDriver, outcomes: Outcomes, swaps: Swaps
    ) -> None:
        self._store = store
        self._driver = driver
        self._outcomes = outcomes
        self._swaps = swaps
        self._pool = store.policy.name
        self._members = len(store.policy.members)

    async def decide(self, decide: Decide, attempt: str = "") -> Decision:
        read: dict[str, bool | None] = {}
        loop = asyncio.get_running_loop()
        # A swap the decision claims lives at least a heartbeat TTL from before its read.
        asked_at = loop.time()
        decision, after = await self._store.decide(lambda s: decide(s, dict(read)), attempt)
        # Each round reads at least one member not read before: at most one per member.
        for _ in range(self._members):
            members = [m for m in decision.need_idle_check if m not in read]
            if not members:
                break
            busy = await asyncio.gather(*(slots_busy(self._driver, m, self._pool) for m in members))
            read.update(zip(members, busy, strict=True))
            asked_at = loop.time()
            decision, after = await self._store.decide(lambda s: decide(s, dict(read)), attempt)
        await self._outcomes.report(decision, after, "decision")
        if decision.swap is not None:
            self._swaps.start(decision.swap, claimed_at=asked_at)
        return decision
