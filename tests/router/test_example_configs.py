"""Every config in examples/, as a client sees it: each id ``GET /v1/models`` lists is
served by the model it names, and a model no rule names is refused (404
``model_not_found``) unless the config sends such models to its default route.

The router runs each example as written, with only its backends' addresses pointed at
upstreams of the test's own (one per backend, answering with the model it was sent) and
its pools' leases granted at once (a pool decides when a member serves, never which)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from hotseat_common.config import Backend, HotseatConfig, UnknownModels, parse_config
from tests.router.fake_activation import FakeActivation

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
CHAT = "/v1/chat/completions"


def _ids(backend: Backend) -> set[str]:
    """What a client may call the model ``backend`` serves."""
    return {n for n in (backend.name, backend.display_name, backend.model) if n is not None}


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 2, EXAMPLES


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
async def test_every_listed_id_is_served_by_the_model_it_names(
    path: Path, upstream, start_router, client
) -> None:
    raw: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    fakes = {b["name"]: await upstream(b["name"]) for b in raw["backends"]}
    for backend in raw["backends"]:
        backend["address"] = fakes[backend["name"]].url
    config: HotseatConfig = parse_config(raw)
    router = await start_router(config, activation_factory=FakeActivation().factory)

    listing = await client.get(router.url + "/v1/models")
    assert listing.status_code == 200
    entries = listing.json()["data"]
    ids = [entry["id"] for entry in entries]
    literals = [m for r in config.rules for m in r.match.models if not set(m) & set("*?[")]
    assert set(literals) <= set(ids), "a literal model of a rule is missing"
    assert len(ids) == len(set(ids))
    for entry in entries:
        model = entry["id"]
        one = await client.get(f"{router.url}/v1/models/{model}")
        assert one.json() == entry
        preferred = entry["hotseat"]["backends"][0]
        backend = config.backend(preferred)
        assert backend is not None
        assert model in _ids(backend), f"{model} is listed with {preferred}, another model"
        served = await client.post(
            router.url + CHAT,
            json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert served.status_code == 200, served.text
        assert served.headers["x-hotseat-backend"] == preferred, model
        assert served.json()["model"] == (backend.model or model)
        assert fakes[preferred].requests[-1].json()["model"] == (backend.model or model)

    # Every backend's own upstream model name, and one nobody names.
    others = [b.model for b in config.backends if b.model and b.model not in ids]
    for model in [*others, "no-such-model"]:
        before = sum(len(f.requests) for f in fakes.values())
        answer = await client.post(router.url + CHAT, json={"model": model, "messages": []})
        if config.unknown_models is UnknownModels.DEFAULT_ROUTE:
            assert answer.headers["x-hotseat-backend"] == config.default_route, model
        else:
            assert answer.status_code == 404, (model, answer.text)
            assert answer.json()["error"]["code"] == "model_not_found"
            assert sum(len(f.requests) for f in fakes.values()) == before
        missing = await client.get(f"{router.url}/v1/models/{model}")
        assert missing.status_code == 404
