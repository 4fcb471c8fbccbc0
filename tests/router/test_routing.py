"""Matching: rules in order by model glob, header and classification; the default route."""

from __future__ import annotations

from typing import Any

import pytest

CHAT = "/v1/chat/completions"


def body(model: str, **extra: object) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}


@pytest.fixture
async def three(upstream):
    return [await upstream(name) for name in ("a", "b", "c")]


TO_A = {"defaultRoute": "a", "unknownModels": "DefaultRoute"}
"""Every model to backend a."""


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


async def test_a_model_no_rule_names_is_refused_unless_the_config_says_so(
    three, start_router, client, audit
):
    """The default route serves a model that a rule names when that rule's other
    conditions did not match; a model no rule names gets 404 model_not_found (nothing
    reaches a backend), even with defaultRoute set, unless unknownModels: DefaultRoute."""
    rules = [
        {
            "name": "tenant",
            "match": {"models": ["gpt-*"], "headers": {"X-Tenant": "blue"}},
            "route": {"backends": ["b"]},
        }
    ]
    router = await start_router({"backends": backends(three), "rules": rules, "defaultRoute": "c"})
    named = await client.post(router.url + CHAT, json=body("gpt-4o"))
    assert named.headers["x-hotseat-backend"] == "c"
    for model in ("anything", "a", "qwen2.5-3b"):
        refused = await client.post(router.url + CHAT, json=body(model))
        assert refused.status_code == 404, model
        assert refused.json()["error"]["code"] == "model_not_found"
        assert model in refused.json()["error"]["message"]
        event = await audit.request_event(refused.headers["x-hotseat-request-id"])
        assert event["outcome"] == "no_route"
    assert [len(f.requests) for f in three] == [0, 0, 1]

    explicit = await start_router(
        {
            "backends": backends(three),
            "rules": rules,
            "defaultRoute": "c",
            "unknownModels": "DefaultRoute",
        }
    )
    for model in ("anything", "a", "gpt-4o"):
        response = await client.post(explicit.url + CHAT, json=body(model))
        assert response.headers["x-hotseat-backend"] == "c", model


async def test_default_route_backend_name_match(three, start_router, client):
    """With BackendNameMatch, a model naming a backend or its displayName goes there; any
    other goes to defaultRoute only with unknownModels: DefaultRoute."""
    config = {
        "backends": backends(three, b={"displayName": "Bee 7B"}),
        "defaultRoute": "c",
        "defaultRouteStrategy": "BackendNameMatch",
    }
    strict = await start_router(config)
    explicit = await start_router({**config, "unknownModels": "DefaultRoute"})

    async def served_by(router: Any, model: str) -> str:
        response = await client.post(router.url + CHAT, json=body(model))
        assert response.status_code == 200, response.text
        return str(response.headers["x-hotseat-backend"])

    for router in (strict, explicit):
        assert await served_by(router, "a") == "a"
        assert await served_by(router, "Bee 7B") == "b"
    assert await served_by(explicit, "unknown") == "c"
    refused = await client.post(strict.url + CHAT, json=body("unknown"))
    assert refused.status_code == 404
    assert refused.json()["error"]["code"] == "model_not_found"


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
    router = await start_router({"backends": backends(three, a={"model": "qwen2.5-3b"}), **TO_A})
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
    router = await start_router({"backends": backends(three), **TO_A})
    raw = b'{ "model":"m" ,"messages":[],  "x": 1.50}'
    await client.post(router.url + CHAT, content=raw, headers={"content-type": "application/json"})
    assert a.requests[-1].body == raw


async def test_other_endpoints_and_query_string(three, start_router, client):
    """Completions and embeddings are proxied too, with the path and query kept."""
    a, _, _ = three
    router = await start_router({"backends": backends(three), **TO_A})
    for path in ("/v1/completions", "/v1/embeddings?x=1"):
        response = await client.post(router.url + path, json={"model": "m", "input": "x"})
        assert response.status_code == 200
        assert a.requests[-1].path == path


@pytest.mark.parametrize(
    ("unknown_models", "ids"),
    [("Refuse", ["assistant", "m1"]), ("DefaultRoute", ["assistant", "m1", "m3", "c"])],
)
async def test_models_lists_exactly_the_ids_that_get_the_model_they_name(
    three, start_router, client, unknown_models, ids
):
    """GET /v1/models lists each literal model of a rule (never a glob) and each backend id
    (displayName, upstream model, name) routed to that backend first; an upstream model
    name the rules send elsewhere is not listed (a client picking it would be routed by the
    default route to another model, or refused). Every id listed is served by the backend
    it names; every other id is refused, or served by the default route's backend."""
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
            "unknownModels": unknown_models,
        }
    )
    response = await client.get(router.url + "/v1/models")
    assert response.status_code == 200
    assert response.headers["x-hotseat-request-id"]
    listed = {m["id"]: m for m in response.json()["data"]}
    assert list(listed) == ids
    assert listed["assistant"]["hotseat"] == {"rule": "small", "backends": ["a", "b"]}
    for model, entry in listed.items():
        served = await client.post(router.url + CHAT, json=body(model))
        assert served.headers["x-hotseat-backend"] == entry["hotseat"]["backends"][0], model
    if "c" in listed:
        assert listed["c"]["hotseat"] == {"rule": None, "backends": ["c"]}
    # "Ay", "a", "m2", "b" are not what the rules send to the backend they name.
    for other in ("Ay", "a", "m2", "b"):
        answer = await client.post(router.url + CHAT, json=body(other))
        if unknown_models == "Refuse":
            assert answer.status_code == 404, other
        else:
            assert answer.headers["x-hotseat-backend"] == "c", other


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
