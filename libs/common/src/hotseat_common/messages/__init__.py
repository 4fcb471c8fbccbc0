"""Every message that crosses a process, one module per conversation."""

from hotseat_common.messages.activation import (
    ACQUIRE_REPLY,
    Ack,
    AcquireReply,
    AcquireRequest,
    CancelRequest,
    DispatchFailureReport,
    ErrorReply,
    Granted,
    IncumbentBusyReply,
    PoolStateChanged,
    ReleaseRequest,
    RenewReply,
    RenewRequest,
    WaitReason,
    WaitReply,
)
from hotseat_common.messages.audit import (
    AuditEvent,
    PoolOutcome,
    RequestOutcome,
    SwapReason,
    pool_event,
    request_event,
)
from hotseat_common.messages.base import WireModel
from hotseat_common.messages.placement import PlacementReason, PlaceReply, PlaceRequest
from hotseat_common.messages.pools import (
    POOL_UPDATES_ERROR_EVENT,
    POOL_UPDATES_EVENT,
    POOL_UPDATES_PATH,
    PoolList,
    PoolView,
)

__all__ = [
    "ACQUIRE_REPLY",
    "POOL_UPDATES_ERROR_EVENT",
    "POOL_UPDATES_EVENT",
    "POOL_UPDATES_PATH",
    "Ack",
    "AcquireReply",
    "AcquireRequest",
    "AuditEvent",
    "CancelRequest",
    "DispatchFailureReport",
    "ErrorReply",
    "Granted",
    "IncumbentBusyReply",
    "PlaceReply",
    "PlaceRequest",
    "PlacementReason",
    "PoolList",
    "PoolOutcome",
    "PoolStateChanged",
    "PoolView",
    "ReleaseRequest",
    "RenewReply",
    "RenewRequest",
    "RequestOutcome",
    "SwapReason",
    "WaitReason",
    "WaitReply",
    "WireModel",
    "pool_event",
    "request_event",
]
