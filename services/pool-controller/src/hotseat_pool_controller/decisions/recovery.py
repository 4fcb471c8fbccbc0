"""Recovery: a resident that died out of band, one that fails its health checks while it
serves, and a pool state the store lost (rebuilt from the drivers, with the resident busy
while routers renew the leases the store forgot). Never cuts a member that serves
(docs/adr/0005)."""

from __future__ import annotations

from hotseat_common.messages import PoolOutcome
from hotseat_pool_controller.decisions.start import next_epoch
from hotseat_pool_controller.model import (
    NOTHING,
    SERVING,
    AuditIntent,
    Decision,
    Op,
    Phase,
    PoolSnapshot,
    Preconditions,
    RevokeLeases,
)
from hotseat_pool_controller.store.codec import set_state


def decide_resident_lost(
    snap: PoolSnapshot, member: str, reason: str, *, revoke: bool = False
) -> Decision:
    """The resident is dead out of band: forget it so the next acquire recovers.

    Never while it serves: without ``revoke`` the decision requires that the member has no
    live lease (and is not being relearned); with ``revoke`` (the driver confirmed it gone)
    its leases are dropped too, so renewals are refused and routers end their streams."""
    if snap.resident != member or snap.phase not in SERVING:
        return NOTHING
    if snap.serving(member) and not revoke:
        return NOTHING
    ops: tuple[Op, ...] = (
        set_state(
            phase=Phase.IDLE,
            resident=None,
            target=None,
            unhealthy=False,
            relearn_ms=None,
            epoch=next_epoch(snap),
        ),
    )
    if revoke:
        ops = (*ops, RevokeLeases(member))
    return Decision(
        ops=ops,
        pre=Preconditions(version=snap.version, zero_leases=() if revoke else (member,)),
        audit=(
            AuditIntent(PoolOutcome.RESIDENT_LOST, member=member, epoch=snap.epoch, reason=reason),
        ),
    )


def decide_resident_health(snap: PoolSnapshot, member: str, *, healthy: bool) -> Decision:
    """Mark (or clear) a resident that fails its health checks while it serves."""
    if snap.resident != member or snap.phase not in SERVING:
        return NOTHING
    if snap.unhealthy is not healthy:
        return NOTHING  # already as asked
    return Decision(
        ops=(set_state(unhealthy=not healthy),),
        pre=Preconditions(version=snap.version),
    )


def decide_rebuild(
    snap: PoolSnapshot,
    on_gpu: tuple[str, ...],
    *,
    unhealthy: bool = False,
    relearn_ms: int = 0,
    capacity: bool = False,
    unwell: frozenset[str] = frozenset(),
) -> Decision:
    """State was lost (missing, or written on another Redis server): take residency from
    what the drivers report as running (``on_gpu``; a lone member is the resident, marked
    ``unhealthy`` when it does not answer yet: still loading, or stalled under streams),
    and count the resident busy for ``relearn_ms`` while routers renew the leases the
    store forgot. (The store records which server the new state is written on.)"""
    if snap.phase != Phase.UNKNOWN:
        return NOTHING
    if capacity:
        # A capacity pool (docs/adr/0008): every member on the GPU is a resident, each
        # busy while routers renew the leases the store forgot; one that does not answer
        # (still loading, or stalled under its streams) is unwell, never taken for gone.
        return Decision(
            ops=(
                set_state(
                    phase=Phase.IDLE,
                    resident=None,
                    residents=frozenset(on_gpu),
                    evicts=(),
                    also=(),
                    unwell=unwell & frozenset(on_gpu),
                    target=None,
                    from_member=None,
                    owner=None,
                    forced=False,
                    parked=False,
                    unhealthy=False,
                    relearn_ms=snap.now_ms + relearn_ms if on_gpu else None,
                    epoch=next_epoch(snap),
                    rebuilt_epoch=next_epoch(snap),
                ),
            ),
            pre=Preconditions(state_unknown=True),
        )
    resident = on_gpu[0] if len(on_gpu) == 1 else None
    return Decision(
        ops=(
            set_state(
                phase=Phase.IDLE,
                resident=resident,
                target=None,
                from_member=None,
                owner=None,
                forced=False,
                parked=False,
                unhealthy=bool(resident) and unhealthy,
                relearn_ms=snap.now_ms + relearn_ms if resident else None,
                epoch=next_epoch(snap),
                rebuilt_epoch=next_epoch(snap),
            ),
        ),
        pre=Preconditions(state_unknown=True),
    )
