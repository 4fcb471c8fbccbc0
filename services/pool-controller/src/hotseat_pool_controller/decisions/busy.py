"""Whether the incumbent counts as busy: the one judgement behind IfIdle skips, drains and
every swap's precondition (PRODUCT.md section 2, "Busy")."""

from __future__ import annotations

from hotseat_common.config.model import BusySignal
from hotseat_pool_controller.model import PoolPolicy, PoolSnapshot


def incumbent_busy(snap: PoolSnapshot, policy: PoolPolicy, slots_busy: bool | None) -> bool:
    """Live leases fleet-wide, requests about to use it (its waiters), or busy slots."""
    if snap.resident is None:
        return False
    return (
        snap.serving(snap.resident)
        or (
            snap.live_waiters(snap.resident) > 0
            and just_committed(snap, policy)
            and not snap.closed  # held because it is closed: they wait for a swap back
        )
        or slots_busy is True
    )


def just_committed(snap: PoolSnapshot, policy: PoolPolicy) -> bool:
    """The resident became resident so recently that its waiters are re-asking right now."""
    return snap.now_ms - snap.committed_ms < policy.waiter_grace_ms


def needs_slots(snap: PoolSnapshot, policy: PoolPolicy, slots_busy: bool | None) -> bool:
    """``busySignal: leasesAndSlots`` and the resident's ``/slots`` not consulted yet."""
    return (
        snap.resident is not None
        and policy.busy_signal == BusySignal.LEASES_AND_SLOTS
        and slots_busy is None
    )
