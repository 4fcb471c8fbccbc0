"""Telling the world what an applied decision did: its audit events (counted), and a
state-change notification with the pool as the decision's commit left it, so waiting
routers re-ask."""

from __future__ import annotations

from hotseat_pool_controller.drivers.base import CacheReport
from hotseat_pool_controller.model import Decision, PoolSnapshot
from hotseat_pool_controller.runtime.announcer import Announcer
from hotseat_pool_controller.store.pool import PoolStore


class Outcomes:
    def __init__(self, store: PoolStore, announcer: Announcer) -> None:
        self._announcer = announcer
        self._pool = store.policy.name

    async def report(self, decision: Decision, after: PoolSnapshot | None, reason: str) -> None:
        """``after``: the pool as the decision's commit left it (the store returns it with
        the commit of a decision that changes the state, ``None`` for any other): the
        notification names the state the commit stored, with no read of its own."""
        for intent in decision.audit:
            self._announcer.transition(self._pool, intent)
        if after is not None:
            await self._announcer.state_changed(self._pool, after, reason)

    def cache_step(self, report: CacheReport) -> None:
        """A member's prompt cache saved or restored during a swap (docs/adr/0007)."""
        self._announcer.cache_step(self._pool, report)
