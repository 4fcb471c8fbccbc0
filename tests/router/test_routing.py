"""Matching: rules in order by model glob, header and classification; the default route."""

from __future__ import annotations

import pytest

CHAT = "/v1/chat/completions"


def body(model: str, **extra: object) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}


@pytest.fixture
async def three(upstream):
    return [await upstream(name) for name in ("a", "b", "c")]


def backends(fakes, **extra_by_name):
    return [{"name": f.name, "address": f.url, **extra_by_name.get(f.name, {})} for f in fakes]


async def test_model_glob_header_and_classification(three, start_router, client):
    """The first rule whose globs, headers (any name case) and classification all match wins."""
    router = await start_router(
        {
            "backends": backends(three),
            "rules": [
                {
                    "name": "tenant",
                    "match": {"models": ["gpt-*"], "headers": {"X-Tenant": "blue"}},
                    "route": {"backends": ["b"]},
                },
                {
                    "name": "secret",
                    "match": {"dataClassification": ["pii"]},
                    "route": {"backends": ["c"]},
                },
                {"name": "gpt", "match": {"models": ["gpt-*", "o?"]}, "route": {"backends": ["a"]}},
            ],
        }
    )
    url = router.url + CHAT

    async def served_by(model: str, headers: dict[str, str] | None = None) -> str:
        response = await client.post(url, json=body(model), headers=headers or {})
        assert response.status_code == 200, response.text
        return response.headers["x-hotseat-backend"]

    assert await served_by("gpt-4o") == "a"
    assert await served_by("o3") == "a"
    assert await served_by("gpt-4o", {"x-tenant": "blue"}) == "b"
    assert await served_by("gpt-4o", {"X-TENANT": "blue"}) == "b"
    assert await served_by("gpt-4o", {"x-tenant": "red"}) == "a"
    assert await served_by("llama", {"x-hotseat-classification": "PII"}) == "c"
    assert await served_by("gpt-4o", {"x-hotseat-classification": "pii"}) == "c"
    missing = await client.post(url, json=body("llama"))
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"
    assert [len(f.requests) for f in three] == [3, 2, 2]


async def test_default_route_static(three, start_router, client):
    """With Static, an unmatched model goes to defaultRoute even when it names a backend."""
    router = await start_router({"backends": backends(three), "defaultRoute": "c"})
    for model in ("anything", "a"):
        response = await client.post(router.url + CHAT, json=body(model))
        assert response.headers["x-hotseat-backend"] == "c"


async def test_default_route_backend_name_match(three, start_router, client):
    """With BackendNameMatch, a model naming a backend or its displayName goes there."""
    router = await start_router(
        {
            "backends": backends(three, b={"displayName": "Bee 7B"}),
            "defaultRoute": "c",
            "defaultRouteStrategy": "BackendNameMatch",
        }
    )

    async def served_by(model: str) -> str:
        response = await client.post(router.url + CHAT, json=body(model))
        assert response.status_code == 200, response.text
        return response.headers["x-hotseat-backend"]

    assert await served_by("a") == "a"
    assert await served_by("Bee 7B") == "b"
    assert await served_by("unknown") == "c"


async def test_backend_name_match_without_default_is_404(three, start_router, client):
    """BackendNameMatch with no defaultRoute answers 404 for a model naming nothing."""
    router = await start_router(
        {"backends": backends(three), "defaultRouteStrategy": "BackendNameMatch"}
    )
    assert (await client.post(router.url + CHAT, json=body("b"))).status_code == 200
    response = await client.post(router.url + CHAT, json=body("zzz"))
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"


async def test_model_rewrite_names_the_backend(three, start_router, client):
    """A backend's model is sent upstream; the header says which backend served."""
    a, _, _ = three
    router = await start_router(
        {"backends": backends(three, a={"model": "qwen2.5-3b"}), "defaultRoute": "a"}
    )
    raw = b'{"model": "assistant",   "messages": [], "temperature": 0.25}'
    response = await client.post(
        router.url + CHAT, content=raw, headers={"content-type": "application/json"}
    )
    assert response.headers["x-hotseat-backend"] == "a"
    assert response.json()["model"] == "qwen2.5-3b"
    assert a.requests[-1].json() == {"model": "qwen2.5-3b", "messages": [], "temperature": 0.25}


async def test_body_forwarded_byte_for_byte(three, start_router, client):
    """Without a rewrite the upstream receives exactly the bytes the client sent."""
    a, _, _ = three
    router = await start_router({"backends": backends(three), "defaultRoute": "a"})
    raw = b'{ "model":"m" ,"messages":[],  "x": 1.50}'
    await client.post(router.url + CHAT, content=raw, headers={"content-type": "application/json"})
    assert a.requests[-1].body == raw


async def test_other_endpoints_and_query_string(three, start_router, client):
    """Completions and embeddings are proxied too, with the path and query kept."""
    a, _, _ = three
    router = await start_router({"backends": backends(three), "defaultRoute": "a"})
    for path in ("/v1/completions", "/v1/embeddings?x=1"):
        response = await client.post(router.url + path, json={"model": "m", "input": "x"})
        assert response.status_code == 200
        assert a.requests[-1].path == path


async def test_models_lists_exactly_the_ids_that_get_the_model_they_name(
    three, start_router, client
):
    """GET /v1/models lists each literal model of a rule (never a glob) and each backend id
    (displayName, upstream model, name) routed to that backend first; an upstream model
    name the rules send elsewhere is not listed (a client picking it would be routed by the
    default route to another model). Every id listed is served by the backend it names."""
    router = await start_router(
        {
            "backends": backends(
                three, a={"displayName": "Ay", "model": "m1"}, b={"model": "m2"}, c={"model": "m3"}
            ),
            "rules": [
                {
                    "name": "small",
                    "match": {"models": ["assistant", "m1"]},
                    "route": {"backends": ["a", "b"]},
                },
                {
                    "name": "globs",
                    "match": {"models": ["gpt-*", "o?"]},
                    "route": {"backends": ["b"]},
                },
            ],
            "defaultRoute": "c",
        }
    )
    response = await client.get(router.url + "/v1/models")
    assert response.status_code == 200
    assert response.headers["x-hotseat-request-id"]
    listed = {m["id"]: m for m in response.json()["data"]}
    assert list(listed) == ["assistant", "m1", "m3", "c"]
    assert listed["assistant"]["hotseat"] == {"rule": "small", "backends": ["a", "b"]}
    assert listed["c"]["hotseat"] == {"rule": None, "backends": ["c"]}
    for model, entry in listed.items():
        served = await client.post(router.url + CHAT, json=body(model))
        assert served.headers["x-hotseat-backend"] == entry["hotseat"]["backends"][0], model
    # "Ay", "a", "m2", "b" are routed by the default route to c: not what they name.
    assert (await client.post(router.url + CHAT, json=body("m2"))).headers[
        "x-hotseat-backend"
    ] == "c"


async def test_one_model_by_id_and_an_unknown_one(three, start_router, client):
    """GET /v1/models/{id} answers a listed id (ids may hold a slash) and 404
    model_not_found for any other, in the OpenAI error body; other methods get 405."""
    router = await start_router(
        {
            "backends": backends(three, a={"model": "org/m1"}),
            "rules": [{"name": "r", "match": {"models": ["org/m1"]}, "route": {"backends": ["a"]}}],
        }
    )
    one = await client.get(router.url + "/v1/models/org/m1")
    assert one.status_code == 200
    assert one.json()["id"] == "org/m1"
    assert one.json()["hotseat"] == {"rule": "r", "backends": ["a"]}
    missing = await client.get(router.url + "/v1/models/nope")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"
    assert missing.headers["x-hotseat-request-id"]
    wrong = await client.delete(router.url + "/v1/models/org/m1")
    assert wrong.status_code == 405
    assert wrong.headers["allow"] == "GET, HEAD"
