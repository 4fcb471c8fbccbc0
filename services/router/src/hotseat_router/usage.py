"""Token usage from the upstream's answer, read as the body goes by, never buffered whole.

OpenAI-compatible servers put a ``usage`` object (``prompt_tokens``,
``completion_tokens``) near the end of what they send: last in a JSON body (chat,
completions, embeddings), and in the last event before ``data: [DONE]`` of a stream whose
request asked for ``stream_options: {"include_usage": true}`` (earlier events of such a
stream say ``"usage": null``). So the meter keeps only the last :data:`WINDOW` bytes of
the body (whole chunks; the relay writes each chunk on at once) and, when the body ends,
reads the last ``"usage": {...}`` object in them. A body whose usage lies further from
its end (or that has none) counts nothing: the usage is then unknown, not zero.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import orjson

WINDOW = 8 * 1024
"""Bytes kept from the end of the body: an SSE usage event with its ``[DONE]`` after it,
or a JSON body's usage with its closing fields, fits many times over."""
_KEY = b'"usage"'
_SPACE = b" \t\r\n"


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int


class UsageMeter:
    """Fed each chunk of one response body; :meth:`usage` once it ended."""

    __slots__ = ("_chunks", "_size")

    def __init__(self) -> None:
        self._chunks: deque[bytes] = deque()
        self._size = 0

    def feed(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._size += len(chunk)
        while len(self._chunks) > 1 and self._size - len(self._chunks[0]) >= WINDOW:
            self._size -= len(self._chunks.popleft())

    def usage(self) -> Usage | None:
        """The body's last usage object, if the kept window holds one."""
        return find_usage(b"".join(self._chunks))


def find_usage(text: bytes) -> Usage | None:
    """The last ``"usage": {...}`` of ``text`` with whole-number token counts."""
    end = len(text)
    while (at := text.rfind(_KEY, 0, end)) >= 0:
        end = at
        found = _object_after(text, at + len(_KEY))
        if found is None:
            continue
        try:
            value = orjson.loads(found)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(value, dict):
            continue
        prompt = _count(value.get("prompt_tokens"))
        completion = _count(value.get("completion_tokens", 0))  # embeddings: none
        if prompt is not None and completion is not None:
            return Usage(prompt, completion)
    return None


def _count(value: object) -> int | None:
    return value if type(value) is int and value >= 0 else None


def _object_after(text: bytes, start: int) -> bytes | None:
    """The ``{...}`` that follows ``: `` at ``start`` (braces inside strings counted: the
    usage object holds numbers and nested objects only)."""
    i = start
    while i < len(text) and text[i] in _SPACE:
        i += 1
    if i >= len(text) or text[i] != ord(":"):
        return None
    i += 1
    while i < len(text) and text[i] in _SPACE:
        i += 1
    if i >= len(text) or text[i] != ord("{"):
        return None
    # Closing brace by closing brace (at C speed), counting the openings before each.
    depth = 0
    j = i
    while (close := text.find(b"}", j)) >= 0:
        depth += text.count(b"{", j, close) - 1
        if depth == 0:
            return text[i : close + 1]
        j = close + 1
    return None
