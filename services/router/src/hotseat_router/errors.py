"""The router's errors and the one table that turns any Hotseat error into an HTTP answer.

    HotseatError                      (hotseat_common.errors)
    ├── ActivationError ...           pool_* / swap_failed / controller_unavailable
    └── RouterError
        ├── InvalidJson               invalid_json            400
        ├── InvalidRequest            invalid_request         400
        ├── Unauthorized              invalid_api_key         401
        ├── BodyTooLarge              request_too_large       413
        ├── ModelNotFound             model_not_found         404
        ├── FailClosed                fail_closed             503 + Retry-After
        ├── AllBackendsFailed         all_backends_failed     502
        ├── DeadlineExceeded          request_timeout         504
        └── ClientDisconnected        client_disconnected     (nobody to answer)

Each code maps to a status, an OpenAI error ``type`` and the audit outcome of the request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import orjson

from hotseat_common.errors import HotseatError
from hotseat_common.messages.audit import RequestOutcome

DEFAULT_RETRY_AFTER = 1.0


class RouterError(HotseatError):
    """An answer the router gives on its own, without a backend's response."""

    code = "internal_error"

    def __init__(
        self, message: str, *, retry_after: float | None = None, reason: str | None = None
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.reason = reason


class InvalidJson(RouterError):
    code = "invalid_json"


class InvalidRequest(RouterError):
    code = "invalid_request"


class Unauthorized(RouterError):
    code = "invalid_api_key"


class BodyTooLarge(RouterError):
    code = "request_too_large"


class ModelNotFound(RouterError):
    code = "model_not_found"


class FailClosed(RouterError):
    code = "fail_closed"


class AllBackendsFailed(RouterError):
    code = "all_backends_failed"


class DeadlineExceeded(RouterError):
    code = "request_timeout"


class ClientDisconnected(RouterError):
    code = "client_disconnected"


@dataclass(frozen=True, slots=True)
class ErrorSpec:
    status: int
    type: str
    outcome: RequestOutcome
    retry: bool = False
    """Whether the answer carries ``Retry-After``."""


_REJECTED = RequestOutcome.REJECTED
ERROR_TABLE: dict[str, ErrorSpec] = {
    "invalid_json": ErrorSpec(400, "invalid_request_error", _REJECTED),
    "invalid_request": ErrorSpec(400, "invalid_request_error", _REJECTED),
    "invalid_api_key": ErrorSpec(401, "invalid_request_error", _REJECTED),
    "request_too_large": ErrorSpec(413, "invalid_request_error", _REJECTED),
    "model_not_found": ErrorSpec(404, "invalid_request_error", RequestOutcome.NO_ROUTE),
    "fail_closed": ErrorSpec(503, "server_error", RequestOutcome.FAIL_CLOSED, retry=True),
    "controller_unavailable": ErrorSpec(
        503, "server_error", RequestOutcome.FAIL_CLOSED, retry=True
    ),
    "pool_activation_timeout": ErrorSpec(
        503, "server_error", RequestOutcome.POOL_ACTIVATION_TIMEOUT, retry=True
    ),
    "pool_incumbent_busy": ErrorSpec(
        503, "server_error", RequestOutcome.POOL_INCUMBENT_BUSY, retry=True
    ),
    "pool_queue_full": ErrorSpec(503, "server_error", RequestOutcome.POOL_QUEUE_FULL, retry=True),
    "all_backends_failed": ErrorSpec(502, "server_error", RequestOutcome.ALL_BACKENDS_FAILED),
    "request_timeout": ErrorSpec(504, "server_error", RequestOutcome.ALL_BACKENDS_FAILED),
    "client_disconnected": ErrorSpec(499, "client_error", RequestOutcome.CLIENT_DISCONNECTED),
}
INTERNAL = ErrorSpec(500, "server_error", RequestOutcome.ALL_BACKENDS_FAILED)


def spec_for(exc: HotseatError) -> ErrorSpec:
    return ERROR_TABLE.get(exc.code, INTERNAL)


def retry_after_seconds(value: float | None) -> int:
    """``Retry-After`` in whole seconds, never below 1."""
    return max(1, math.ceil(value if value is not None else DEFAULT_RETRY_AFTER))


def error_body(message: str, type_: str, code: str) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "code": code}})


def error_answer(exc: HotseatError) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Status, headers and OpenAI error body for ``exc``."""
    spec = spec_for(exc)
    body = error_body(str(exc) or exc.code, spec.type, exc.code)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if spec.retry:
        retry = retry_after_seconds(getattr(exc, "retry_after", None))
        headers.append((b"retry-after", str(retry).encode()))
    return spec.status, headers, body
