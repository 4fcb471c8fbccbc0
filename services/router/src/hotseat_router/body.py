"""Reading a request body once, with a size limit, and the little of it routing needs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from hotseat_router.asgi import Receive
from hotseat_router.errors import BodyTooLarge, ClientDisconnected, InvalidJson, InvalidRequest


async def read_body(receive: Receive, *, content_length: int | None, limit: int) -> bytes:
    """The whole body; 413 as soon as the declared or received size passes ``limit``."""
    if content_length is not None and content_length > limit:
        raise BodyTooLarge(f"request body is larger than {limit} bytes")
    message = await receive()
    if message["type"] == "http.disconnect":
        raise ClientDisconnected("client left while sending the body")
    body: bytes = message.get("body", b"")
    if len(body) > limit:
        raise BodyTooLarge(f"request body is larger than {limit} bytes")
    if not message.get("more_body", False):
        return body
    chunks = [body]
    size = len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected("client left while sending the body")
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body is larger than {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


@dataclass(frozen=True, slots=True)
class RoutingFields:
    """What routing reads from a body; the rest is forwarded untouched."""

    model: str
    stream: bool
    document: dict[str, Any]


def parse_body(body: bytes) -> RoutingFields:
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidJson(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise InvalidJson("request body must be a JSON object")
    model = document.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' must be a non-empty string")
    return RoutingFields(model=model, stream=document.get("stream") is True, document=document)


def with_model(fields: RoutingFields, model: str) -> bytes:
    """The body with ``model`` replaced (the only case where the router re-encodes it)."""
    return orjson.dumps({**fields.document, "model": model})
