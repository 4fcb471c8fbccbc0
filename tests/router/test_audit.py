"""Audit: exactly one terminal request event per request, whatever the outcome, read back
from JetStream; requests are served while NATS is down and their events follow later."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

import httpx
import orjson

from hotseat.launcher import free_port, start_nats
from hotseat_common.connections import open_nats
from tests.support.waiting import eventually

CHAT = "/v1/chat/completions"
BODY = {"model": "m", "messages": []}


async def test_one_request_event_per_request(upstream, start_router, client, audit):
    """Served, fallback, 4xx, rejected, no-route, failed and disconnected requests each
    leave exactly one request event, with Nats-Msg-Id de-duplication keyed by event id."""
    a, b, bad = await upstream("a"), await upstream("b"), await upstream("bad")
    bad.mode = "status"
    router = await start_router(
        {
            "router": {"maxBodyBytes": 100, "apiKeys": {"env": "HOTSEAT_TEST_AUDIT_KEYS"}},
            "backends": [
                {"name": "a", "address": a.url},
                {"name": "b", "address": b.url},
                {"name": "bad", "address": bad.url},
            ],
            "rules": [
                {
                    "name": "fallback",
                    "match": {"models": ["f"]},
                    "route": {"backends": ["bad", "b"]},
                },
                {"name": "broken", "match": {"models": ["x"]}, "route": {"backends": ["bad"]}},
                {"name": "ok", "match": {"models": ["m"]}, "route": {"backends": ["a"]}},
            ],
        },
        api_keys="k",
    )
    url = router.url + CHAT
    auth = {"authorization": "Bearer k"}
    sent = {
        "r-served": ({"model": "m"}, auth),
        "r-fallback": ({"model": "f"}, auth),
        "r-broken": ({"model": "x"}, auth),
        "r-noroute": ({"model": "zzz"}, auth),
        "r-unauth": ({"model": "m"}, {}),
        "r-large": ({"model": "m", "pad": "x" * 200}, auth),
    }
    for rid, (body, headers) in sent.items():
        await client.post(url, json=body, headers={**headers, "x-hotseat-request-id": rid})
    a.mode = "stream_forever"
    async with client.stream(
        "POST",
        url,
        json={"model": "m", "stream": True},
        headers={**auth, "x-hotseat-request-id": "r-left"},
    ) as response:
        await anext(response.aiter_raw())
    await asyncio.wait_for(a.disconnected.wait(), 5)
    await router.stop()  # flushes every queued event

    events = await audit.all_events()
    requests = [e for e in events if e["kind"] == "request"]
    assert Counter(e["request_id"] for e in requests) == Counter([*sent, "r-left"]), requests
    outcomes = {e["request_id"]: e["outcome"] for e in requests}
    assert outcomes == {
        "r-served": "served",
        "r-fallback": "served",
        "r-broken": "all_backends_failed",
        "r-noroute": "no_route",
        "r-unauth": "rejected",
        "r-large": "rejected",
        "r-left": "client_disconnected",
    }
    by_id = {e["request_id"]: e for e in requests}
    assert by_id["r-fallback"]["backend"] == "b"
    assert by_id["r-fallback"]["rule"] == "fallback"
    assert by_id["r-unauth"]["status"] == 401
    assert by_id["r-large"]["status"] == 413
    assert all(e["duration_ms"] >= 0 and e["router"] for e in requests)
    assert len({e["id"] for e in events}) == len(events)


async def test_served_while_nats_is_down(upstream, start_router, tmp_path, prefix):
    """With NATS gone the router still serves; readiness drops; events arrive on return."""
    port = free_port()
    own_nats = start_nats(tmp_path / "nats", port=port)
    a = await upstream("a")
    router = None
    try:
        router = await start_router(
            {
                "backends": [{"name": "a", "address": a.url}],
                "defaultRoute": "a",
                "unknownModels": "DefaultRoute",
            },
            nats_url=own_nats.url,
        )
        async with httpx.AsyncClient(timeout=10) as http:
            assert (await http.get(router.url + "/readyz")).status_code == 200
            own_nats.kill()

            async def nats_down() -> bool:
                ready = await http.get(router.url + "/readyz")
                return ready.status_code == 503 and ready.json()["checks"]["nats"] is False

            # The router notices the lost connection a moment after the kill: wait for it,
            # so that the requests below are served while it knows NATS is gone.
            await eventually(nats_down, timeout=30)
            statuses = []
            for i in range(3):
                response = await http.post(
                    router.url + CHAT, json=BODY, headers={"x-hotseat-request-id": f"down-{i}"}
                )
                statuses.append(response.status_code)
            assert statuses == [200, 200, 200]
            assert await nats_down()
            own_nats = start_nats(tmp_path / "nats", port=port)
            nc = await open_nats(own_nats.url)
            try:
                sub = await nc.jetstream().pull_subscribe(">", stream=f"{prefix}_AUDIT")
                seen: set[str] = set()
                deadline = asyncio.get_running_loop().time() + 15
                while len(seen) < 3 and asyncio.get_running_loop().time() < deadline:
                    with contextlib.suppress(TimeoutError):  # not there yet: ask again
                        for msg in await sub.fetch(10, timeout=1):
                            seen.add(orjson.loads(msg.data)["request_id"])
                            await msg.ack()
                assert seen == {"down-0", "down-1", "down-2"}
            finally:
                await nc.drain()
    finally:
        # The router goes before its NATS server: a client left reconnecting to a server
        # that is gone would keep the session's event loop from closing.
        if router is not None:
            await router.stop()
        own_nats.stop()
