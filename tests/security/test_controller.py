"""The controller's admin API against a hostile client, on a real controller: the token
is checked before the body is read, and the bodies are strict."""

from __future__ import annotations

from typing import Any

import httpx

from tests.security.conftest import ADMIN_TOKEN
from tests.support.stack import Stack
from tests.support.waiting import eventually

ACTIONS = ["/v1/pools/gpu0/swap", "/v1/pools/gpu0/unload"]
BAD_BODIES: list[bytes] = [
    b"{not json",
    b'{"member": 5, "force": "yes", "surprise": 1}',
    b"[]",
    b'"coder"',
]
"""Bodies each invalid in its own way: not JSON, wrong types and an unknown key, not an
object."""
SCHEMA_WORDS = ["member", "force", "surprise", "loc", "json_invalid", "input"]
"""What a validation error would tell about the body's schema."""
NOT_BOOLEANS: list[Any] = ["yes", "1", 1, "true", "on", 0, "false", None]


async def _pool(client: httpx.AsyncClient) -> tuple[object, object, object]:
    pool = (await client.get("/v1/pools/gpu0")).json()
    return pool["resident"], pool["swapping"], pool["phase"]


async def test_without_the_token_a_bad_body_gets_401_not_its_schema(admin_stack: Stack) -> None:
    """No token or a wrong one, with a body that is not valid (not JSON, wrong types, an
    unknown key): 401 with ``WWW-Authenticate``, never the 422 that would describe what
    the body should be."""
    url = admin_stack.controllers["c1"].url
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        for path in ACTIONS:
            for credentials in (None, "Bearer wrong", f"Bearer {ADMIN_TOKEN}x"):
                for body in BAD_BODIES:
                    headers = {"content-type": "application/json"}
                    if credentials is not None:
                        headers["authorization"] = credentials
                    response = await client.post(path, content=body, headers=headers)
                    assert response.status_code == 401, (path, credentials, body, response.text)
                    assert response.headers["www-authenticate"] == "Bearer"
                    for word in SCHEMA_WORDS:
                        assert word not in response.text, (path, body, response.text)
        # The same bad bodies with the token are what 422 is for.
        auth = {"authorization": f"Bearer {ADMIN_TOKEN}", "content-type": "application/json"}
        for path in ACTIONS:
            for body in BAD_BODIES:
                response = await client.post(path, content=body, headers=auth)
                assert response.status_code == 422, (path, body, response.text)


async def test_force_must_be_a_json_boolean(admin_stack: Stack) -> None:
    """``force`` given as ``"yes"``, ``"1"``, ``1``, ``"true"`` (or any other non-boolean)
    is 422 and nothing happens; ``true`` and ``false`` are accepted."""
    url = admin_stack.controllers["c1"].url
    auth = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    # Until the controller has derived the pool's state it refuses admin actions (409).
    await admin_stack.wait_pool_known()
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        for value in NOT_BOOLEANS:
            for path, body in (
                (ACTIONS[0], {"member": "coder", "force": value}),
                (ACTIONS[1], {"force": value}),
            ):
                response = await client.post(path, json=body, headers=auth)
                assert response.status_code == 422, (path, value, response.text)
                assert await _pool(client) == (None, None, "idle"), (path, value)
        unload = await client.post(ACTIONS[1], json={"force": False}, headers=auth)
        assert unload.status_code == 200, unload.text

        async def settled() -> bool:
            return await _pool(client) == (None, None, "idle")

        await eventually(settled, timeout=15)
        swap = await client.post(ACTIONS[0], json={"member": "coder", "force": True}, headers=auth)
        assert swap.status_code == 200, swap.text
        assert swap.json()["status"] == "started"
