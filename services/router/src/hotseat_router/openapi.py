"""The router's OpenAPI document (served at ``/openapi.json``).

The proxy endpoints are raw ASGI (see :mod:`hotseat_router.proxy`), so FastAPI cannot
describe them; this document is written by hand and kept true by a schemathesis run
against a live router (tests/security/test_schemathesis.py). It states the router's own
contract: the body must be a JSON object with a non-empty ``model``; everything else is
the upstream's to judge and passes through untouched, as do the upstream's answers.
"""

from __future__ import annotations

from typing import Any

_REQUEST_ID = {
    "x-hotseat-request-id": {
        "description": "The client's request id if it sent a valid one, else a new one",
        "required": True,
        "schema": {"type": "string", "minLength": 1},
    }
}
_RETRY_AFTER = {
    "Retry-After": {
        "description": "Whole seconds after which a retry is likely to be served",
        "required": True,
        "schema": {"type": "string", "pattern": "^[0-9]+$"},
    }
}


def _error(description: str, *, retry: bool = False) -> dict[str, Any]:
    headers = {**_REQUEST_ID, **(_RETRY_AFTER if retry else {})}
    return {
        "description": description,
        "headers": headers,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def _proxy(summary: str, example_extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "security": [{"bearer": []}],
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {"$ref": "#/components/schemas/ProxyRequest"},
                        "example": {"model": "assistant", **example_extra},
                    }
                },
            },
            "responses": {
                "200": {
                    "description": "The upstream's answer, relayed as it arrives",
                    "headers": _REQUEST_ID,
                    "content": {
                        "application/json": {"schema": {"type": "object"}},
                        "text/event-stream": {"schema": {"type": "string"}},
                    },
                },
                "400": _error("Invalid JSON, or no non-empty string 'model'"),
                "401": _error("Missing or wrong API key"),
                "404": _error("No rule routes the model (model_not_found)"),
                "413": _error("The body is larger than router.maxBodyBytes"),
                "4XX": {
                    "description": "An upstream's own client error, passed through",
                    "headers": _REQUEST_ID,
                    "content": {"application/json": {"schema": {}}},
                },
                "502": _error("No backend of the route could serve (all_backends_failed)"),
                "503": _error(
                    "Pool activation timeout, incumbent busy, queue full, fail closed or "
                    "controller unavailable",
                    retry=True,
                ),
                "504": _error("The request deadline passed (request_timeout)"),
            },
        }
    }


def router_openapi(*, api_keys: bool) -> dict[str, Any]:
    """The document; ``api_keys`` says whether the proxy endpoints require a Bearer key."""
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "Hotseat router",
            "version": "1",
            "description": "OpenAI-compatible routing in front of GPU model pools.",
        },
        "paths": {
            "/v1/chat/completions": _proxy(
                "Chat completion (streaming or not)",
                {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            ),
            "/v1/completions": _proxy("Text completion", {"prompt": "hi", "max_tokens": 4}),
            "/v1/embeddings": _proxy("Embeddings", {"input": "hi"}),
            "/v1/models": {
                "get": {
                    "summary": "The models the router serves",
                    "security": [{"bearer": []}],
                    "responses": {
                        "200": {
                            "description": "Exactly the ids a client can send and get that model",
                            "headers": _REQUEST_ID,
                            "content": {
                                "application/json": {
                                    "schema": {"$ref": "#/components/schemas/ModelList"}
                                }
                            },
                        },
                        "401": _error("Missing or wrong API key"),
                    },
                }
            },
            "/v1/models/{model}": {
                "get": {
                    "summary": "One model a client can send",
                    "security": [{"bearer": []}],
                    "parameters": [
                        {
                            "name": "model",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string"},
                        }
                    ],
                    "responses": {
                        "200": {
                            "description": "The model, the rule that routes it and its backends",
                            "headers": _REQUEST_ID,
                            "content": {
                                "application/json": {
                                    "schema": {"$ref": "#/components/schemas/Model"}
                                }
                            },
                        },
                        "401": _error("Missing or wrong API key"),
                        "404": _error("No model of that id (model_not_found)"),
                    },
                }
            },
        },
        "components": {
            "schemas": {
                "ProxyRequest": {
                    "type": "object",
                    "required": ["model"],
                    "properties": {"model": {"type": "string", "minLength": 1}},
                    "additionalProperties": True,
                },
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {
                        "error": {
                            "type": "object",
                            "required": ["message", "type", "param", "code"],
                            "properties": {
                                "message": {"type": "string"},
                                "type": {"type": "string"},
                                "param": {"type": ["string", "null"]},
                                "code": {"type": ["string", "null"]},
                            },
                        }
                    },
                },
                "ModelList": {
                    "type": "object",
                    "required": ["object", "data"],
                    "properties": {
                        "object": {"const": "list"},
                        "data": {"type": "array", "items": {"$ref": "#/components/schemas/Model"}},
                    },
                },
                "Model": {
                    "type": "object",
                    "required": ["id", "object", "owned_by"],
                    "properties": {
                        "id": {"type": "string"},
                        "object": {"const": "model"},
                        "created": {"type": "integer"},
                        "owned_by": {"type": "string"},
                        "hotseat": {
                            "type": "object",
                            "properties": {
                                "rule": {"type": ["string", "null"]},
                                "backends": {"type": "array", "items": {"type": "string"}},
                            },
                        },
                    },
                },
            },
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
    if not api_keys:
        for path in doc["paths"].values():
            for operation in path.values():
                operation.pop("security", None)
                operation["responses"].pop("401", None)
        del doc["components"]["securitySchemes"]
    return doc
