"""Hotseat's error codes and exception tree. Each error has a stable ``code`` used on every wire.

    HotseatError                    internal_error
    ├── ConfigError                 invalid_config          (config/errors.py)
    ├── DriverError                 driver_error            (the controller's drivers)
    │   └── Fenced                  fenced                  an older swap owner's command
    ├── RouterError                 (the router's own answers, hotseat_router/errors.py)
    └── ActivationError             activation_error        the pool could not give a lease
        ├── IncumbentBusy           pool_incumbent_busy     IfIdle and the incumbent serves
        ├── ActivationTimeout       pool_activation_timeout the swap budget elapsed
        │   └── EtaOverBudget       eta_over_budget         it could not be served in time
        ├── QueueFull               pool_queue_full         maxWaiters reached
        ├── SwapFailed              swap_failed             the load failed or timed out
        ├── UnknownPool             unknown_pool
        └── ControllerUnavailable   controller_unavailable  no controller answered / store down

Every code that crosses a process (NATS replies, HTTP error bodies, SSE error events,
the audit API) is an :class:`ErrorCode`; no other module spells one. Errors are
translated at the edges only: the router maps codes to HTTP statuses and OpenAI error
bodies (one table), the controller to NATS service error headers
(:func:`hotseat_common.headers.service_error`).
"""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    """Every error code Hotseat puts on a wire."""

    INTERNAL_ERROR = "internal_error"
    INVALID_CONFIG = "invalid_config"
    # the activation protocol (controller replies, router exceptions)
    ACTIVATION_ERROR = "activation_error"
    POOL_INCUMBENT_BUSY = "pool_incumbent_busy"
    POOL_ACTIVATION_TIMEOUT = "pool_activation_timeout"
    ETA_OVER_BUDGET = "eta_over_budget"
    """Refused at once: the earliest the member can be served is past the request's hold
    (answered as ``pool_activation_timeout``, with this as its reason)."""
    POOL_QUEUE_FULL = "pool_queue_full"
    SWAP_FAILED = "swap_failed"
    UNKNOWN_POOL = "unknown_pool"
    CONTROLLER_UNAVAILABLE = "controller_unavailable"
    BAD_REQUEST = "bad_request"
    """A NATS request the controller cannot parse."""
    RECONCILING = "reconciling"
    """A renewal the controller cannot judge: the pool state is being rebuilt."""
    LEASE_LOST = "lease_lost"
    """A stream ended because its lease was refused or could not be renewed in time."""
    # the controller's admin API (409 answers)
    INCUMBENT_BUSY = "incumbent_busy"
    """An admin swap or unload refused: the incumbent serves (leases, or busy /slots)."""
    SWAP_IN_FLIGHT = "swap_in_flight"
    UNKNOWN_MEMBER = "unknown_member"
    # residency drivers
    DRIVER_ERROR = "driver_error"
    FENCED = "fenced"
    # the router's own answers (status and OpenAI type in hotseat_router/errors.py)
    INVALID_JSON = "invalid_json"
    INVALID_REQUEST = "invalid_request"
    INVALID_API_KEY = "invalid_api_key"
    REQUEST_TOO_LARGE = "request_too_large"
    MODEL_NOT_FOUND = "model_not_found"
    UNKNOWN_URL = "unknown_url"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    FAIL_CLOSED = "fail_closed"
    ALL_BACKENDS_FAILED = "all_backends_failed"
    REQUEST_TIMEOUT = "request_timeout"
    CLIENT_DISCONNECTED = "client_disconnected"
    REQUEST_HEADERS_TOO_LARGE = "request_headers_too_large"
    REQUEST_READ_TIMEOUT = "request_read_timeout"
    """The client took longer than its limit to send a request's headers or body."""
    TOO_MANY_CONNECTIONS = "too_many_connections"
    BODY_BUDGET_EXCEEDED = "body_budget_exceeded"
    """The router already buffers as many request body bytes as it allows at once."""
    STREAM_IDLE_TIMEOUT = "stream_idle_timeout"
    UPSTREAM_BODY_ERROR = "upstream_body_error"
    # the audit service's query API
    INVALID_PARAMETER = "invalid_parameter"
    INVALID_CURSOR = "invalid_cursor"
    STORE_UNAVAILABLE = "store_unavailable"
    SWAP_NOT_FOUND = "swap_not_found"
    """No stored event carries the swap id asked for."""


class HotseatError(Exception):
    """Root of every error Hotseat raises on purpose."""

    code = ErrorCode.INTERNAL_ERROR


class ActivationError(HotseatError):
    """The pool controller could not (yet) give an activation lease."""

    code = ErrorCode.ACTIVATION_ERROR

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class IncumbentBusy(ActivationError):
    code = ErrorCode.POOL_INCUMBENT_BUSY


class ActivationTimeout(ActivationError):
    code = ErrorCode.POOL_ACTIVATION_TIMEOUT


class EtaOverBudget(ActivationTimeout):
    """The pool cannot serve the request within what is left of its hold: refused at once
    rather than held to its end (an activation timeout whose reason says so)."""

    wire_code = ErrorCode.ETA_OVER_BUDGET
    reason = ErrorCode.ETA_OVER_BUDGET.value


class QueueFull(ActivationError):
    code = ErrorCode.POOL_QUEUE_FULL


class SwapFailed(ActivationError):
    code = ErrorCode.SWAP_FAILED


class UnknownPool(ActivationError):
    code = ErrorCode.UNKNOWN_POOL


class ControllerUnavailable(ActivationError):
    code = ErrorCode.CONTROLLER_UNAVAILABLE


ACTIVATION_ERRORS: dict[ErrorCode, type[ActivationError]] = {
    getattr(cls, "wire_code", cls.code): cls
    for cls in (
        IncumbentBusy,
        ActivationTimeout,
        EtaOverBudget,
        QueueFull,
        SwapFailed,
        UnknownPool,
        ControllerUnavailable,
    )
}
"""Wire code -> exception class, for clients that receive an error code over NATS."""
