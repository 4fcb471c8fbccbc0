"""Streaming and the real OpenAI SDK: pass-through chunk by chunk, first byte early,
client disconnects reaching the upstream, the idle timeout."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from tests.router.conftest import router_tasks

CHAT = "/v1/chat/completions"


def one_backend(a, idle: str) -> dict:
    return {
        "router": {"streamIdleTimeout": idle},
        "backends": [{"name": "a", "address": a.url, "model": "small-model"}],
        "rules": [{"name": "all", "route": {"backends": ["a"]}}],
    }


@pytest.fixture
async def one(upstream, start_router):
    """A router in front of one upstream; its idle timeout (30 s) never fires in a test
    that does not wait for it, however slowly a loaded machine runs the test."""
    a = await upstream("a")
    return await start_router(one_backend(a, "30s")), a


async def test_openai_sdk_non_streaming(one, audit):
    """The OpenAI SDK gets a parsed completion and sees the serving backend's header."""
    router, _ = one
    sdk = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)
    raw = await sdk.chat.completions.with_raw_response.create(
        model="assistant", messages=[{"role": "user", "content": "hi"}]
    )
    completion = raw.parse()
    assert completion.choices[0].message.content == "from a"
    assert completion.model == "small-model"
    assert raw.headers["x-hotseat-backend"] == "a"
    event = await audit.request_event(raw.headers["x-hotseat-request-id"])
    assert event["outcome"] == "served"
    await sdk.close()


async def test_openai_sdk_streaming(one, audit):
    """The OpenAI SDK streams every chunk through the router."""
    router, _ = one
    sdk = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)
    stream = await sdk.chat.completions.create(
        model="assistant", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    parts = [c.choices[0].delta.content async for c in stream if c.choices[0].delta.content]
    assert "".join(parts) == "from a and more"
    await sdk.close()


async def test_openai_sdk_sees_router_errors(one):
    """Router errors reach the SDK as typed errors with the OpenAI body."""
    router, a = one
    a.mode = "status"
    sdk = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.APIStatusError) as caught:
        await sdk.chat.completions.create(model="m", messages=[])
    assert caught.value.status_code == 502
    assert caught.value.code == "all_backends_failed"
    await sdk.close()


async def test_first_byte_before_upstream_finishes(one, client):
    """The first chunk reaches the client while the upstream is still generating."""
    router, a = one
    a.mode = "stream"
    async with client.stream(
        "POST", router.url + CHAT, json={"model": "m", "stream": True}
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-hotseat-backend"] == "a"
        chunks = response.aiter_raw()
        first = await asyncio.wait_for(anext(chunks), 5)
        assert b"from a" in first
        assert not a.finished.is_set()
        a.gate.set()
        rest = b"".join([c async for c in chunks])
    assert rest.endswith(b"data: [DONE]\n\n")


async def test_client_disconnect_reaches_upstream(one, client, audit):
    """A client that leaves mid-stream closes the upstream request promptly; the router's
    connection tells the request, which starts no task of the router's own to notice."""
    router, a = one
    a.mode = "stream_forever"
    with router_tasks() as started:
        async with client.stream(
            "POST", router.url + CHAT, json={"model": "m", "stream": True}
        ) as response:
            rid = response.headers["x-hotseat-request-id"]
            await anext(response.aiter_raw())
        await asyncio.wait_for(a.disconnected.wait(), 3)
    event = await audit.request_event(rid)
    assert (event["outcome"], event["backend"]) == ("client_disconnected", "a")
    assert started == []


async def test_client_disconnect_while_waiting_for_headers(one, audit):
    """A client that leaves before the upstream answers cancels the upstream request."""
    router, a = one
    a.mode = "hang"
    async with httpx.AsyncClient() as http:
        task = asyncio.create_task(
            http.post(
                router.url + CHAT, json={"model": "m"}, headers={"x-hotseat-request-id": "gone-1"}
            )
        )
        await asyncio.wait_for(a.arrived.wait(), 5)
        task.cancel()
    await asyncio.wait_for(a.disconnected.wait(), 3)
    event = await audit.request_event("gone-1")
    assert event["outcome"] == "client_disconnected"


async def test_stream_idle_timeout_ends_sse_with_error(upstream, start_router, client, audit):
    """An upstream silent for longer than streamIdleTimeout ends the stream with an error."""
    a = await upstream("a")
    router = await start_router(one_backend(a, "500ms"))
    a.mode = "stream_stall"
    async with client.stream(
        "POST", router.url + CHAT, json={"model": "m", "stream": True}
    ) as response:
        body = b"".join([c async for c in response.aiter_raw()])
        rid = response.headers["x-hotseat-request-id"]
    assert b"from a" in body
    assert body.rstrip().endswith(b'"code":"stream_idle_timeout"}}')
    await asyncio.wait_for(a.disconnected.wait(), 3)
    event = await audit.request_event(rid)
    assert (event["outcome"], event["reason"]) == ("served", "stream_idle_timeout")
