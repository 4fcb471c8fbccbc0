"""Reading a request body once, with a size limit, and the little of it routing needs."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import jiter

from hotseat_router.asgi import Receive
from hotseat_router.budget import BodyClaim
from hotseat_router.errors import (
    BodyTooLarge,
    ClientDisconnected,
    InvalidJson,
    InvalidRequest,
    ReadTimeout,
)


async def read_body(
    receive: Receive,
    *,
    content_length: int | None,
    limit: int,
    claim: BodyClaim,
    timeout: float,
) -> bytes:
    """The whole body: 413 as soon as the declared or received size passes ``limit``, 503
    when the process's body budget cannot hold it (``claim`` covers it, declared size
    first), 408 when it has not all arrived within ``timeout`` seconds."""
    if content_length is not None:
        if content_length > limit:
            raise BodyTooLarge(f"request body is larger than {limit} bytes")
        claim.cover(content_length)
    try:
        async with asyncio.timeout(timeout):
            return await _read(receive, limit, claim)
    except TimeoutError:
        raise ReadTimeout(f"request body not received within {timeout:g}s") from None


async def _read(receive: Receive, limit: int, claim: BodyClaim) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected("client left while sending the body")
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body is larger than {limit} bytes")
        claim.cover(size)
        if not message.get("more_body", False):
            return chunk if not chunks else b"".join([*chunks, chunk])
        chunks.append(chunk)


MAX_JSON_DEPTH = 200
"""The deepest document the router accepts at most (the body itself is level 1): its
parser reads no deeper than 201 levels."""

_DUPLICATE_KEY = "Detected duplicate key"
_TOO_DEEP = "recursion limit exceeded"


@dataclass(frozen=True, slots=True)
class RoutingFields:
    """What routing reads from a body; the bytes themselves are forwarded untouched."""

    model: str
    stream: bool
    user: str | None = None
    """The OpenAI ``user`` field: a model group's conversation when no session header is
    sent (docs/adr/0012)."""


def parse_body(body: bytes, *, max_depth: int = MAX_JSON_DEPTH) -> RoutingFields:
    """``model`` and ``stream`` of a JSON object body, refused (400) unless the router and
    every upstream must read it alike: strict JSON (UTF-8, no NaN or Infinity, no
    trailing data), at most ``max_depth`` levels deep, no key twice in any object.

    One pass of a strict parser (jiter) that refuses a repeated key itself; the document
    it builds lives only for this call, and the call never yields to the event loop, so
    a process holds at most one such document at a time whatever its concurrency."""
    try:
        document = jiter.from_json(body, allow_inf_nan=False, catch_duplicate_keys=True)
    except ValueError as exc:
        reason = str(exc)
        if reason.startswith(_DUPLICATE_KEY):
            # Not the parser's words: they quote the key, which may be of any size.
            raise InvalidRequest("request body has a duplicate key in an object") from None
        if reason.startswith(_TOO_DEEP):
            raise InvalidRequest(f"request body is nested deeper than {max_depth} levels") from None
        raise InvalidJson(f"request body is not valid JSON: {reason}") from None
    if not isinstance(document, dict):
        raise InvalidJson("request body must be a JSON object")
    if _deeper_than(document, body, max_depth):
        raise InvalidRequest(f"request body is nested deeper than {max_depth} levels")
    model = document.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' must be a non-empty string")
    user = document.get("user")
    return RoutingFields(
        model=model,
        stream=document.get("stream") is True,
        user=user if isinstance(user, str) and user else None,
    )


def _deeper_than(document: dict[str, Any], body: bytes, limit: int) -> bool:
    """True when ``document`` (level 1) holds a container below level ``limit``.

    Each level needs an opening bracket, so a body with no more of them than ``limit``
    cannot be too deep (a count at C speed, the common case); else the containers are
    walked a level at a time, without recursion."""
    if body.count(b"{") + body.count(b"[") <= limit:
        return False
    nodes: list[Any] = [document]
    level = 1
    while nodes:
        if level > limit:
            return True
        deeper: list[Any] = []
        add = deeper.append
        for node in nodes:
            for child in node.values() if type(node) is dict else node:
                kind = type(child)
                if kind is dict or kind is list:
                    add(child)
        nodes = deeper
        level += 1
    return False
