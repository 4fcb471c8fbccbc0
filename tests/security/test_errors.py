"""Every answer the router gives on its own has one shape, whatever the client sent: the
OpenAI error body (``message``, ``type``, ``param``, ``code``) and an
``x-hotseat-request-id``. Paths outside ``/v1``, methods no route answers, requests the
HTTP parser rejects, and a failure inside the router (whose text stays in the log)."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
import structlog

from tests.router.fake_activation import FakeActivation
from tests.security.conftest import CLIENT_KEY, SecureRouter
from tests.security.rawhttp import answer_of, connect, header

AUTH = {"authorization": f"Bearer {CLIENT_KEY}"}
ERROR_KEYS = {"message", "type", "param", "code"}


def assert_openai_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """``response`` is the router's own ``status`` answer with ``code``, in the OpenAI shape
    and with a request id; returns the error object."""
    where = (response.request.method, str(response.request.url), response.text)
    assert response.status_code == status, where
    assert response.headers["content-type"].startswith("application/json"), where
    assert response.headers.get("x-hotseat-request-id"), where
    body = response.json()
    assert set(body) == {"error"}, where
    error: dict[str, Any] = body["error"]
    assert set(error) == ERROR_KEYS, where
    assert error["code"] == code, where
    assert isinstance(error["message"], str), where
    assert error["message"], where
    assert error["type"] in {"invalid_request_error", "server_error"}, where
    return error


OUTSIDE_V1 = [
    ("GET", "/nope"),
    ("GET", "/v2/chat/completions"),
    ("POST", "/v2/x"),
    ("GET", "/"),
    ("GET", "/v1"),
    ("TRACE", "/v1"),
    ("GET", "/healthz/"),
    ("DELETE", "/anything/at/all"),
    ("GET", "/healthz/x"),
    ("TRACE", "/nope"),
]


async def test_paths_outside_v1_get_the_openai_404(secure_router: SecureRouter) -> None:
    """A path outside ``/v1`` that nothing serves, with or without a key and with any
    method, is a 404 ``unknown_url`` in the OpenAI shape with a request id (the client's
    own when it sent a valid one), never the framework's ``{"detail": ...}``, nor its
    307 to the path with a slash added or removed (whose Location echoes the Host)."""
    async with httpx.AsyncClient(base_url=secure_router.url, timeout=10) as client:
        for method, path in OUTSIDE_V1:
            for headers in ({}, AUTH):
                response = await client.request(method, path, headers=headers)
                assert_openai_error(response, 404, "unknown_url")
        mine = await client.get("/nope", headers={"x-hotseat-request-id": "client-id-1"})
        assert mine.headers["x-hotseat-request-id"] == "client-id-1"
    assert secure_router.echo.requests == []


WRONG_METHODS = [
    ("POST", "/healthz", "GET"),
    ("DELETE", "/readyz", "GET"),
    ("PUT", "/metrics", "GET"),
    ("POST", "/openapi.json", "GET"),
    ("TRACE", "/healthz", "GET"),
]


async def test_a_method_no_route_answers_gets_the_openai_405(
    secure_router: SecureRouter,
) -> None:
    """A known path with a method it does not answer (``TRACE`` included) is a 405
    ``method_not_allowed`` in the OpenAI shape with ``Allow``; under ``/v1`` it needs a
    key first (401), as every ``/v1`` request does."""
    async with httpx.AsyncClient(base_url=secure_router.url, timeout=10) as client:
        for method, path, allowed in WRONG_METHODS:
            response = await client.request(method, path)
            assert_openai_error(response, 405, "method_not_allowed")
            assert allowed in response.headers["allow"], (method, path)
        for method in ("TRACE", "PATCH"):
            for path, allowed in (("/v1/models", "GET"), ("/v1/chat/completions", "POST")):
                refused = await client.request(method, path)
                assert_openai_error(refused, 401, "invalid_api_key")
                response = await client.request(method, path, headers=AUTH)
                assert_openai_error(response, 405, "method_not_allowed")
                assert allowed in response.headers["allow"], (method, path)
            unknown = await client.request(method, "/v1/files", headers=AUTH)
            assert_openai_error(unknown, 404, "unknown_url")
        # What Allow names is answered.
        head = await client.head("/v1/models", headers=AUTH)
        assert head.status_code == 200, head.headers
    assert secure_router.echo.requests == []


UNPARSABLE = [
    b"GARBAGE\r\n\r\n",
    b"GET /v1/models HTTP/9.9\r\nhost: x\r\n\r\n",
    b"GET /v1/models HTTP/1.1\r\nhost: x\r\nno colon here\r\n\r\n",
    b"GET /v1/models HTTP/1.1\r\nhost: x\r\nbad header: \x01\x02\r\n\r\n",
    b"GET /v1/mo dels HTTP/1.1\r\nhost: x\r\n\r\n",
    b"POST /v1/embeddings HTTP/1.1\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: 5\r\ncontent-length: 7\r\n\r\n",
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    b"BREW /v1/models HTTP/1.1\r\nhost: x\r\n\r\n",
]


@pytest.mark.parametrize("raw", UNPARSABLE, ids=lambda r: r.split(b"\r\n")[0].decode("latin-1"))
async def test_a_request_the_parser_rejects_gets_the_openai_400(
    secure_router: SecureRouter, raw: bytes
) -> None:
    """A malformed request line, a bad header, an ambiguous body length, an HTTP/2
    preface or an unknown method: 400 ``invalid_request`` in the OpenAI shape with a
    request id, and the connection closed."""
    reader, writer = await connect(secure_router.url)
    writer.write(raw)
    await writer.drain()
    status, answer_head, body = await answer_of(reader)
    assert status == 400, answer_head
    assert header(answer_head, b"content-type") == b"application/json", answer_head
    assert header(answer_head, b"x-hotseat-request-id"), answer_head
    assert header(answer_head, b"connection") == b"close", answer_head
    error = body["error"]
    assert isinstance(error, dict), body
    assert set(error) == ERROR_KEYS, body
    assert error["code"] == "invalid_request", body
    assert await reader.read() == b"", "the connection stays open"
    writer.close()
    assert secure_router.echo.requests == []


SECRET = "db-password-in-an-exception-0f3e"


async def test_an_internal_failure_answers_500_without_its_text(
    upstream, start_router, client
) -> None:
    """An exception inside the router (here the activation client's) is a 500
    ``internal_error`` whose body says nothing of the exception but carries the request
    id; the exception and the request id go to the log."""
    a = await upstream("a")
    activation = FakeActivation(errors={"a": RuntimeError(SECRET)})
    config = {
        "backends": [{"name": "a", "address": a.url, "pool": {"name": "gpu0", "member": "a"}}],
        "pools": [{"name": "gpu0", "members": [{"name": "a"}, {"name": "b"}]}],
        "rules": [{"name": "m", "match": {"models": ["m"]}, "route": {"backends": ["a"]}}],
    }
    router = await start_router(config, activation_factory=activation.factory)
    with structlog.testing.capture_logs() as logs:
        response = await client.post(
            f"{router.url}/v1/chat/completions",
            content=orjson.dumps({"model": "m", "messages": []}),
            headers={"content-type": "application/json", "x-hotseat-request-id": "req-500"},
        )
    error = assert_openai_error(response, 500, "internal_error")
    assert response.headers["x-hotseat-request-id"] == "req-500"
    assert SECRET not in response.text
    assert "RuntimeError" not in response.text
    assert "req-500" in error["message"]
    failed = [e for e in logs if e.get("event") == "request_failed"]
    assert [e["request_id"] for e in failed] == ["req-500"], logs
    assert SECRET in repr(failed[0].get("exc_info")), failed
    assert a.requests == []


async def test_a_failing_framework_route_answers_500_without_its_text(
    upstream, start_router, client
) -> None:
    """An exception in a route the framework serves (one added here that raises) gets the
    same 500 as one in the proxy: no exception text, the request id in header and body,
    the exception in the log; never the framework's plain-text ``Internal Server Error``."""
    a = await upstream("a")
    router = await start_router({"backends": [{"name": "a", "address": a.url}]})

    async def broken() -> None:
        raise RuntimeError(SECRET)

    router.app.add_api_route("/broken", broken)
    with structlog.testing.capture_logs() as logs:
        response = await client.get(
            f"{router.url}/broken", headers={"x-hotseat-request-id": "req-broken"}
        )
    error = assert_openai_error(response, 500, "internal_error")
    assert response.headers["x-hotseat-request-id"] == "req-broken"
    assert SECRET not in response.text
    assert "req-broken" in error["message"]
    failed = [e for e in logs if e.get("event") == "request_failed"]
    assert [e["request_id"] for e in failed] == ["req-broken"], logs
    assert SECRET in repr(failed[0].get("exc_info")), failed


WEBSOCKET = (
    "upgrade: websocket\r\nconnection: upgrade\r\n"
    "sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n"
)


async def test_an_upgrade_request_is_answered_as_http(secure_router: SecureRouter) -> None:
    """The router upgrades to nothing: a WebSocket handshake is answered as the HTTP
    request it also is (401 without a key, the model list with one, 404 on an unknown
    path), each in the router's shape with a request id, never uvicorn's empty 403."""
    for path, credentials, status in (
        ("/v1/models", "", 401),
        ("/nope", "", 404),
        ("/v1/models", f"authorization: Bearer {CLIENT_KEY}\r\n", 200),
    ):
        reader, writer = await connect(secure_router.url)
        writer.write(f"GET {path} HTTP/1.1\r\nhost: x\r\n{credentials}{WEBSOCKET}\r\n".encode())
        await writer.drain()
        answered, answer_head, body = await answer_of(reader)
        writer.close()
        assert answered == status, answer_head
        assert header(answer_head, b"x-hotseat-request-id"), answer_head
        if status != 200:
            error = body["error"]
            assert isinstance(error, dict), body
            assert set(error) == ERROR_KEYS, body
        else:
            assert body["object"] == "list", body
