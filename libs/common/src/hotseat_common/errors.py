"""Hotseat's exception tree. Each error has a stable ``code`` used on every wire.

    HotseatError
    ├── ConfigError                 invalid_config          (config/errors.py)
    ├── ActivationError             the pool could not give a lease
    │   ├── IncumbentBusy           pool_incumbent_busy     IfIdle and the incumbent serves
    │   ├── ActivationTimeout       pool_activation_timeout the swap budget elapsed
    │   ├── QueueFull               pool_queue_full         maxWaiters reached
    │   ├── SwapFailed              swap_failed             the load failed or timed out
    │   ├── UnknownPool             unknown_pool
    │   └── ControllerUnavailable   controller_unavailable  no controller answered / store down
    └── LeaseLost                   lease_lost              renewal refused: the lease expired

Errors are translated at the edges only: the router maps codes to HTTP statuses and
OpenAI error bodies, the controller to NATS service error headers.
"""

from __future__ import annotations


class HotseatError(Exception):
    """Root of every error Hotseat raises on purpose."""

    code = "internal_error"


class ActivationError(HotseatError):
    """The pool controller could not (yet) give an activation lease."""

    code = "activation_error"

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class IncumbentBusy(ActivationError):
    code = "pool_incumbent_busy"


class ActivationTimeout(ActivationError):
    code = "pool_activation_timeout"


class QueueFull(ActivationError):
    code = "pool_queue_full"


class SwapFailed(ActivationError):
    code = "swap_failed"


class UnknownPool(ActivationError):
    code = "unknown_pool"


class ControllerUnavailable(ActivationError):
    code = "controller_unavailable"


class LeaseLost(HotseatError):
    code = "lease_lost"


ACTIVATION_ERRORS: dict[str, type[ActivationError]] = {
    cls.code: cls
    for cls in (
        IncumbentBusy,
        ActivationTimeout,
        QueueFull,
        SwapFailed,
        UnknownPool,
        ControllerUnavailable,
    )
}
"""Wire code -> exception class, for clients that receive an error code over NATS."""
