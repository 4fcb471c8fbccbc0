"""HTTP security of the router and the controller's admin API, against real processes:
API keys on every /v1 path, body limits enforced as bytes arrive, header hygiene toward
upstreams, admin actions behind their token."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import httpx
import orjson

from hotseat.launcher import Managed
from tests.security.conftest import (
    CLIENT_KEY,
    MAX_BODY,
    OTHER_KEY,
    UPSTREAM_KEY,
    SecureRouter,
)
from tests.security.rawhttp import ANSWER_WAIT_S, answer_of, connect, head, header, status_of
from tests.support.stack import Stack, pool_stack_config

V1_CALLS = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/embeddings"),
    ("GET", "/v1/models"),
    ("GET", "/v1/chat/completions"),
    ("POST", "/v1/models"),
    ("GET", "/v1/files"),
    ("POST", "/v1/responses"),
    ("DELETE", "/v1/models/m"),
]
BAD_CREDENTIALS = [
    None,
    "Bearer",
    "Bearer wrong-key",
    f"Bearer {CLIENT_KEY}x",
    f"Bearer {CLIENT_KEY[:-1]}",
    f"Basic {base64.b64encode(CLIENT_KEY.encode()).decode()}",
    CLIENT_KEY,
    f"Token {CLIENT_KEY}",
]


def assert_openai_401(response: httpx.Response) -> None:
    assert response.status_code == 401, (response.request.url, response.text)
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert error["code"] == "invalid_api_key"
    assert error["type"] == "invalid_request_error"
    assert error["message"]
    assert response.headers["x-hotseat-request-id"]


async def test_every_v1_path_needs_a_valid_key(secure_router: SecureRouter) -> None:
    """Every /v1 path and method, without a valid Bearer key (none, empty, wrong, a near
    miss, another scheme), gets an OpenAI-shaped 401 and reaches no upstream."""
    async with httpx.AsyncClient(base_url=secure_router.url, timeout=10) as client:
        for method, path in V1_CALLS:
            for credentials in BAD_CREDENTIALS:
                headers = {"authorization": credentials} if credentials is not None else {}
                body = {"model": "m", "messages": []} if method == "POST" else None
                response = await client.request(method, path, json=body, headers=headers)
                assert_openai_401(response)
    assert secure_router.echo.requests == []
    assert secure_router.cloud.requests == []


async def test_valid_keys_are_accepted(secure_router: SecureRouter) -> None:
    """Each configured key (and a lower-case scheme) is accepted."""
    async with httpx.AsyncClient(base_url=secure_router.url, timeout=10) as client:
        for credentials in (f"Bearer {CLIENT_KEY}", f"Bearer {OTHER_KEY}", f"bearer {CLIENT_KEY}"):
            headers = {"authorization": credentials}
            models = await client.get("/v1/models", headers=headers)
            assert models.status_code == 200, models.text
            chat = await client.post("/v1/chat/completions", json={"model": "m"}, headers=headers)
            assert chat.status_code == 200, chat.text
            unknown = await client.get("/v1/files", headers=headers)
            assert unknown.status_code == 404, unknown.text
            assert unknown.json()["error"]["code"] == "unknown_url"


async def test_oversized_content_length_is_refused_before_the_body(
    secure_router: SecureRouter,
) -> None:
    """A declared Content-Length over maxBodyBytes gets 413 while not one body byte has
    been sent: nothing is buffered, nothing reaches an upstream, and the connection is
    closed (the router would otherwise have to read the body it refused, to find the
    next request)."""
    reader, writer = await connect(secure_router.url)
    writer.write(
        head(
            [
                "POST /v1/chat/completions HTTP/1.1",
                "host: x",
                f"authorization: Bearer {CLIENT_KEY}",
                "content-type: application/json",
                "content-length: 100000000",
            ]
        )
    )
    await writer.drain()
    status, answer_head, _ = await answer_of(reader)
    assert header(answer_head, b"connection") == b"close"
    assert await asyncio.wait_for(reader.read(), ANSWER_WAIT_S) == b""  # closed by the router
    writer.close()
    assert status == 413
    assert secure_router.echo.requests == []


async def test_oversized_chunked_body_is_refused_as_it_arrives(
    secure_router: SecureRouter,
) -> None:
    """A chunked body is counted as it arrives: once it passes maxBodyBytes the client
    gets 413 while it is still sending (the terminating chunk never sent)."""
    reader, writer = await connect(secure_router.url)
    writer.write(
        head(
            [
                "POST /v1/chat/completions HTTP/1.1",
                "host: x",
                f"authorization: Bearer {CLIENT_KEY}",
                "content-type: application/json",
                "transfer-encoding: chunked",
            ]
        )
    )
    piece = b'{"model": "m", "pad": "' + b"x" * 1000
    sent = 0
    answer: asyncio.Task[tuple[int, bytes]] = asyncio.create_task(status_of(reader, timeout=30))
    while not answer.done() and sent <= 4 * MAX_BODY:
        writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        await writer.drain()
        sent += len(piece)
        await asyncio.wait({answer}, timeout=0.2)
    status, _ = await answer
    writer.close()
    assert status == 413
    assert MAX_BODY < sent <= MAX_BODY + 2 * len(piece), f"answered after {sent} bytes"
    assert secure_router.echo.requests == []


HOP_BY_HOP = [
    ("connection", "keep-alive, x-hop-secret"),
    ("x-hop-secret", "listed-in-connection"),
    ("keep-alive", "timeout=5"),
    ("te", "trailers"),
    ("trailer", "x-trailer"),
    ("upgrade", "h2c"),
    ("proxy-authorization", "Basic cHJveHk6c2VjcmV0"),
    ("proxy-connection", "keep-alive"),
]


async def _forwarded(url: str, model: str) -> dict[str, object]:
    """Send a request with every hop-by-hop header and a client key; the echo upstream's
    view of it."""
    body = orjson.dumps({"model": model, "messages": []})
    reader, writer = await connect(url)
    lines = [
        "POST /v1/chat/completions HTTP/1.1",
        "host: router.example",
        f"authorization: Bearer {CLIENT_KEY}",
        "content-type: application/json",
        "x-end-to-end: kept",
        f"content-length: {len(body)}",
        *(f"{name}: {value}" for name, value in HOP_BY_HOP),
    ]
    writer.write(head(lines) + body)
    await writer.drain()
    status, answer, received = await answer_of(reader)
    assert status == 200, answer
    writer.close()
    return received


async def test_no_hop_by_hop_header_or_client_key_reaches_an_upstream(
    secure_router: SecureRouter,
) -> None:
    """Hop-by-hop headers (RFC 9110 7.6.1, and those named by Connection) and the
    client's Authorization never reach an upstream; a cloud backend gets only its own
    key; end-to-end headers pass."""
    for model, upstream in (("m", secure_router.echo), ("c", secure_router.cloud)):
        echoed = await _forwarded(secure_router.url, model)
        headers = {str(k).lower(): str(v) for k, v in echoed["headers"]}  # type: ignore[attr-defined]
        for name, _ in HOP_BY_HOP:
            assert name not in headers, (upstream.name, name)
        assert headers.get("x-end-to-end") == "kept"
        assert CLIENT_KEY not in orjson.dumps(echoed).decode()
        if upstream is secure_router.cloud:
            assert headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
        else:
            assert "authorization" not in headers


async def test_admin_actions_refuse_without_the_admin_token(admin_stack: Stack) -> None:
    """Forcing a swap or an unload needs the admin token: none, a wrong one or another
    scheme get 401 and change nothing; reads need no token; the right token works."""
    url = admin_stack.controllers["c1"].url
    token = admin_stack.admin_token
    # Until the controller has derived the pool's state it refuses every admin action
    # with 409, the right token included: the checks below need the pool known.
    await admin_stack.wait_pool_known()
    actions = [("/v1/pools/gpu0/swap", {"member": "coder"}), ("/v1/pools/gpu0/unload", None)]
    bad = [None, "Bearer", "Bearer wrong", f"Bearer {token}x", f"Basic {token}", token]
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        for path, body in actions:
            for credentials in bad:
                headers = {"authorization": credentials} if credentials is not None else {}
                response = await client.post(path, json=body, headers=headers)
                assert response.status_code == 401, (path, credentials, response.text)
        pool = (await client.get("/v1/pools/gpu0")).json()
        assert (pool["resident"], pool["swapping"]) == (None, None)
        forced = await client.post(
            "/v1/pools/gpu0/swap",
            json={"member": "coder"},
            headers={"authorization": f"Bearer {token}"},
        )
        assert forced.status_code == 200, forced.text
        assert forced.json()["status"] == "started"


async def test_an_empty_admin_token_disables_admin_actions(
    tmp_path: Path, prefix: str, nats_server: Managed, redis_server: Managed
) -> None:
    """HOTSEAT_ADMIN_TOKEN set but empty does not make an empty Bearer an admin: admin
    actions stay refused."""
    config = pool_stack_config()
    config["pools"][0].pop("default")
    stack = Stack(tmp_path, prefix, nats_server.url, redis_server.url, config)
    stack.admin_token = ""
    stack.start_controller("c1")
    try:
        reader, writer = await connect(stack.controllers["c1"].url)
        body = b'{"member": "coder"}'
        writer.write(
            head(
                [
                    "POST /v1/pools/gpu0/swap HTTP/1.1",
                    "host: x",
                    "authorization: Bearer ",
                    "content-type: application/json",
                    f"content-length: {len(body)}",
                ]
            )
            + body
        )
        await writer.drain()
        status, _ = await status_of(reader)
        writer.close()
        assert status in {401, 403}
    finally:
        stack.stop()
