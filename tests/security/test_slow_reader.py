"""A client that stops reading its stream cannot keep a pool member busy: once the
router's buffer for it has stayed full for the write timeout, it is dropped, its
upstream request cancelled and its lease released at once."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import orjson

from tests.router.fake_activation import FakeActivation
from tests.security.rawhttp import ANSWER_WAIT_S, head

CHAT = "/v1/chat/completions"


async def test_a_client_that_stops_reading_is_dropped_and_its_lease_released(
    upstream, start_router
) -> None:
    """A stream whose client never reads (a small receive buffer, nothing read) from an
    upstream that sends as fast as it can: after write_timeout the router aborts the
    connection, cancels the upstream request and releases the lease, long before the
    lease's TTL or the stream idle timeout would have."""
    flood = await upstream("a")
    flood.mode = "stream_flood"
    activation = FakeActivation()
    config = {
        "backends": [{"name": "a", "address": flood.url, "pool": {"name": "gpu0", "member": "a"}}],
        "pools": [{"name": "gpu0", "members": [{"name": "a"}, {"name": "b"}]}],
        "defaultRoute": "a",
        "unknownModels": "DefaultRoute",
    }
    router = await start_router(config, activation_factory=activation.factory, write_timeout=1)
    port = int(router.url.rsplit(":", 1)[1])
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    body = orjson.dumps({"model": "m", "stream": True, "messages": []})
    lines = ["POST /v1/chat/completions HTTP/1.1", "host: x", f"content-length: {len(body)}"]
    await asyncio.get_running_loop().sock_sendall(sock, head(lines) + body)
    try:
        await asyncio.wait_for(activation.released_event.wait(), ANSWER_WAIT_S)
        assert activation.released == activation.granted
        assert len(activation.granted) == 1
        assert activation.granted[0].ttl_s > 1  # released well before its TTL ran out
        await asyncio.wait_for(flood.disconnected.wait(), ANSWER_WAIT_S)
        # The router dropped the connection: what is left to read ends (EOF or reset).
        with contextlib.suppress(ConnectionError):
            while await asyncio.wait_for(
                asyncio.get_running_loop().sock_recv(sock, 1 << 20), ANSWER_WAIT_S
            ):
                pass
    finally:
        sock.close()
