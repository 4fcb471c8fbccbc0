"""The router's errors and the one table that turns any Hotseat error into an HTTP answer.

    HotseatError                      (hotseat_common.errors)
    ├── ActivationError ...           pool_* / swap_failed / controller_unavailable
    └── RouterError                   internal_error          500 (internal_error())
        ├── InvalidJson               invalid_json            400
        ├── InvalidRequest            invalid_request         400
        ├── Unauthorized              invalid_api_key         401
        ├── BodyTooLarge              request_too_large       413
        ├── HeadersTooLarge           request_headers_too_large 431
        ├── ReadTimeout               request_read_timeout    408
        ├── TooManyConnections        too_many_connections    503 + Retry-After
        ├── BodyBudgetExceeded        body_budget_exceeded    503 + Retry-After
        ├── ModelNotFound             model_not_found         404
        ├── UnknownUrl                unknown_url             404
        ├── MethodNotAllowed          method_not_allowed      405 + Allow
        ├── FailClosed                fail_closed             503 + Retry-After
        ├── AllBackendsFailed         all_backends_failed     502
        ├── DeadlineExceeded          request_timeout         504
        └── ClientDisconnected        client_disconnected     (nobody to answer)

Each code maps to a status, an OpenAI error ``type`` and the audit outcome of the request.
Every body is ``{"error": {"message", "type", "param", "code"}}``; a 500's message never
holds an exception's text, only the request id the log has it under.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import orjson

from hotseat_common.errors import ErrorCode, HotseatError
from hotseat_common.messages.audit import RequestOutcome

DEFAULT_RETRY_AFTER = 1.0


class RouterError(HotseatError):
    """An answer the router gives on its own, without a backend's response."""

    code = ErrorCode.INTERNAL_ERROR

    def __init__(
        self, message: str, *, retry_after: float | None = None, reason: str | None = None
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.reason = reason


class InvalidJson(RouterError):
    code = ErrorCode.INVALID_JSON


class InvalidRequest(RouterError):
    code = ErrorCode.INVALID_REQUEST


class Unauthorized(RouterError):
    code = ErrorCode.INVALID_API_KEY


class BodyTooLarge(RouterError):
    code = ErrorCode.REQUEST_TOO_LARGE


class HeadersTooLarge(RouterError):
    code = ErrorCode.REQUEST_HEADERS_TOO_LARGE


class ReadTimeout(RouterError):
    code = ErrorCode.REQUEST_READ_TIMEOUT


class TooManyConnections(RouterError):
    code = ErrorCode.TOO_MANY_CONNECTIONS


class BodyBudgetExceeded(RouterError):
    code = ErrorCode.BODY_BUDGET_EXCEEDED


class ModelNotFound(RouterError):
    code = ErrorCode.MODEL_NOT_FOUND


class UnknownUrl(RouterError):
    code = ErrorCode.UNKNOWN_URL


class MethodNotAllowed(RouterError):
    code = ErrorCode.METHOD_NOT_ALLOWED

    def __init__(self, message: str, *, allow: str) -> None:
        super().__init__(message)
        self.allow = allow
        """The methods the path does answer (the ``Allow`` header)."""


class FailClosed(RouterError):
    code = ErrorCode.FAIL_CLOSED


class AllBackendsFailed(RouterError):
    code = ErrorCode.ALL_BACKENDS_FAILED


class DeadlineExceeded(RouterError):
    code = ErrorCode.REQUEST_TIMEOUT


class ClientDisconnected(RouterError):
    code = ErrorCode.CLIENT_DISCONNECTED


def internal_error(request_id: str) -> RouterError:
    """The answer to a failure inside the router: a 500 that says nothing of it but the
    request id under which the log has it."""
    return RouterError(f"internal error in the router; quote request id {request_id}")


@dataclass(frozen=True, slots=True)
class ErrorSpec:
    status: int
    type: str
    outcome: RequestOutcome
    retry: bool = False
    """Whether the answer carries ``Retry-After``."""
    close: bool = False
    """Whether the answer closes the connection (the client's request was not read to
    its end, so nothing after it on the connection can be trusted)."""


_REJECTED = RequestOutcome.REJECTED
ERROR_TABLE: dict[ErrorCode, ErrorSpec] = {
    ErrorCode.INVALID_JSON: ErrorSpec(400, "invalid_request_error", _REJECTED),
    ErrorCode.INVALID_REQUEST: ErrorSpec(400, "invalid_request_error", _REJECTED),
    ErrorCode.INVALID_API_KEY: ErrorSpec(401, "invalid_request_error", _REJECTED),
    ErrorCode.REQUEST_TOO_LARGE: ErrorSpec(413, "invalid_request_error", _REJECTED, close=True),
    ErrorCode.REQUEST_HEADERS_TOO_LARGE: ErrorSpec(
        431, "invalid_request_error", _REJECTED, close=True
    ),
    ErrorCode.REQUEST_READ_TIMEOUT: ErrorSpec(408, "invalid_request_error", _REJECTED, close=True),
    ErrorCode.TOO_MANY_CONNECTIONS: ErrorSpec(
        503, "server_error", _REJECTED, retry=True, close=True
    ),
    ErrorCode.BODY_BUDGET_EXCEEDED: ErrorSpec(
        503, "server_error", _REJECTED, retry=True, close=True
    ),
    ErrorCode.MODEL_NOT_FOUND: ErrorSpec(404, "invalid_request_error", RequestOutcome.NO_ROUTE),
    ErrorCode.UNKNOWN_URL: ErrorSpec(404, "invalid_request_error", _REJECTED),
    ErrorCode.METHOD_NOT_ALLOWED: ErrorSpec(405, "invalid_request_error", _REJECTED),
    ErrorCode.FAIL_CLOSED: ErrorSpec(503, "server_error", RequestOutcome.FAIL_CLOSED, retry=True),
    ErrorCode.CONTROLLER_UNAVAILABLE: ErrorSpec(
        503, "server_error", RequestOutcome.FAIL_CLOSED, retry=True
    ),
    ErrorCode.POOL_ACTIVATION_TIMEOUT: ErrorSpec(
        503, "server_error", RequestOutcome.POOL_ACTIVATION_TIMEOUT, retry=True
    ),
    ErrorCode.POOL_INCUMBENT_BUSY: ErrorSpec(
        503, "server_error", RequestOutcome.POOL_INCUMBENT_BUSY, retry=True
    ),
    ErrorCode.POOL_QUEUE_FULL: ErrorSpec(
        503, "server_error", RequestOutcome.POOL_QUEUE_FULL, retry=True
    ),
    ErrorCode.ALL_BACKENDS_FAILED: ErrorSpec(
        502, "server_error", RequestOutcome.ALL_BACKENDS_FAILED
    ),
    ErrorCode.REQUEST_TIMEOUT: ErrorSpec(504, "server_error", RequestOutcome.ALL_BACKENDS_FAILED),
    ErrorCode.CLIENT_DISCONNECTED: ErrorSpec(
        499, "client_error", RequestOutcome.CLIENT_DISCONNECTED
    ),
}
INTERNAL = ErrorSpec(500, "server_error", RequestOutcome.ALL_BACKENDS_FAILED)


def spec_for(exc: HotseatError) -> ErrorSpec:
    return ERROR_TABLE.get(exc.code, INTERNAL)


def retry_after_seconds(value: float | None) -> int:
    """``Retry-After`` in whole seconds, never below 1."""
    return max(1, math.ceil(value if value is not None else DEFAULT_RETRY_AFTER))


def error_body(message: str, type_: str, code: ErrorCode) -> bytes:
    """The OpenAI error body; ``param`` (the request field at fault) is always null, as
    the router never names one."""
    return orjson.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}})


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
    if isinstance(exc, MethodNotAllowed):
        headers.append((b"allow", exc.allow.encode()))
    if spec.close:
        headers.append((b"connection", b"close"))
    return spec.status, headers, body
