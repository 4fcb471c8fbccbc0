"""Passive health that one client cannot trip alone: a backend answering one client's
requests with 5xx, or timing out on them, stays in rotation for every client; failures
from several clients quarantine it; a 4xx passed through never counts; a backend that
cannot be connected to at all is quarantined after a few requests of any one client; a
client is not many because it says so in X-Forwarded-For."""

from __future__ import annotations

import re
import socket

import pytest

CHAT = "/v1/chat/completions"
BODY = {"model": "m", "messages": []}
KEYS = {
    "k1": {"authorization": "Bearer key-one-5f1c"},
    "k2": {"authorization": "Bearer key-two-93ab"},
}
THRESHOLDS = {"health_failures": 3, "health_clients": 2}
"""The defaults, spelled out: the test counts requests against them."""


def config(a_url: str, b_url: str) -> dict[str, object]:
    return {
        "backends": [{"name": "a", "address": a_url}, {"name": "b", "address": b_url}],
        "rules": [{"name": "r", "timeout": "300ms", "route": {"backends": ["a", "b"]}}],
    }


def attempts(metrics: str, backend: str, result: str) -> float:
    pattern = (
        rf'^hotseat_router_upstream_attempts_total\{{[^}}]*backend="{backend}"'
        rf'[^}}]*result="{result}"[^}}]*\}} (\S+)$'
    )
    found = re.search(pattern, metrics, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


@pytest.mark.parametrize("failure", ["status", "hang"])
async def test_one_client_cannot_quarantine_a_backend_for_all(
    upstream, start_router, client, failure: str
) -> None:
    """Backend a answers 4xx (passed through), then 5xx or times out the attempt, on
    every request: one client's requests keep reaching it (falling back to b each time),
    however many; once a second client's request fails on it too, it is quarantined and
    the next request goes straight to b."""
    a, b = await upstream("a"), await upstream("b")
    router = await start_router(
        config(a.url, b.url), api_keys="key-one-5f1c,key-two-93ab", **THRESHOLDS
    )
    url = router.url + CHAT
    a.mode, a.status = "status", 400
    for headers in (*[KEYS["k1"]] * 3, *[KEYS["k2"]] * 3):
        response = await client.post(url, json=BODY, headers=headers)
        assert (response.status_code, response.headers["x-hotseat-backend"]) == (400, "a")
    a.mode, a.status = failure, 500
    for n in range(1, 6):
        response = await client.post(url, json=BODY, headers=KEYS["k1"])
        assert response.headers["x-hotseat-backend"] == "b", response.text
        assert len(a.requests) == 6 + n, "one client's failures quarantined a"
    response = await client.post(url, json=BODY, headers=KEYS["k2"])
    assert response.headers["x-hotseat-backend"] == "b"
    assert len(a.requests) == 12
    response = await client.post(url, json=BODY, headers=KEYS["k1"])
    assert response.headers["x-hotseat-backend"] == "b"
    assert len(a.requests) == 12, "failures from two clients did not quarantine a"


async def test_an_unreachable_backend_is_quarantined_after_a_few_requests(
    upstream, start_router, client
) -> None:
    """Failing to connect is nobody's request's doing: a few requests of one client are
    enough to quarantine the backend (not the first), and then it is not tried."""
    b = await upstream("b")
    # Bound and never listening: refused for as long as the test holds it (a port merely
    # free when chosen could be taken by another process meanwhile).
    with socket.socket() as unreachable:
        unreachable.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{unreachable.getsockname()[1]}"
        router = await start_router(config(dead, b.url), **THRESHOLDS)
        url = router.url + CHAT
        for _ in range(5):
            response = await client.post(url, json=BODY)
            assert response.headers["x-hotseat-backend"] == "b"
        metrics = (await client.get(router.url + "/metrics")).text
    assert attempts(metrics, "a", "connect") == THRESHOLDS["health_failures"]


async def test_a_forwarded_for_header_does_not_make_one_client_many(
    upstream, start_router, client
) -> None:
    """With no API keys a client is told apart by its address. X-Forwarded-For is a
    header any client can write: unless a proxy the operator trusts sent it
    (``--forwarded-allow-ips``), one client naming itself differently on every request is
    still one client, and its failures never take backend a away from the others."""
    a, b = await upstream("a"), await upstream("b")
    router = await start_router(config(a.url, b.url), **THRESHOLDS)
    url = router.url + CHAT
    a.mode, a.status = "status", 500
    for n in range(1, 7):
        forwarded = {"x-forwarded-for": f"203.0.113.{n}"}
        response = await client.post(url, json=BODY, headers=forwarded)
        assert response.headers["x-hotseat-backend"] == "b", response.text
        assert len(a.requests) == n, "one client passed for several and quarantined a"


async def test_a_trusted_proxy_names_the_client(upstream, start_router, client) -> None:
    """Behind a proxy the operator trusts (here this host, ``--forwarded-allow-ips``),
    X-Forwarded-For names the client: the failures of two clients it names quarantine
    backend a, and the next request goes straight to b."""
    a, b = await upstream("a"), await upstream("b")
    router = await start_router(config(a.url, b.url), forwarded_allow_ips="127.0.0.1", **THRESHOLDS)
    url = router.url + CHAT
    a.mode, a.status = "status", 500
    for n, named in enumerate(["203.0.113.1"] * 3 + ["203.0.113.2"], start=1):
        response = await client.post(url, json=BODY, headers={"x-forwarded-for": named})
        assert response.headers["x-hotseat-backend"] == "b", response.text
        assert len(a.requests) == n
    response = await client.post(url, json=BODY, headers={"x-forwarded-for": "203.0.113.1"})
    assert response.headers["x-hotseat-backend"] == "b"
    assert len(a.requests) == 4, "the failures of two clients the proxy named did not count"
