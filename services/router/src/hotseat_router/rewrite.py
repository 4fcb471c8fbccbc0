"""The body a backend with its own ``model`` gets: the client's bytes with only the value
of the top-level ``model`` key replaced, every other byte (numbers, spacing, key order,
escapes) as the client sent it."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from json.decoder import scanstring  # type: ignore[attr-defined]  # public, not in the stub
from json.scanner import make_scanner

import orjson

_WHITESPACE = re.compile(r"[ \t\n\r]*")
# Numbers stay text: nothing is converted (no limit on digits), only skipped over. (The
# stub types make_scanner's argument as a scanner; it takes the decoder.)
_DECODER = json.JSONDecoder(parse_int=str, parse_float=str, parse_constant=str)
_SKIP_VALUE = make_scanner(_DECODER)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class ModelSlot:
    """Where the top-level ``model`` value lies in a body, in bytes: ``body[start:end]``."""

    start: int
    end: int


def locate_model(body: bytes) -> ModelSlot:
    """The slot of ``model`` in a body :func:`~hotseat_router.body.parse_body` accepted
    (valid JSON, an object, ``model`` a string, no key twice)."""
    text = body.decode()
    at = _skip(text, 0) + 1  # past "{"
    while True:
        at = _skip(text, at)
        key, at = scanstring(text, at + 1)  # the key's decoded value, escapes and all
        at = _skip(text, _skip(text, at) + 1)  # past ":"
        start = at
        _, at = _SKIP_VALUE(text, at)
        if key == "model":
            return _in_bytes(body, text, start, at)
        at = _skip(text, at) + 1  # past ","


def with_model(body: bytes, slot: ModelSlot, model: str) -> tuple[bytes | memoryview, ...]:
    """The renamed body as pieces to send one after the other: views of the client's
    bytes around the new value, so a large body is never copied to be renamed."""
    view = memoryview(body)
    return (view[: slot.start], orjson.dumps(model), view[slot.end :])


def _skip(text: str, at: int) -> int:
    found = _WHITESPACE.match(text, at)
    assert found is not None  # noqa: S101 - the pattern matches the empty string
    return found.end()


def _in_bytes(body: bytes, text: str, start: int, end: int) -> ModelSlot:
    """Character offsets in ``text`` (``body`` decoded) as byte offsets in ``body``."""
    if len(text) == len(body):  # ASCII: one byte per character
        return ModelSlot(start, end)
    byte_start = len(text[:start].encode())
    return ModelSlot(byte_start, byte_start + len(text[start:end].encode()))
