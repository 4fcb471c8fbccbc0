"""A first end-to-end pass through a real router."""

from __future__ import annotations


async def test_served_through_router(upstream, start_router, client, audit):
    """A chat completion reaches the matched backend and comes back with Hotseat headers."""
    a = await upstream("a")
    router = await start_router(
        {"backends": [{"name": "a", "address": a.url}], "defaultRoute": "a"}
    )
    response = await client.post(
        router.url + "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert response.status_code == 200, response.text
    assert response.headers["x-hotseat-backend"] == "a"
    assert response.json()["choices"][0]["message"]["content"] == "from a"
    event = await audit.request_event(response.headers["x-hotseat-request-id"])
    assert event["outcome"] == "served"
    assert event["backend"] == "a"
    assert event["status"] == 200
