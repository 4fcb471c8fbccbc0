"""HTTP clients of the router for fault tests and the soak: plain and streaming chat
requests that record how each one ended."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson


def chat_body(model: str, max_tokens: int = 1, *, stream: bool = False) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def _headers(request_id: str | None) -> dict[str, str]:
    return {"x-hotseat-request-id": request_id} if request_id else {}


async def chat(
    url: str,
    model: str,
    max_tokens: int = 1,
    *,
    request_id: str | None = None,
    timeout: float = 60,
) -> httpx.Response:
    async with httpx.AsyncClient(timeout=timeout) as client:
        return await client.post(
            f"{url}/v1/chat/completions",
            json=chat_body(model, max_tokens),
            headers=_headers(request_id),
        )


@dataclass
class StreamResult:
    """How one streaming request ended, as its client saw it."""

    status: int
    backend: str | None = None
    request_id: str | None = None
    retry_after: str | None = None
    chunks: int = 0
    done: bool = False
    """The stream ended with ``data: [DONE]``."""
    error: dict[str, Any] | None = None
    """An OpenAI error event inside the stream (or the error body of a non-200 answer)."""
    broken: str | None = None
    """The connection broke before the body ended."""
    started: float = field(default_factory=time.monotonic)
    first_byte: float | None = None
    ended: float | None = None

    @property
    def ttfb(self) -> float | None:
        return None if self.first_byte is None else self.first_byte - self.started

    @property
    def clean(self) -> bool:
        """A 200 whose stream completed normally."""
        return self.status == 200 and self.done and self.error is None and self.broken is None


async def stream_chat(
    client: httpx.AsyncClient,
    url: str,
    model: str,
    max_tokens: int,
    *,
    first: asyncio.Event | None = None,
    halfway: asyncio.Event | None = None,
    request_id: str | None = None,
) -> StreamResult:
    """One streaming chat request, read to its end; never raises for a broken stream.
    ``first`` is set at its first chunk, ``halfway`` once half its tokens arrived."""
    result = StreamResult(status=0)
    try:
        async with client.stream(
            "POST",
            f"{url}/v1/chat/completions",
            json=chat_body(model, max_tokens, stream=True),
            headers=_headers(request_id),
        ) as response:
            result.status = response.status_code
            result.backend = response.headers.get("x-hotseat-backend")
            result.request_id = response.headers.get("x-hotseat-request-id")
            result.retry_after = response.headers.get("retry-after")
            if response.status_code != 200:
                body = await response.aread()
                result.error = orjson.loads(body).get("error") if body else None
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if result.first_byte is None:
                    result.first_byte = time.monotonic()
                    if first is not None:
                        first.set()
                payload = line[6:]
                if payload == "[DONE]":
                    result.done = True
                    continue
                event = orjson.loads(payload)
                if "error" in event:
                    result.error = event["error"]
                else:
                    result.chunks += 1
                    if halfway is not None and result.chunks >= max_tokens // 2:
                        halfway.set()
    except httpx.HTTPError as exc:
        result.broken = f"{type(exc).__name__}: {exc}"
    finally:
        result.ended = time.monotonic()
    return result


@asynccontextmanager
async def live_stream(
    url: str, model: str, max_tokens: int, *, request_id: str | None = None
) -> AsyncIterator[asyncio.Task[StreamResult]]:
    """A streaming request that has received its first chunk (its lease is live)."""
    first = asyncio.Event()
    client = httpx.AsyncClient(timeout=httpx.Timeout(60, read=60))
    task = asyncio.create_task(
        stream_chat(client, url, model, max_tokens, first=first, request_id=request_id)
    )
    waiter = asyncio.create_task(first.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            raise AssertionError(f"the stream ended before its first chunk: {task.result()}")
        yield task
    finally:
        waiter.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await client.aclose()
