"""What the sim's endpoints share: the model state, the slots, the request log, and the
error bodies (llama.cpp's, which OpenAI clients also parse)."""

from __future__ import annotations

import asyncio
import uuid
from collections import deque
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Annotated, Any, cast

import orjson
from fastapi import Depends, Request, Response

from hotseat_sim.generation import Identity, generate
from hotseat_sim.model_state import Halted, ModelState, Ticket
from hotseat_sim.profile import SimProfile
from hotseat_sim.slots import Slot, SlotPool, common_prefix

REQUEST_ID_HEADERS = ("x-hotseat-request-id", "x-request-id")
REQUEST_LOG_SIZE = 200
REQUEST_LOG_BODY_LIMIT = 64 * 1024
"""Bodies larger than this are logged as their size only."""
ARRIVED_AT = "hotseat_sim_arrived_at"
"""The ``scope["state"]`` key under which the app's outermost layer (``app.ArrivalStamp``)
puts the time (``time.time()``) a request's head reached the sim's app."""


class JSONBody(Response):
    """A JSON response serialised with orjson."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


class BadRequest(Exception):
    """The request cannot be served as sent (400)."""


def error_response(status: int, message: str, kind: str, **extra: Any) -> JSONBody:
    """``{"error": {"code", "message", "type"}}``, the body llama.cpp and OpenAI both use."""
    return JSONBody(
        {"error": {"code": status, "message": message, "type": kind}, **extra}, status_code=status
    )


def unavailable(message: str) -> JSONBody:
    return error_response(503, message, "unavailable_error")


def invalid_request(message: str) -> JSONBody:
    return error_response(400, message, "invalid_request_error")


@dataclass
class RequestLog:
    """The last requests the sim received (method, path, headers, body), for header tests."""

    entries: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=REQUEST_LOG_SIZE))

    async def record(self, request: Request, body: Any) -> None:
        """Log ``request``. Its ``time`` is when its head reached the sim's app, not now:
        with many requests arriving at once, the sim's own routing and body parsing of the
        others would otherwise be counted as the sender's lateness."""
        size = len(await request.body())  # cached by Starlette: no second read
        if size > REQUEST_LOG_BODY_LIMIT:
            body = {"omitted_bytes": size}
        self.entries.append(
            {
                "time": request.scope["state"][ARRIVED_AT],
                "method": request.method,
                "path": request.url.path,
                "headers": headers_of(request),
                "body": body,
            }
        )


def headers_of(request: Request) -> dict[str, str]:
    """Received headers, names lowercased, repeated ones joined with ``, ``."""
    out: dict[str, str] = {}
    for name, value in request.headers.items():
        out[name] = f"{out[name]}, {value}" if name in out else value
    return out


def request_id(request: Request) -> str:
    for name in REQUEST_ID_HEADERS:
        value = request.headers.get(name)
        if value:
            return value
    return uuid.uuid4().hex


@dataclass
class SimRuntime:
    profile: SimProfile
    model: ModelState
    slots: SlotPool
    requests: RequestLog = field(default_factory=RequestLog)

    def identity(self, requested_model: Any) -> Identity:
        model = requested_model if isinstance(requested_model, str) and requested_model else None
        return Identity(
            model=model or self.profile.model,
            fingerprint=f"hotseat-sim/{self.profile.member}",
        )

    async def _slot(self, ticket: Ticket, n_tokens: int, prompt: Sequence[str]) -> Slot:
        """A slot, or :class:`Halted` if the ticket is stopped while queued."""
        if ticket.stop.is_set():
            raise Halted(ticket.reason or "aborted")
        acquire = asyncio.ensure_future(self.slots.acquire(n_tokens, prompt, self.model.generation))
        stopped = asyncio.ensure_future(ticket.stop.wait())
        granted = False
        try:
            await asyncio.wait({acquire, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if acquire.done() and not ticket.stop.is_set():
                granted = True
                return acquire.result()
            raise Halted(ticket.reason or "aborted")
        finally:
            stopped.cancel()
            if not granted:
                if not acquire.done():
                    acquire.cancel()  # the pool passes on a slot granted meanwhile
                elif not acquire.cancelled() and acquire.exception() is None:
                    self.slots.release(acquire.result())

    async def _prefill(self, ticket: Ticket, slot: Slot, prompt: Sequence[str]) -> None:
        """Evaluate the prompt tokens the slot has not cached, at ``prefillTokensPerSecond``.

        As llama.cpp does, a prompt found whole in the cache still evaluates its last token.
        """
        if not prompt:
            return
        shared = min(common_prefix(slot.cached(self.model.generation), prompt), len(prompt) - 1)
        ticket.cache_n, ticket.prompt_n = shared, len(prompt) - shared
        del slot.cache[shared:]
        rate = self.profile.sim.prefill_tokens_per_second
        loop = asyncio.get_running_loop()
        began = loop.time()
        if rate is not None:
            await ticket.sleep_until(began + ticket.prompt_n / rate)
        ticket.prompt_ms = (loop.time() - began) * 1000
        slot.cache.extend(prompt[shared:])

    async def tokens(
        self, ticket: Ticket, seed: str, n_tokens: int, prompt: Sequence[str] = ()
    ) -> AsyncGenerator[str]:
        """Queue for a slot, evaluate the prompt, generate, and always free the slot and end
        the ticket. The slot's cache keeps the prompt and the reply."""
        outcome = "aborted"
        slot: Slot | None = None
        try:
            slot = await self._slot(ticket, n_tokens, prompt)
            self.model.begin(ticket)
            await self._prefill(ticket, slot, prompt)
            async with aclosing(
                generate(ticket, slot, seed, n_tokens, self.profile.sim.tokens_per_second)
            ) as stream:
                async for token in stream:
                    slot.cache.append(token.strip())
                    yield token
            outcome = "completed"
        except Halted:
            outcome = ticket.reason or "aborted"
            raise
        except (asyncio.CancelledError, GeneratorExit):
            outcome = "disconnected"
            raise
        finally:
            if slot is not None:
                self.slots.release(slot)
            self.model.finish(ticket, outcome)


def runtime(request: Request) -> SimRuntime:
    """FastAPI dependency: the runtime the lifespan put in the request state."""
    return cast("SimRuntime", request.state.sim)


Sim = Annotated[SimRuntime, Depends(runtime)]


async def read_json(request: Request) -> Any:
    """The request body as JSON, ``None`` when empty; :class:`BadRequest` when not JSON."""
    raw = await request.body()
    if not raw.strip():
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"invalid JSON body: {exc}") from exc


async def until_disconnect(request: Request, ticket: Ticket) -> None:
    """Halt ``ticket`` when the client goes away (the body must have been read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            ticket.halt("disconnected")
            return
