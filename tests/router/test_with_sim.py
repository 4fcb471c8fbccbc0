"""The router in front of real sim backends (the simulated inference server), with the
OpenAI SDK as the client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import openai
import pytest

from hotseat.launcher import free_port
from hotseat_common.config import parse_config
from tests.support.sim import SimHandle, run_sim
from tests.support.waiting import eventually


@pytest.fixture
async def sims(redis_server, prefix):
    """Two unpooled sims: ``small`` (model rewrite to qwen2.5-3b) and ``big``; and ``dead``,
    an address where nothing listens."""
    config = parse_config(
        {
            "backends": [
                {
                    "name": "small",
                    "address": f"http://127.0.0.1:{free_port()}",
                    "model": "qwen2.5-3b",
                },
                {"name": "big", "address": f"http://127.0.0.1:{free_port()}"},
                {"name": "dead", "address": f"http://127.0.0.1:{free_port()}"},
            ],
            "rules": [
                {
                    "name": "small-first",
                    "match": {"models": ["assistant*"]},
                    "route": {"backends": ["dead", "small", "big"]},
                },
            ],
            "defaultRoute": "big",
            "unknownModels": "DefaultRoute",
        }
    )
    async with (
        run_sim(config, "small", redis_url=redis_server.url, key_prefix=prefix, loaded=True) as s,
        run_sim(config, "big", redis_url=redis_server.url, key_prefix=prefix, loaded=True) as b,
    ):
        yield config, s, b


async def test_openai_sdk_through_router_to_sims(sims, start_router, audit):
    """Dead backend skipped, model rewritten, streamed and plain answers from the real sim."""
    config, small, _ = sims
    router = await start_router(config)
    async with openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="k", max_retries=0) as sdk:
        raw = await sdk.chat.completions.with_raw_response.create(
            model="assistant",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
            extra_headers={"authorization": "Bearer client-key", "x-hotseat-request-id": "sim-1"},
        )
        completion = raw.parse()
        assert completion.model == "qwen2.5-3b"
        assert raw.headers["x-hotseat-backend"] == "small"
        assert raw.headers["x-sim-member"] == "small"
        stream = await sdk.chat.completions.create(
            model="assistant",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=3,
            stream=True,
        )
        pieces = [c async for c in stream]
        assert pieces
        # The only rule is a glob, and "qwen2.5-3b" or "small" would be routed by the default
        # route to big: the one id that gets the model it names is big's own.
        assert [m.id for m in (await sdk.models.list()).data] == ["big"]
        other = await sdk.embeddings.create(model="anything", input="x")
        assert len(other.data[0].embedding) > 0
    received = (await small.http.get("/debug/requests")).json()["requests"][0]
    headers = {k.lower(): v for k, v in received["headers"].items()}
    assert "authorization" not in headers
    assert headers["x-hotseat-request-id"] == "sim-1"
    event = await audit.request_event("sim-1")
    assert (event["outcome"], event["backend"], event["rule"]) == ("served", "small", "small-first")


async def test_sim_error_status_falls_back(sims, start_router):
    """A sim's 429 passes through; its 503 moves the request on and (with passive health
    set to quarantine on one failure) quarantines it."""
    config, small, _ = sims
    router = await start_router(config, health_failures=1, health_clients=1)
    async with httpx.AsyncClient(timeout=10) as http:
        url = router.url + "/v1/chat/completions"
        body = {
            "model": "assistant",
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 1,
        }
        response = await http.post(url, json=body, headers={"x-sim-status": "429"})
        assert response.status_code == 429
        assert response.headers["x-hotseat-backend"] == "small"
        # Both sims honour the header, so the walk ends with every backend failed.
        response = await http.post(url, json=body, headers={"x-sim-status": "503"})
        assert response.status_code == 502
        # ... and both are now quarantined: the next request is not even tried.
        response = await http.post(url, json=body)
        assert response.status_code == 502
        assert len((await small.http.get("/debug/requests")).json()["requests"]) == 2


async def test_client_disconnect_frees_the_sim_slot(sims, start_router):
    """Leaving mid-stream stops the sim's generation (its slot is free again)."""
    config, small, _ = sims
    router = await start_router(config)
    async with (
        httpx.AsyncClient(timeout=10) as http,
        http.stream(
            "POST",
            router.url + "/v1/chat/completions",
            json={
                "model": "assistant",
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 100000,
                "stream": True,
            },
        ) as response,
    ):
        assert response.status_code == 200
        assert response.headers["x-hotseat-backend"] == "small"
        # Kept referenced: an iterator dropped half-way is finalised by the event loop,
        # which closes the stream (the client would leave before the check below).
        lines = response.aiter_lines()
        received = await _until_first_token(lines)
        # A token arrived, so a slot is generating (99,999 tokens to go at 50 a second).
        assert await _generating(small), received
    # The sim offers no event for a freed slot: poll /slots.
    await eventually(lambda: _idle(small), timeout=20, interval=0.02)


async def _until_first_token(lines: AsyncIterator[str]) -> list[str]:
    """The SSE lines read up to the first one that carries generated text (the assertion
    shows them all if the stream ends first)."""
    received: list[str] = []
    async for line in lines:
        received.append(line)
        if line.startswith("data: {"):
            delta = json.loads(line.removeprefix("data: "))["choices"][0]["delta"]
            if delta.get("content"):
                return received
    raise AssertionError(f"the stream ended before any token: {received!r}")


async def _generating(sim: SimHandle) -> bool:
    return any(s["is_processing"] for s in (await sim.http.get("/slots")).json())


async def _idle(sim: SimHandle) -> bool:
    return not await _generating(sim)
