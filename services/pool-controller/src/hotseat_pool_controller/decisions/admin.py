"""Admin actions: an operator forces a member in, or empties the GPU. Refused while a swap
runs or the incumbent serves (live leases, or busy ``/slots`` under
``busySignal: leasesAndSlots``)."""

from __future__ import annotations

from hotseat_common.errors import ErrorCode
from hotseat_common.messages import ErrorReply, SwapReason, WaitReason, WaitReply
from hotseat_pool_controller.decisions.busy import (
    NOT_READ,
    SlotsRead,
    busy_in_service,
    read_resident_first,
)
from hotseat_pool_controller.decisions.capacity import (
    decide_capacity_admin_swap,
    decide_capacity_admin_unload,
)
from hotseat_pool_controller.decisions.start import start_swap
from hotseat_pool_controller.model import (
    IN_FLIGHT,
    Decision,
    Phase,
    PoolPolicy,
    PoolSnapshot,
)


def decide_admin_swap(
    snap: PoolSnapshot,
    member: str,
    controller: str,
    policy: PoolPolicy,
    *,
    slots_busy: SlotsRead = NOT_READ,
) -> Decision:
    """An operator forces ``member`` in."""
    if member not in policy.members:
        return Decision(
            reply=ErrorReply(code=ErrorCode.UNKNOWN_MEMBER, message=f"no member {member!r}")
        )
    if (refused := _in_flight(snap)) is not None:
        return refused
    if policy.has_capacity:
        return decide_capacity_admin_swap(snap, member, controller, policy, slots_busy)
    if snap.resident == member:
        return Decision(
            reply=WaitReply(
                reason=WaitReason.SWAP_IN_FLIGHT, target=None, epoch=snap.epoch, retry_after_s=0
            )
        )
    return _start(
        snap, policy, controller, target=member, reason=SwapReason.ADMIN, slots_busy=slots_busy
    )


def decide_admin_unload(
    snap: PoolSnapshot, controller: str, policy: PoolPolicy, *, slots_busy: SlotsRead = NOT_READ
) -> Decision:
    """An operator empties the GPU: unload the resident, then stay cold until demand."""
    if (refused := _in_flight(snap)) is not None:
        return refused
    if policy.has_capacity:
        return decide_capacity_admin_unload(snap, controller, policy, slots_busy)
    return _start(
        snap, policy, controller, target=None, reason=SwapReason.ADMIN_UNLOAD, slots_busy=slots_busy
    )


def _in_flight(snap: PoolSnapshot) -> Decision | None:
    if snap.phase == Phase.UNKNOWN or snap.phase in IN_FLIGHT:
        return Decision(
            reply=ErrorReply(code=ErrorCode.SWAP_IN_FLIGHT, message=f"pool is {snap.phase.value}")
        )
    return None


def _start(
    snap: PoolSnapshot,
    policy: PoolPolicy,
    controller: str,
    *,
    target: str | None,
    reason: SwapReason,
    slots_busy: SlotsRead,
) -> Decision:
    refused = _refusal(snap, policy, slots_busy)
    if refused is not None:
        return refused
    # An operator's action ignores waiters: only the incumbent's leases guard it.
    start = start_swap(
        snap, policy, controller, target, reason=reason, forced=True, guard_waiters=False
    )
    return start.decision(start.wait_reply(snap))


def _refusal(snap: PoolSnapshot, policy: PoolPolicy, slots_busy: SlotsRead) -> Decision | None:
    """Why an admin swap or unload must not cut the incumbent now (None: it may)."""
    if snap.live_leases(snap.resident) > 0:
        return Decision(
            reply=ErrorReply(
                code=ErrorCode.INCUMBENT_BUSY,
                message=f"{snap.resident} holds {snap.live_leases(snap.resident)} live lease(s)",
            )
        )
    if snap.serving(snap.resident):
        return Decision(
            reply=ErrorReply(
                code=ErrorCode.INCUMBENT_BUSY,
                message=f"{snap.resident} may still serve: the store lost its leases and is "
                "relearning them (one lease TTL after the rebuild)",
            )
        )
    if (check := read_resident_first(snap, policy, slots_busy)) is not None:
        return check
    if snap.resident is not None and busy_in_service(slots_busy, snap.resident):
        return Decision(
            reply=ErrorReply(
                code=ErrorCode.INCUMBENT_BUSY,
                message=f"{snap.resident}'s /slots reports requests in progress",
            )
        )
    return None
