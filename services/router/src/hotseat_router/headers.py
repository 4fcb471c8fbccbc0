"""Header hygiene between client, router and upstream.

Hop-by-hop headers (RFC 9110 section 7.6.1, plus any the ``Connection`` header names)
never cross the router; the client's ``Authorization`` is the client's credential for
the router and never reaches an upstream; a cloud backend gets its own Bearer key.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from hotseat_common.headers import PLACEMENT

REQUEST_ID = "x-hotseat-request-id"
BACKEND = "x-hotseat-backend"
HOLD_MS = "x-hotseat-hold-ms"
"""On a pooled backend's response: how long the request was held for its lease (ms)."""
SWAP_ID = "x-hotseat-swap-id"
"""On a pooled backend's response: the swap the request caused or waited for (ADR 0010),
absent when none was in its way."""
REQUEST_ID_B = REQUEST_ID.encode()
BACKEND_B = BACKEND.encode()
HOLD_MS_B = HOLD_MS.encode()
PLACEMENT_B = PLACEMENT.encode()
SWAP_ID_B = SWAP_ID.encode()

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
    }
)
_NOT_FORWARDED = HOP_BY_HOP | {
    b"host",
    b"content-length",
    b"authorization",
    b"expect",
    REQUEST_ID_B,
}
_NOT_RETURNED = HOP_BY_HOP | {
    b"date",
    b"server",
    REQUEST_ID_B,
    BACKEND_B,
    HOLD_MS_B,
    PLACEMENT_B,
    SWAP_ID_B,
}
"""``date`` and ``server`` are the router's own (the server adds them)."""

_REQUEST_ID_OK = re.compile(rb"^[A-Za-z0-9._:\-]{1,128}$")


def request_id_of(value: bytes | None) -> str:
    """The request's id: the client's own ``x-hotseat-request-id`` when it is a safe token,
    else a new one."""
    if value is None or _REQUEST_ID_OK.match(value) is None:
        return os.urandom(16).hex()
    return value.decode("ascii")


def _connection_listed(headers: Iterable[tuple[bytes, bytes]]) -> frozenset[bytes]:
    listed: set[bytes] = set()
    for name, value in headers:
        if name == b"connection":
            listed.update(t.strip().lower() for t in value.split(b",") if t.strip())
    return frozenset(listed)


def end_to_end_headers(client_headers: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    """The client's headers an upstream gets, as text the upstream client writes back to
    the very bytes the client sent (it writes UTF-8). Raises ``UnicodeDecodeError`` for
    a value that is not UTF-8 (obs-text bytes), which could not be forwarded exactly."""
    listed = _connection_listed(client_headers)
    return [
        (name.decode("ascii"), value.decode("utf-8"))
        for name, value in client_headers
        if name not in _NOT_FORWARDED and name not in listed
    ]


def upstream_request_headers(
    end_to_end: list[tuple[str, str]], *, request_id: str, bearer: str | None
) -> list[tuple[str, str]]:
    """What the upstream receives: the client's end-to-end headers and our request id."""
    out = [*end_to_end, (REQUEST_ID, request_id)]
    if bearer:
        out.append(("authorization", f"Bearer {bearer}"))
    return out


def client_response_headers(
    upstream_headers: Iterable[tuple[bytes, bytes]],
    *,
    backend: bytes,
    request_id: bytes,
    hold_ms: int | None = None,
    placement: str | None = None,
    swap_id: str | None = None,
) -> list[tuple[bytes, bytes]]:
    """What the client receives: the upstream's end-to-end headers and ours (``hold_ms``
    for a pooled backend: how long the request waited for its lease; ``placement`` for a
    model group's request: where it was placed and why; ``swap_id``: the swap it caused
    or waited for)."""
    lowered = [(name.lower(), value) for name, value in upstream_headers]
    listed = _connection_listed(lowered)
    out = [
        (name, value) for name, value in lowered if name not in _NOT_RETURNED and name not in listed
    ]
    out.append((BACKEND_B, backend))
    out.append((REQUEST_ID_B, request_id))
    if hold_ms is not None:
        out.append((HOLD_MS_B, str(hold_ms).encode()))
    if placement is not None:
        out.append((PLACEMENT_B, placement.encode()))
    if swap_id is not None:
        out.append((SWAP_ID_B, swap_id.encode()))
    return out
