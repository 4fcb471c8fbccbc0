"""The sim speaks the OpenAI API as the real ``openai`` SDK parses it."""

from __future__ import annotations

import asyncio
import math
import time

import openai
import pytest

from tests.sim.conftest import StartSim
from tests.support.sim import sim_pool_config


@pytest.fixture
def config():
    return sim_pool_config({"assistant": {"tokensPerSecond": 500, "slots": 2}})


async def test_chat_completion_parses_with_usage(start_sim: StartSim, config) -> None:
    """A non-streaming chat completion parses, has max_tokens tokens and usage, echoes the model."""
    sim = await start_sim(config, "assistant", loaded=True)
    async with sim.openai() as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="my-model",
            messages=[{"role": "user", "content": "say something nice"}],
            max_tokens=7,
        )
    completion = raw.parse()
    assert raw.headers["x-sim-member"] == "assistant"
    assert completion.model == "my-model"
    assert completion.system_fingerprint == "hotseat-sim/assistant"
    text = completion.choices[0].message.content
    assert text is not None
    assert len(text.split()) == 7
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 7
    assert completion.usage.prompt_tokens == 3
    assert completion.usage.total_tokens == 10


async def test_chat_completion_defaults_to_16_tokens(start_sim: StartSim, config) -> None:
    """Without max_tokens the sim generates 16 tokens and stops."""
    sim = await start_sim(config, "assistant", loaded=True)
    async with sim.openai() as client:
        completion = await client.chat.completions.create(
            model="assistant", messages=[{"role": "user", "content": "hi"}]
        )
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 16
    assert completion.choices[0].finish_reason == "stop"


async def test_chat_stream_parses_and_ends_with_usage(start_sim: StartSim, config) -> None:
    """A streamed chat completion yields max_tokens content chunks, a finish chunk and usage."""
    sim = await start_sim(config, "assistant", loaded=True)
    async with sim.openai() as client:
        stream = await client.chat.completions.create(
            model="assistant",
            messages=[{"role": "user", "content": "stream please"}],
            max_tokens=9,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    contents = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert len(contents) == 9
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length"
    assert all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 9
    assert {c.model for c in chunks} == {"assistant"}


async def test_streamed_and_plain_text_agree(start_sim: StartSim, config) -> None:
    """The same prompt gives the same text streamed or not (deterministic generation)."""
    sim = await start_sim(config, "assistant", loaded=True)
    messages = [{"role": "user", "content": "determinism"}]
    async with sim.openai() as client:
        plain = await client.chat.completions.create(model="a", messages=messages, max_tokens=5)
        stream = await client.chat.completions.create(
            model="a", messages=messages, max_tokens=5, stream=True
        )
        streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert plain.choices[0].message.content == streamed


async def test_legacy_completions_plain_and_streamed(start_sim: StartSim, config) -> None:
    """/v1/completions answers JSON and SSE that the SDK parses, with max_tokens tokens."""
    sim = await start_sim(config, "assistant", loaded=True)
    async with sim.openai() as client:
        plain = await client.completions.create(model="m", prompt="once upon", max_tokens=4)
        stream = await client.completions.create(
            model="m",
            prompt="once upon",
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
    assert plain.usage is not None
    assert plain.usage.completion_tokens == 4
    assert len(plain.choices[0].text.split()) == 4
    texts = [c.choices[0].text for c in chunks if c.choices and c.choices[0].text]
    assert "".join(texts) == plain.choices[0].text
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 4


async def test_embeddings_are_deterministic_unit_vectors(start_sim: StartSim, config) -> None:
    """Embeddings (the SDK's default base64 and plain floats) are the same for the same text."""
    sim = await start_sim(config, "assistant", loaded=True)
    async with sim.openai() as client:
        first = await client.embeddings.create(model="e", input=["alpha", "beta"])
        again = await client.embeddings.create(
            model="e", input="alpha", encoding_format="float", dimensions=256
        )
        small = await client.embeddings.create(model="e", input="alpha", dimensions=8)
    alpha, beta = first.data[0].embedding, first.data[1].embedding
    assert len(alpha) == 256
    assert math.isclose(sum(v * v for v in alpha), 1.0, rel_tol=1e-4)
    assert alpha != beta
    assert again.data[0].embedding == pytest.approx(alpha, abs=1e-6)
    assert len(small.data[0].embedding) == 8
    assert first.usage.prompt_tokens == 2


async def test_models_lists_the_backend_model(start_sim: StartSim, config) -> None:
    """GET /v1/models lists the backend's model."""
    sim = await start_sim(config, "assistant", loaded=True)
    async with sim.openai() as client:
        page = await client.models.list()
    assert [m.id for m in page.data] == ["assistant"]


async def test_not_loaded_answers_503_like_llama_cpp(start_sim: StartSim, config) -> None:
    """Every OpenAI endpoint answers 503 with llama.cpp's body while the model is unloaded."""
    sim = await start_sim(config, "assistant")
    async with sim.openai() as client:
        with pytest.raises(openai.InternalServerError) as caught:
            await client.chat.completions.create(
                model="a", messages=[{"role": "user", "content": "x"}]
            )
    assert caught.value.status_code == 503
    for method, path in [
        ("POST", "/v1/completions"),
        ("POST", "/v1/embeddings"),
        ("GET", "/v1/models"),
    ]:
        body = {"prompt": "x", "input": "x"} if method == "POST" else None
        response = await sim.http.request(method, path, json=body)
        assert response.status_code == 503, path
        assert response.json()["error"]["type"] == "unavailable_error"
        assert response.headers["x-sim-member"] == "assistant"


async def test_bad_requests_get_400(start_sim: StartSim, config) -> None:
    """Invalid JSON, missing messages and n>1 are rejected with an OpenAI error body."""
    sim = await start_sim(config, "assistant", loaded=True)
    bad_json = await sim.http.post(
        "/v1/chat/completions", content=b"{nope", headers={"content-type": "application/json"}
    )
    no_messages = await sim.http.post("/v1/chat/completions", json={"model": "a"})
    many = await sim.http.post(
        "/v1/chat/completions",
        json={"model": "a", "n": 2, "messages": [{"role": "user", "content": "x"}]},
    )
    for response in (bad_json, no_messages, many):
        assert response.status_code == 400
        assert response.json()["error"]["type"] == "invalid_request_error"


async def test_forced_status_header(start_sim: StartSim, config) -> None:
    """x-sim-status makes the sim answer that status with an OpenAI error body."""
    sim = await start_sim(config, "assistant", loaded=True)
    response = await sim.http.post(
        "/v1/chat/completions",
        json={"model": "a", "messages": [{"role": "user", "content": "x"}]},
        headers={"x-sim-status": "502"},
    )
    assert response.status_code == 502
    assert response.json()["error"]["code"] == 502


async def test_debug_echo_and_request_log(start_sim: StartSim, config) -> None:
    """/debug/echo returns what it received; /debug/requests shows what reached the OpenAI API."""
    sim = await start_sim(config, "assistant", loaded=True)
    echo = await sim.http.post(
        "/debug/echo?x=1", json={"hello": "world"}, headers={"x-custom": "yes"}
    )
    assert echo.json()["method"] == "POST"
    assert echo.json()["headers"]["x-custom"] == "yes"
    assert echo.json()["body"] == {"hello": "world"}
    assert echo.json()["query"] == "x=1"
    async with sim.openai() as client:
        await client.chat.completions.create(
            model="logged",
            messages=[{"role": "user", "content": "x"}],
            max_tokens=1,
            extra_headers={"x-hotseat-request-id": "req-42"},
        )
    log = (await sim.http.get("/debug/requests")).json()["requests"]
    chat = [r for r in log if r["path"] == "/v1/chat/completions"]
    assert len(chat) == 1
    assert chat[0]["headers"]["x-hotseat-request-id"] == "req-42"
    assert chat[0]["headers"]["authorization"] == "Bearer unused"
    assert chat[0]["body"]["model"] == "logged"


async def test_request_log_omits_large_bodies(start_sim: StartSim, config) -> None:
    """/debug/requests keeps bodies up to 64 KiB and only the size of larger ones."""
    sim = await start_sim(config, "assistant", loaded=True)
    big = {"padding": "x" * 70_000}
    await sim.http.post("/debug/echo", json={"small": True})
    await sim.http.post("/debug/echo", json=big)
    log = (await sim.http.get("/debug/requests")).json()["requests"]
    assert log[0]["body"] == {"small": True}
    assert log[1]["body"]["omitted_bytes"] > 70_000
    assert (await sim.http.delete("/debug/requests")).status_code == 204
    assert (await sim.http.get("/debug/requests")).json()["requests"] == []


async def test_request_log_times_a_request_by_its_head_not_its_handler(
    start_sim: StartSim, config
) -> None:
    """A request's logged ``time`` is when its head reached the sim, not when the sim got
    round to logging it: the body sent half a second after the head does not move it."""
    sim = await start_sim(config, "assistant", loaded=True)
    host, port = sim.url.removeprefix("http://").rsplit(":", 1)
    body = b'{"model": "late", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}'
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        head_sent = time.time()
        writer.write(head)
        await writer.drain()
        await asyncio.sleep(0.5)  # the stimulus: a body that comes late
        body_sent = time.time()
        writer.write(body)
        await writer.drain()
        status = await reader.readline()
        await reader.read()
    finally:
        writer.close()
    assert status.startswith(b"HTTP/1.1 200")
    log = (await sim.http.get("/debug/requests")).json()["requests"]
    (logged,) = [r for r in log if r["body"]["model"] == "late"]
    assert head_sent <= logged["time"] < body_sent
