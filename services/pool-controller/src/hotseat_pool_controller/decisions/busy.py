"""Whether a member counts as busy: the one judgement behind IfIdle skips, drains, every
swap's precondition and every eviction (PRODUCT.md section 2, "Busy")."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from hotseat_common.config.model import BusySignal
from hotseat_pool_controller.model import Decision, PoolPolicy, PoolSnapshot

SlotsRead = Mapping[str, bool | None]
"""Member -> what its ``/slots`` said when the controller read them: ``True`` at work,
``False`` idle (or the member provably gone), ``None`` no answer (members not read are
absent). A decision that needs a member's ``/slots`` asks for them
(``Decision.need_idle_check``) and is taken again with the reading."""

NOT_READ: SlotsRead = MappingProxyType({})


def all_idle(policy: PoolPolicy) -> SlotsRead:
    """Every member's ``/slots`` taken as idle (an operator's forced action)."""
    return MappingProxyType(dict.fromkeys(policy.members, False))


def busy_in_service(slots: SlotsRead, member: str) -> bool:
    """A member in service (the resident, a member of the set) read busy, or whose
    ``/slots`` did not answer: fail closed."""
    return member in slots and slots[member] is not False


def at_work(slots: SlotsRead, member: str) -> bool:
    """A member out of service (taken for lost, left loaded by a failed unload) whose
    ``/slots`` answered busy: traffic that bypassed the router. One that does not answer
    either failed its health checks already, and unloading it is how it is recovered."""
    return slots.get(member) is True


def incumbent_busy(
    snap: PoolSnapshot, policy: PoolPolicy, slots: SlotsRead, *, leases: bool = True
) -> bool:
    """Live leases fleet-wide, requests about to use it (its waiters), or busy slots.
    ``leases=False``: all but the live leases (which the caller counts otherwise: a group
    copy's entry, docs/adr/0012); leases the store is still relearning count."""
    if snap.resident is None:
        return False
    return (
        (snap.serving(snap.resident) if leases else snap.relearning)
        or (
            snap.live_waiters(snap.resident) > 0
            and just_committed(snap, policy)
            and not snap.closed  # held because it is closed: they wait for a swap back
        )
        or busy_in_service(slots, snap.resident)
    )


def just_committed(snap: PoolSnapshot, policy: PoolPolicy) -> bool:
    """The resident became resident so recently that its waiters are re-asking right now."""
    return snap.now_ms - snap.committed_ms < policy.waiter_grace_ms


def unread(policy: PoolPolicy, slots: SlotsRead, members: tuple[str, ...]) -> tuple[str, ...]:
    """Of ``members``, those whose ``/slots`` must still be read before one of them is
    unloaded or evicted (``busySignal: leasesAndSlots`` only)."""
    if policy.busy_signal != BusySignal.LEASES_AND_SLOTS:
        return ()
    return tuple(m for m in members if m not in slots)


def read_resident_first(
    snap: PoolSnapshot, policy: PoolPolicy, slots: SlotsRead
) -> Decision | None:
    """The decision that reads the resident's ``/slots`` before anything else is decided
    (``busySignal: leasesAndSlots``, not read yet); ``None`` when there is none to read."""
    if snap.resident is None or not unread(policy, slots, (snap.resident,)):
        return None
    return Decision(need_idle_check=(snap.resident,))
