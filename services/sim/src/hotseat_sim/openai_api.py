"""The OpenAI endpoints: chat completions and completions (JSON or SSE), embeddings, models.

Shapes follow what the ``openai`` Python SDK parses: a stream is ``data: {chunk}\\n\\n``
events ending with ``data: [DONE]``; ``stream_options.include_usage`` adds a last chunk
with ``usage`` and no choices. While the model is not loaded every endpoint answers 503
like llama.cpp. A request header ``x-sim-status: <4xx|5xx>`` makes the sim answer that
status with an OpenAI error body (for tests of how callers treat upstream errors);
``x-sim-status: <name>=<status>`` does so only on the sim whose member or backend is
``name`` (a backend names one copy of a model that several pools serve).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse

from hotseat_common.logging import get_logger
from hotseat_sim.generation import (
    DEFAULT_EMBEDDING_DIMENSIONS,
    DEFAULT_MAX_TOKENS,
    ChatShapes,
    CompletionShapes,
    Identity,
    Shapes,
    chat_prompt,
    count_tokens,
    embedding_inputs,
    embedding_vector,
    encode_embedding,
    usage,
)
from hotseat_sim.model_state import LOADING_MESSAGE, Halted, NotReady, Phase, Ticket
from hotseat_sim.runtime import (
    BadRequest,
    JSONBody,
    Sim,
    SimRuntime,
    error_response,
    invalid_request,
    read_json,
    request_id,
    unavailable,
    until_disconnect,
)

log = get_logger(__name__)

AskT = TypeVar("AskT")

router = APIRouter()

FORCE_STATUS_HEADER = "x-sim-status"
SSE_DONE = b"data: [DONE]\n\n"
ABORTED_MESSAGE = "request aborted: the model was unloaded"


class StreamAborted(Exception):
    """Raised inside a stream to cut the connection, as a server that stops would."""


@dataclass(frozen=True, slots=True)
class TextRequest:
    """What a chat or completions request asks for."""

    prompt: str
    model: Any
    n_tokens: int
    explicit_limit: bool
    """``finish_reason`` is ``length`` when the client set the limit, else ``stop``."""
    stream: bool
    include_usage: bool

    @property
    def finish_reason(self) -> str:
        return "length" if self.explicit_limit else "stop"


def timings(ticket: Ticket, predicted: int) -> dict[str, Any]:
    """llama.cpp's ``timings`` of a response: ``prompt_n`` tokens evaluated, ``cache_n``
    taken from the slot's cache, ``predicted_n`` generated."""
    return {
        "cache_n": ticket.cache_n,
        "prompt_n": ticket.prompt_n,
        "prompt_ms": round(ticket.prompt_ms, 3),
        "predicted_n": predicted,
    }


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    if body.get("n", 1) not in (1, None):
        raise BadRequest("Only one completion choice is allowed")
    return body


def _max_tokens(body: dict[str, Any]) -> tuple[int, bool]:
    for key in ("max_completion_tokens", "max_tokens", "n_predict"):
        value = body.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise BadRequest(f"'{key}' must be a non-negative integer")
            return value, True
    return DEFAULT_MAX_TOKENS, False


def _text_request(body: dict[str, Any], prompt: str) -> TextRequest:
    n_tokens, explicit = _max_tokens(body)
    options = body.get("stream_options")
    return TextRequest(
        prompt=prompt,
        model=body.get("model"),
        n_tokens=n_tokens,
        explicit_limit=explicit,
        stream=bool(body.get("stream")),
        include_usage=isinstance(options, dict) and bool(options.get("include_usage")),
    )


def parse_chat(raw: Any) -> TextRequest:
    body = _object(raw)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty array")
    return _text_request(body, chat_prompt(messages))


def parse_completion(raw: Any) -> TextRequest:
    body = _object(raw)
    prompt = body.get("prompt", "")
    if isinstance(prompt, list):
        prompt = " ".join(str(p) for p in prompt)
    if not isinstance(prompt, str):
        raise BadRequest("'prompt' must be a string or an array of strings")
    return _text_request(body, prompt)


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    texts: list[str]
    model: Any
    dimensions: int
    encoding: str


def parse_embeddings(raw: Any) -> EmbeddingRequest:
    body = _object(raw)
    texts = embedding_inputs(body.get("input"))
    if texts is None:
        raise BadRequest("'input' must be a string, an array of strings or of token ids")
    dimensions = body.get("dimensions", DEFAULT_EMBEDDING_DIMENSIONS)
    if isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1:
        raise BadRequest("'dimensions' must be a positive integer")
    encoding = body.get("encoding_format") or "float"
    if encoding not in {"float", "base64"}:
        raise BadRequest("'encoding_format' must be float or base64")
    return EmbeddingRequest(texts, body.get("model"), dimensions, encoding)


def _forced(request: Request, names: tuple[str, ...]) -> JSONBody | None:
    value = request.headers.get(FORCE_STATUS_HEADER)
    if value is None:
        return None
    target, sep, status_text = value.rpartition("=")
    if sep:
        if target not in names:
            return None
        value = status_text
    if not value.isdigit() or not 400 <= int(value) <= 599:
        return invalid_request(f"{FORCE_STATUS_HEADER} must be a status code from 400 to 599")
    status = int(value)
    kind = "invalid_request_error" if status < 500 else "server_error"
    return error_response(status, f"forced by {FORCE_STATUS_HEADER}", kind)


async def _body(request: Request, sim: SimRuntime) -> Any:
    """The JSON body, recorded in the request log (``BadRequest`` when it is not JSON)."""
    try:
        body = await read_json(request)
    except BadRequest:
        await sim.requests.record(request, None)
        raise
    await sim.requests.record(request, body)
    return body


async def _admit(
    request: Request, sim: SimRuntime, parse: Callable[[Any], AskT]
) -> tuple[AskT, Ticket] | Response:
    """The parsed request and its ticket, or the response that refuses it."""
    try:
        ask = parse(await _body(request, sim))
    except BadRequest as exc:
        return invalid_request(str(exc))
    ticket = _ticket(request, sim)
    if isinstance(ticket, Response):
        return ticket
    return ask, ticket


def _ticket(request: Request, sim: SimRuntime) -> Ticket | Response:
    """Admit the request, or the response that refuses it (forced status, not loaded)."""
    if (forced := _forced(request, (sim.profile.member, sim.profile.backend))) is not None:
        return forced
    try:
        return sim.model.admit(request_id(request))
    except NotReady as exc:
        return unavailable(str(exc))


async def _collect(
    request: Request,
    sim: SimRuntime,
    ticket: Ticket,
    seed: str,
    n: int,
    *,
    prompt: Sequence[str] = (),
) -> str | Response:
    """Generate without streaming; the client leaving or an unload stops it."""
    watcher = asyncio.create_task(until_disconnect(request, ticket))
    try:
        async with aclosing(sim.tokens(ticket, seed, n, prompt)) as stream:
            return "".join([token async for token in stream])
    except Halted:
        if ticket.reason == "disconnected":
            return Response(status_code=499)  # nobody is listening any more
        return unavailable(ABORTED_MESSAGE)
    finally:
        watcher.cancel()


async def _stream_tokens(
    sim: SimRuntime, ticket: Ticket, seed: str, n: int, prompt: Sequence[str]
) -> AsyncGenerator[str]:
    """Tokens for an SSE body; an unload cuts the connection, a disconnect just ends."""
    try:
        async with aclosing(sim.tokens(ticket, seed, n, prompt)) as stream:
            async for token in stream:
                yield token
    except Halted as exc:
        if ticket.reason == "disconnected":
            return
        log.warning("sim_stream_aborted", member=sim.profile.member, request_id=ticket.request_id)
        raise StreamAborted(ABORTED_MESSAGE) from exc


async def _serve_text(
    request: Request, sim: SimRuntime, ticket: Ticket, ask: TextRequest, shapes: Shapes
) -> Response:
    seed = f"{sim.profile.member}\x00{ask.prompt}"
    words = ask.prompt.split()
    use = usage(count_tokens(ask.prompt), ask.n_tokens)
    if not ask.stream:
        text = await _collect(request, sim, ticket, seed, ask.n_tokens, prompt=words)
        if isinstance(text, Response):
            return text
        return JSONBody(
            shapes.body(text, ask.finish_reason, use) | {"timings": timings(ticket, ask.n_tokens)}
        )

    async def events() -> AsyncIterator[bytes]:
        for chunk in shapes.opening():
            yield sse(chunk)
        async with aclosing(_stream_tokens(sim, ticket, seed, ask.n_tokens, words)) as tokens:
            async for token in tokens:
                yield sse(shapes.token_chunk(token))
        if ticket.reason == "disconnected":
            return
        final = shapes.final_chunk(ask.finish_reason)
        yield sse(final | {"timings": timings(ticket, ask.n_tokens)})
        if ask.include_usage:
            yield sse(shapes.usage_chunk(use))
        yield SSE_DONE

    return StreamingResponse(events(), media_type="text/event-stream")


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(request: Request, sim: Sim) -> Response:
    return await _text(request, sim, parse_chat, ChatShapes)


@router.post("/v1/completions", response_model=None)
async def completions(request: Request, sim: Sim) -> Response:
    return await _text(request, sim, parse_completion, CompletionShapes)


async def _text(
    request: Request,
    sim: SimRuntime,
    parse: Callable[[Any], TextRequest],
    shapes: Callable[[Identity], Shapes],
) -> Response:
    admitted = await _admit(request, sim, parse)
    if isinstance(admitted, Response):
        return admitted
    ask, ticket = admitted
    return await _serve_text(request, sim, ticket, ask, shapes(sim.identity(ask.model)))


@router.post("/v1/embeddings", response_model=None)
async def embeddings(request: Request, sim: Sim) -> Response:
    admitted = await _admit(request, sim, parse_embeddings)
    if isinstance(admitted, Response):
        return admitted
    ask, ticket = admitted
    done = await _collect(request, sim, ticket, "", 0)
    if isinstance(done, Response):
        return done
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": encode_embedding(embedding_vector(text, ask.dimensions), ask.encoding),
        }
        for i, text in enumerate(ask.texts)
    ]
    prompt_tokens = sum(count_tokens(t) for t in ask.texts)
    return JSONBody(
        {
            "object": "list",
            "data": data,
            "model": sim.identity(ask.model).model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        }
    )


@router.get("/v1/models", response_model=None)
async def models(sim: Sim) -> Response:
    if sim.model.phase is not Phase.READY:
        return unavailable(sim.model.error or LOADING_MESSAGE)
    model = {"id": sim.profile.model, "object": "model", "created": 0, "owned_by": "hotseat-sim"}
    return JSONBody({"object": "list", "data": [model]})
