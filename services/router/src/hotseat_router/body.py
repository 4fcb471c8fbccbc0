"""Reading a request body once, with a size limit, and the little of it routing needs."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from itertools import accumulate

import orjson

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


MAX_JSON_DEPTH = 254
"""The deepest document the router accepts at most: orjson writes no deeper (it reads
1024 levels), and a body is only taken when the router could write it back."""

_DELTA = tuple(1 if c in b"{[" else -1 if c in b"}]" else 0 for c in range(256))
_NOT_STRUCTURE = bytes(range(256)).translate(None, b"{}[]:")


@dataclass(frozen=True, slots=True)
class RoutingFields:
    """What routing reads from a body; the bytes themselves are forwarded untouched."""

    model: str
    stream: bool


def parse_body(body: bytes, *, max_depth: int = MAX_JSON_DEPTH) -> RoutingFields:
    """``model`` and ``stream`` of a JSON object body, refused (400) unless the router and
    every upstream must read it alike: valid JSON, at most ``max_depth`` levels deep, no
    key twice in any object."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidJson(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise InvalidJson("request body must be a JSON object")
    depth, keys = _shape(body)
    if depth > max_depth:
        raise InvalidRequest(f"request body is nested deeper than {max_depth} levels")
    # The parsed document keeps one value per key; written back, it has as many keys as
    # the body had only when no object of the body repeated one.
    if _shape(orjson.dumps(document))[1] != keys:
        raise InvalidRequest("request body has a duplicate key in an object")
    model = document.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' must be a non-empty string")
    return RoutingFields(model=model, stream=document.get("stream") is True)


def _shape(valid_json: bytes) -> tuple[int, int]:
    """Nesting depth and number of object keys of a valid JSON text, both read from its
    structure outside strings (brackets and colons), in C-speed byte operations."""
    # Inside a string every backslash starts an escape: drop escaped backslashes, then
    # escaped quotes, and every quote left opens or closes a string.
    unescaped = valid_json.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside = b"".join(unescaped.split(b'"')[::2]).translate(None, _NOT_STRUCTURE)
    depth = max(accumulate(map(_DELTA.__getitem__, outside)), default=0)
    return depth, outside.count(b":")
