"""A streaming request held for its pool, answered early (a rule's ``holdKeepAlive``):
its response headers as soon as the hold lasts one interval, then an SSE comment line at
every interval while it waits (``: hotseat waiting for coder, position 2, eta 6s``).

OpenAI clients skip comment lines, so the content the client reads is unchanged; a
client that shows nothing until the first token at least sees the connection alive, and
one that reads the raw stream sees where it stands. The price is that the status is
sent before the outcome is known: an answer that fails afterwards (the hold timed out,
every backend failed) ends the stream with an OpenAI error event, as a failure in the
middle of a stream always does, and the backend that serves it is named by a last
comment (``: hotseat backend coder``), since its header could not be, and so is the swap it
waited for (``: hotseat swap gpu0-1796…``).
"""

from __future__ import annotations

import math

from hotseat_common.messages import WaitReply
from hotseat_router.asgi import Send
from hotseat_router.headers import REQUEST_ID_B

_HEADERS = (
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
)


class HeldStream:
    def __init__(self, send: Send, *, request_id: str, interval: float) -> None:
        self._send = send
        self._request_id = request_id.encode()
        self.interval = interval
        self.started = False
        """The response's headers are sent: what follows must be SSE."""
        self.waiting: WaitReply | None = None
        """The latest wait answer for the member it waits for."""

    def heard(self, reply: WaitReply) -> None:
        self.waiting = reply

    async def tick(self, member: str) -> None:
        """One interval passed while held: the headers (the first time), then a comment."""
        await self.start()
        text = f"hotseat waiting for {member}"
        if self.waiting is not None:
            if self.waiting.position is not None:
                text += f", position {self.waiting.position}"
            if self.waiting.eta_s is not None:
                text += f", eta {math.ceil(self.waiting.eta_s)}s"
        await self.comment(text)

    async def start(self) -> None:
        if self.started:
            return
        self.started = True
        headers = [*_HEADERS, (REQUEST_ID_B, self._request_id)]
        await self._send({"type": "http.response.start", "status": 200, "headers": headers})

    async def served_by(self, backend: str, *, swap_id: str | None) -> None:
        """What the headers would have said: the backend that serves, the swap waited for."""
        await self.comment(f"hotseat backend {backend}")
        if swap_id is not None:
            await self.comment(f"hotseat swap {swap_id}")

    async def comment(self, text: str) -> None:
        line = b": " + text.replace("\n", " ").encode() + b"\n\n"
        await self._send({"type": "http.response.body", "body": line, "more_body": True})

    async def event(self, data: bytes, *, last: bool) -> None:
        """One ``data:`` event (an upstream's body or an error), ending the stream if
        ``last``."""
        body = b"data: " + data + b"\n\n"
        await self._send({"type": "http.response.body", "body": body, "more_body": not last})
