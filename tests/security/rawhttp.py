"""HTTP/1.1 over a raw socket: what a hostile client does that an HTTP library won't
(a head sent in pieces or never finished, a body shorter than its Content-Length)."""

from __future__ import annotations

import asyncio

import orjson

ANSWER_WAIT_S = 30.0
"""How long a test waits for an answer before calling the router silent (a bound on a
hang, not a measured figure)."""


async def connect(
    url: str, *, source: str | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to ``url``, from the loopback address ``source`` when given (another
    127.x address stands for another client host)."""
    host, port = url.removeprefix("http://").split(":")
    local = (source, 0) if source is not None else None
    return await asyncio.open_connection(host, int(port), local_addr=local)


def head(lines: list[str]) -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def status_of(
    reader: asyncio.StreamReader, timeout: float = ANSWER_WAIT_S
) -> tuple[int, bytes]:
    answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    return int(answer.split(b" ", 2)[1]), answer


def header(answer_head: bytes, name: bytes) -> bytes | None:
    for line in answer_head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip()
    return None


async def answer_of(
    reader: asyncio.StreamReader, timeout: float = ANSWER_WAIT_S
) -> tuple[int, bytes, dict[str, object]]:
    """Status, head and JSON body of a response with a Content-Length."""
    status, answer_head = await status_of(reader, timeout)
    length = header(answer_head, b"content-length")
    assert length is not None, answer_head
    body = await asyncio.wait_for(reader.readexactly(int(length)), timeout)
    return status, answer_head, orjson.loads(body)
