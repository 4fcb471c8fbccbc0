"""Simulated generation: deterministic tokens at the member's pace, and the OpenAI shapes
(chat completions, completions, their stream chunks, embeddings) that carry them."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import struct
import time
import uuid
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from hotseat_sim.model_state import Ticket
from hotseat_sim.slots import Slot

DEFAULT_MAX_TOKENS = 16
DEFAULT_EMBEDDING_DIMENSIONS = 256

_WORDS = (
    "the", "hot", "seat", "model", "takes", "turns", "on", "one", "gpu", "while", "others",
    "wait", "a", "router", "holds", "requests", "until", "swap", "is", "done", "and", "then",
    "tokens", "flow", "again", "quickly", "pool", "member", "ready", "to", "serve", "you",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Identity:
    """Who answers: the model name to echo and the fingerprint naming the member."""

    model: str
    fingerprint: str


def token_text(seed: str, index: int) -> str:
    """The ``index``-th token generated for ``seed``: a word, space-separated after the first."""
    digest = hashlib.blake2b(f"{seed}\x00{index}".encode(), digest_size=4).digest()
    word = _WORDS[int.from_bytes(digest, "big") % len(_WORDS)]
    return word if index == 0 else " " + word


def count_tokens(text: str) -> int:
    """A rough prompt token count: whitespace-separated words, at least one."""
    return max(1, len(text.split()))


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def chat_prompt(messages: Sequence[Any]) -> str:
    """The text of a chat request's messages, used to seed and count."""
    return "\n".join(_content_text(m.get("content")) for m in messages if isinstance(m, dict))


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


async def generate(
    ticket: Ticket, slot: Slot, seed: str, n_tokens: int, tokens_per_second: float
) -> AsyncGenerator[str]:
    """Yield ``n_tokens`` tokens, the i-th at ``(i+1)/tokens_per_second`` after the start.

    Raises :class:`hotseat_sim.model_state.Halted` as soon as the ticket is stopped.
    """
    loop = asyncio.get_running_loop()
    start = loop.time()
    for index in range(n_tokens):
        await ticket.sleep_until(start + (index + 1) / tokens_per_second)
        slot.n_decoded = index + 1
        slot.n_remain = n_tokens - index - 1
        yield token_text(seed, index)


class ChatShapes:
    """``chat.completion`` and ``chat.completion.chunk`` objects of one response."""

    def __init__(self, identity: Identity) -> None:
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.identity = identity

    def _base(self, obj: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.identity.model,
            "system_fingerprint": self.identity.fingerprint,
        }

    def body(self, text: str, finish_reason: str, use: dict[str, int]) -> dict[str, Any]:
        message = {"role": "assistant", "content": text, "refusal": None}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
        return {**self._base("chat.completion"), "choices": [choice], "usage": use}

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {**self._base("chat.completion.chunk"), "choices": [choice]}

    def opening(self) -> list[dict[str, Any]]:
        return [self.chunk({"role": "assistant", "content": ""})]

    def token_chunk(self, token: str) -> dict[str, Any]:
        return self.chunk({"content": token})

    def final_chunk(self, finish_reason: str) -> dict[str, Any]:
        return self.chunk({}, finish_reason)

    def usage_chunk(self, use: dict[str, int]) -> dict[str, Any]:
        return {**self._base("chat.completion.chunk"), "choices": [], "usage": use}


class Shapes(Protocol):
    """The objects of one text response, JSON or streamed."""

    def body(self, text: str, finish_reason: str, use: dict[str, int]) -> dict[str, Any]: ...
    def opening(self) -> list[dict[str, Any]]: ...
    def token_chunk(self, token: str) -> dict[str, Any]: ...
    def final_chunk(self, finish_reason: str) -> dict[str, Any]: ...
    def usage_chunk(self, use: dict[str, int]) -> dict[str, Any]: ...


class CompletionShapes:
    """``text_completion`` objects of one legacy completions response."""

    def __init__(self, identity: Identity) -> None:
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.identity = identity

    def _base(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.identity.model,
            "system_fingerprint": self.identity.fingerprint,
        }

    def body(
        self, text: str, finish_reason: str | None, use: dict[str, int] | None = None
    ) -> dict[str, Any]:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        out = {**self._base(), "choices": [choice]}
        if use is not None:
            out["usage"] = use
        return out

    def usage_chunk(self, use: dict[str, int]) -> dict[str, Any]:
        return {**self._base(), "choices": [], "usage": use}

    def opening(self) -> list[dict[str, Any]]:
        return []

    def token_chunk(self, token: str) -> dict[str, Any]:
        return self.body(token, None)

    def final_chunk(self, finish_reason: str) -> dict[str, Any]:
        return self.body("", finish_reason)


def embedding_vector(text: str, dimensions: int) -> list[float]:
    """A deterministic unit vector for ``text`` (same text, same vector)."""
    raw = bytearray()
    counter = 0
    while len(raw) < 4 * dimensions:
        raw += hashlib.blake2b(f"{counter}\x00{text}".encode(), digest_size=64).digest()
        counter += 1
    ints = struct.unpack(f">{dimensions}I", bytes(raw[: 4 * dimensions]))
    values = [(i / 0xFFFFFFFF) * 2.0 - 1.0 for i in ints]
    norm = sum(v * v for v in values) ** 0.5 or 1.0
    return [v / norm for v in values]


def encode_embedding(vector: list[float], encoding_format: str) -> list[float] | str:
    """``float`` as a list, ``base64`` as little-endian float32 bytes (what the SDK decodes)."""
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector


def embedding_inputs(value: Any) -> list[str] | None:
    """The texts of an embeddings ``input`` (a string, strings, token ids or lists of ids)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            return list(value)
        if all(isinstance(v, int) for v in value):
            return [" ".join(map(str, value))]
        if all(isinstance(v, list) and all(isinstance(i, int) for i in v) for v in value):
            return [" ".join(map(str, v)) for v in value]
    return None
