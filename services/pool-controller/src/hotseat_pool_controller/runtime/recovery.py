"""Recovering a pool: health-check its resident (lost when it is dead, kept and marked
unhealthy while it still serves and cannot be proven gone), and rebuild a state the store
lost from what the drivers report (docs/adr/0005)."""

from __future__ import annotations

from hotseat_common.logging import get_logger
from hotseat_pool_controller.decisions.busy import SlotsRead
from hotseat_pool_controller.decisions.capacity import decide_member_health, decide_member_lost
from hotseat_pool_controller.decisions.recovery import (
    decide_rebuild,
    decide_resident_health,
    decide_resident_lost,
)
from hotseat_pool_controller.decisions.start import next_epoch
from hotseat_pool_controller.drivers.base import ResidencyDriver
from hotseat_pool_controller.model import SERVING, Decision, Phase, PoolPolicy, PoolSnapshot
from hotseat_pool_controller.runtime.announcer import Announcer
from hotseat_pool_controller.runtime.transitions import Transitions
from hotseat_pool_controller.store.pool import PoolStore

log = get_logger(__name__)

HEALTH_FAILURES_BEFORE_LOST = 2
RELEARN_MARGIN_MS = 1000
"""Past one lease TTL, how long a rebuilt resident stays busy for renewals on their way."""


class Recovery:
    def __init__(
        self,
        store: PoolStore,
        driver: ResidencyDriver,
        transitions: Transitions,
        announcer: Announcer,
    ) -> None:
        self._store = store
        self._driver = driver
        self._transitions = transitions
        self._announcer = announcer
        self._policy: PoolPolicy = store.policy
        self._name = store.policy.name
        self._health_failures = 0
        self._member_failures: dict[str, int] = {}

    async def rebuild(self) -> None:
        """The state is gone (Redis restarted empty) or was written on another server (a
        restart with persistence, a failover): re-derive residency from the driver, and
        relearn who is busy (docs/adr/0005). A lone member on the GPU is the resident even
        when it does not answer yet (still loading, or stalled under its streams): marked
        unhealthy, it is never taken for gone and unloaded on that alone. The drivers are
        fenced at the new epoch first, so a swap owner that lost the pool with its state
        cannot act on its old claim."""
        snap = await self._store.snapshot()
        if snap.phase != Phase.UNKNOWN:
            return
        await self._driver.fence(next_epoch(snap))
        loaded = await self._driver.residency()
        on_gpu = tuple(m for m, is_loaded in loaded.items() if is_loaded)
        capacity = self._policy.has_capacity
        unready = frozenset([m for m in on_gpu if not await self._driver.is_ready(m)])
        unhealthy = not capacity and len(on_gpu) == 1 and on_gpu[0] in unready
        log.warning("pool_state_rebuilt", pool=self._name, loaded=loaded, unhealthy=unhealthy)
        self._announcer.relearned(self._name)
        relearn_ms = self._policy.lease_ttl_ms + RELEARN_MARGIN_MS
        await self._transitions.decide(
            lambda s, _busy: decide_rebuild(
                s,
                on_gpu,
                unhealthy=unhealthy,
                relearn_ms=relearn_ms,
                capacity=capacity,
                unwell=unready if capacity else frozenset(),
            )
        )

    async def check_resident(
        self, threshold: int = HEALTH_FAILURES_BEFORE_LOST, *, known: PoolSnapshot | None = None
    ) -> None:
        """Health-check the resident. One that fails ``threshold`` checks in a row is lost,
        unless it serves: then it is lost only if the driver confirms it gone (its leases
        revoked), else marked unhealthy until its leases end (docs/adr/0005). ``known``:
        the pool as the supervisor last read it (a quiet pool's; a pool with capacity is
        never quiet), so a healthy resident costs no store read."""
        snap = known if known is not None else await self._store.snapshot()
        if self._policy.has_capacity:
            await self._check_residents(snap, threshold)
            return
        if snap.resident is None or snap.phase not in SERVING:
            self._health_failures = 0
            return
        resident = snap.resident
        if await self._driver.is_ready(resident):
            await self._passed(snap, resident)
            return
        if known is not None:
            # A failed probe is acted on from the store's state as it is now.
            snap = await self._store.snapshot()
            if snap.resident != resident or snap.phase not in SERVING:
                self._health_failures = 0
                return
        await self._failed(snap, resident, threshold)

    async def _passed(self, snap: PoolSnapshot, resident: str) -> None:
        self._health_failures = 0
        if snap.unhealthy:
            log.info("resident_healthy_again", pool=self._name, member=resident)
            await self._transitions.decide(
                lambda s, _busy: decide_resident_health(s, resident, healthy=True)
            )

    async def _failed(self, snap: PoolSnapshot, resident: str, threshold: int) -> None:
        self._health_failures += 1
        if self._health_failures < threshold:
            return
        self._health_failures = 0
        if not snap.serving(resident):
            await self._transitions.decide(
                lambda s, _busy: decide_resident_lost(s, resident, "health check failed")
            )
            return
        if await self._driver.confirm_gone(resident):
            log.warning("resident_gone_while_serving", pool=self._name, member=resident,
                        leases=snap.live_leases(resident))  # fmt: skip
            await self._transitions.decide(
                lambda s, _busy: decide_resident_lost(
                    s, resident, "gone while serving: leases revoked", revoke=True
                )
            )
            return
        if not snap.unhealthy:
            log.warning("resident_unhealthy", pool=self._name, member=resident,
                        leases=snap.live_leases(resident))  # fmt: skip
            self._announcer.unhealthy(self._name, resident)
        await self._transitions.decide(
            lambda s, _busy: decide_resident_health(s, resident, healthy=False)
        )

    async def _check_residents(self, snap: PoolSnapshot, threshold: int) -> None:
        """A capacity pool's residents, each checked: one that fails ``threshold`` checks
        in a row leaves the set when it serves nothing, or when the driver confirms it
        gone (its leases revoked); one that serves and cannot be proven gone stays."""
        for member in sorted(snap.residents):
            if await self._driver.is_ready(member):
                self._member_failures.pop(member, None)
                if member in snap.unwell:
                    await self._health(member, healthy=True)
                continue
            failures = self._member_failures.get(member, 0) + 1
            self._member_failures[member] = failures
            if failures < threshold:
                continue
            self._member_failures.pop(member, None)
            if not snap.serving(member):
                reason, revoke = "health check failed", False
            elif await self._driver.confirm_gone(member):
                reason, revoke = "gone while serving: leases revoked", True
            else:
                if member not in snap.unwell:
                    log.warning("resident_unhealthy", pool=self._name, member=member,
                                leases=snap.live_leases(member))  # fmt: skip
                    self._announcer.unhealthy(self._name, member)
                await self._health(member, healthy=False)
                continue
            await self._lose(member, reason, revoke=revoke)

    async def _health(self, member: str, *, healthy: bool) -> None:
        def decide(snap: PoolSnapshot, _read: SlotsRead) -> Decision:
            return decide_member_health(snap, member, healthy=healthy)

        await self._transitions.decide(decide)

    async def _lose(self, member: str, reason: str, *, revoke: bool) -> None:
        def decide(snap: PoolSnapshot, _read: SlotsRead) -> Decision:
            return decide_member_lost(snap, member, reason, revoke=revoke)

        await self._transitions.decide(decide)
