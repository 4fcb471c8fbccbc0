"""The models a client can ask for: ``GET /v1/models`` and ``GET /v1/models/{id}``.

An id is listed only when a client that sends it, with no routing headers, is routed to
the model it names (a client such as Open WebUI or LiteLLM picks from this list):

- every literal model name in a rule's ``match.models`` (a glob matches an open-ended set
  and is left out), routed as the rules say;
- a backend's ``displayName``, upstream ``model`` or name, when that id is routed to that
  backend first (by a rule's glob, by ``defaultRouteStrategy: BackendNameMatch``, or by
  the default route under ``unknownModels: DefaultRoute``). An upstream model name that
  the rules send elsewhere, or refuse, is not listed: it is what the router sends
  upstream, not what a client should send.

Both follow from :meth:`Matcher.route` itself, so the list cannot promise a route the
router would not take.

Each entry names the rule that routes it (``null`` for the default route) and the
backends it prefers, in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from hotseat_common.config.model import HotseatConfig
from hotseat_router.matching import Matcher, Route

_GLOB = frozenset("*?[")


@dataclass(frozen=True, slots=True)
class Catalog:
    listing: bytes
    """The ``GET /v1/models`` body."""
    entries: dict[str, bytes]
    """id -> its ``GET /v1/models/{id}`` body."""

    def entry(self, model: str) -> bytes | None:
        return self.entries.get(model)


def _object(model: str, route: Route) -> dict[str, Any]:
    return {
        "id": model,
        "object": "model",
        "created": 0,
        "owned_by": "hotseat",
        "hotseat": {"rule": route.rule, "backends": [b.name for b in route.backends]},
    }


def build_catalog(config: HotseatConfig, matcher: Matcher) -> Catalog:
    objects: dict[str, dict[str, Any]] = {}
    for rule in config.rules:
        for pattern in rule.match.models:
            if _GLOB.isdisjoint(pattern) and pattern not in objects:
                route = matcher.route(pattern, {})
                if route is not None and route.backends:
                    objects[pattern] = _object(pattern, route)
    for backend in config.backends:
        for model in (backend.display_name, backend.model, backend.name):
            if model is None or model in objects:
                continue
            route = matcher.route(model, {})
            if route is not None and route.backends and route.backends[0].name == backend.name:
                objects[model] = _object(model, route)
    data = list(objects.values())
    return Catalog(
        listing=orjson.dumps({"object": "list", "data": data}),
        entries={model: orjson.dumps(obj) for model, obj in objects.items()},
    )
