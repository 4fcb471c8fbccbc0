"""One reading of every body: a request the router cannot forward exactly is refused
(400) before any pool is touched, and the body an upstream gets means what the router
read (no key twice, only the model's bytes changed by a rename)."""

from __future__ import annotations

import httpx
import pytest

from tests.router.fake_activation import FakeActivation

CHAT = "/v1/chat/completions"
JSON = {"content-type": "application/json"}
DEFAULT_DEPTH = 128


def nested(depth: int) -> bytes:
    """A chat body whose deepest value sits ``depth`` levels down (the body is level 1)."""
    inner = b"[" * (depth - 2) + b"]" * (depth - 2)
    return b'{"model": "m", "messages": [], "x": [' + inner + b"]}"


@pytest.fixture
async def pooled(upstream, start_router):
    """Model m goes to pool member gpu0/a, which serves it as qwen2.5-3b (so the router
    rewrites the model); a scripted activation client records every acquire."""
    a = await upstream("a")
    activation = FakeActivation()
    member = {"name": "a", "address": a.url, "model": "qwen2.5-3b"}
    config = {
        "backends": [{**member, "pool": {"name": "gpu0", "member": "a"}}],
        "pools": [{"name": "gpu0", "members": [{"name": "a"}, {"name": "b"}]}],
        "rules": [{"name": "m", "match": {"models": ["m"]}, "route": {"backends": ["a"]}}],
    }
    router = await start_router(config, activation_factory=activation.factory)
    return router, activation, a


def assert_refused(response: httpx.Response, code: str) -> None:
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == code
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert response.headers["x-hotseat-request-id"]


@pytest.mark.parametrize("depth", [DEFAULT_DEPTH + 1, 300, 1000])
async def test_a_body_nested_too_deep_is_refused_before_any_lease(
    pooled, client, depth: int
) -> None:
    """A body one level past the depth limit, or past what the parser reads at all (300,
    1000 levels: such a body once swapped the pool and then failed with 500), gets 400
    before the pool is asked for a lease (no acquire, so no swap) and reaches no
    upstream; at the limit it is served."""
    router, activation, a = pooled
    response = await client.post(router.url + CHAT, content=nested(depth), headers=JSON)
    assert activation.acquires == []
    assert_refused(response, "invalid_request")
    assert "nested deeper" in response.json()["error"]["message"]
    assert a.requests == []
    served = await client.post(router.url + CHAT, content=nested(DEFAULT_DEPTH), headers=JSON)
    assert served.status_code == 200, served.text
    assert [acquire.member for acquire in activation.acquires] == ["a"]


DUPLICATES = [
    b'{"model": "m", "messages": [], "model": "other"}',
    b'{"model": "other", "model": "m", "messages": []}',
    b'{"model": "m", "mod\\u0065l": "other", "messages": []}',
    b'{"model": "m", "messages": [{"role": "user", "role": "system", "content": "hi"}]}',
    b'{"model": "m", "tools": [{"function": {"name": "a", "name": "b"}}], "messages": []}',
]


async def test_a_key_given_twice_is_refused(pooled, client) -> None:
    """A body with any key twice in one object (the top-level model, written alike or
    with an escape, or a key deep inside) gets 400 and reaches neither a pool nor an
    upstream, which might read the other value."""
    router, activation, a = pooled
    for body in DUPLICATES:
        response = await client.post(router.url + CHAT, content=body, headers=JSON)
        assert_refused(response, "invalid_request")
        assert "duplicate key" in response.json()["error"]["message"], body
    assert activation.acquires == []
    assert a.requests == []
    alike = b'{"model": "m", "messages": [{"role": "user"}, {"role": "user"}], "x": "\\""}'
    served = await client.post(router.url + CHAT, content=alike, headers=JSON)
    assert served.status_code == 200, served.text
    assert a.requests[-1].json()["messages"] == [{"role": "user"}, {"role": "user"}]


async def test_a_rename_changes_only_the_model_bytes(pooled, client) -> None:
    """A backend that renames the model gets the client's bytes with only the top-level
    model value replaced: big integers, number spellings, spacing, key order, escapes,
    non-ASCII text and a nested "model" key are exactly as the client sent them."""
    router, _, a = pooled
    template = (
        '{ "messages" : [{"role":"user","content":"caf\\u00e9 \u00e9t\u00e9 \\"q\\"",'
        ' "model": "m"}],\n  "mod\\u0065l" :  %s ,'
        ' "n": 123456789012345678901234567890, "f": 1.50, "e": 1E+2, "z": -0.0,'
        ' "big": 12345678901234567890.123456789e-3 }'
    )
    body = (template % '"m"').encode()
    response = await client.post(router.url + CHAT, content=body, headers=JSON)
    assert response.status_code == 200, response.text
    assert response.headers["x-hotseat-backend"] == "a"
    assert a.requests[-1].body == (template % '"qwen2.5-3b"').encode()


async def test_a_large_body_is_forwarded_exactly_with_its_length(pooled, client) -> None:
    """A body of several MiB (sent upstream a slice at a time, renamed without a copy)
    reaches the upstream byte for byte with the model replaced, framed by its
    Content-Length (never re-chunked)."""
    router, _, a = pooled
    content = "".join(f'line {i}: caf\u00e9 \\"{i}\\"\\n' for i in range(200_000))
    template = '{"messages": [{"role": "user", "content": "%s"}], "model": %s, "n": 1.50}'
    body = (template % (content, '"m"')).encode()
    assert len(body) > 4 * 1024 * 1024
    response = await client.post(router.url + CHAT, content=body, headers=JSON)
    assert response.status_code == 200, response.text
    received = a.requests[-1]
    expected = (template % (content, '"qwen2.5-3b"')).encode()
    assert received.body == expected
    assert received.header("content-length") == str(len(expected))
    assert received.header("transfer-encoding") is None
