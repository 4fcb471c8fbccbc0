"""Reading a member's ``/slots`` through its driver (``busySignal: leasesAndSlots``): the
decisions' reads before a drain, a swap or an eviction, and a swap's own reads right
before it unloads."""

from __future__ import annotations

import asyncio

from hotseat_common.logging import get_logger
from hotseat_pool_controller.drivers.base import DriverError, ResidencyDriver

log = get_logger(__name__)

IDLE_CHECK_TIMEOUT_S = 2.0


async def slots_busy(driver: ResidencyDriver, member: str, pool: str) -> bool | None:
    """Whether ``member``'s ``/slots`` show work; a member the driver proves gone has
    none (a member a failed plan left to unload may never have started, and a stopped
    process has no ``/slots`` to ask). ``None`` when a read errors or stalls: the
    decisions count that as busy for a member in service (fail closed,
    ``decisions/busy.py``)."""
    try:
        async with asyncio.timeout(IDLE_CHECK_TIMEOUT_S):
            if await driver.confirm_gone(member):
                return False
            return not await driver.is_idle(member)
    except (DriverError, TimeoutError) as exc:
        log.warning("idle_check_failed", pool=pool, member=member, error=str(exc))
        return None
