"""The fallback walk: 5xx, refused connections and timeouts move on; 4xx passes through;
quarantine and recovery; per-attempt and overall deadlines; fail-closed."""

from __future__ import annotations

import asyncio
import time

from hotseat.launcher import free_port

CHAT = "/v1/chat/completions"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def rule(*names: str, **extra: object) -> dict[str, object]:
    return {"name": "r", "route": {"backends": list(names)}, **extra}


async def test_fallback_on_5xx(upstream, start_router, client, audit):
    """A 5xx moves the request to the next backend; the header names the one that served."""
    a, b = await upstream("a"), await upstream("b")
    a.mode = "status"
    a.status = 503
    router = await start_router(
        {
            "backends": [{"name": "a", "address": a.url}, {"name": "b", "address": b.url}],
            "rules": [rule("a", "b")],
        }
    )
    response = await client.post(router.url + CHAT, json=BODY)
    assert response.status_code == 200
    assert response.headers["x-hotseat-backend"] == "b"
    assert len(a.requests) == 1
    event = await audit.request_event(response.headers["x-hotseat-request-id"])
    assert (event["outcome"], event["backend"], event["rule"]) == ("served", "b", "r")


async def test_fallback_on_connection_refused(upstream, start_router, client):
    """A backend that refuses connections is skipped for the next one."""
    b = await upstream("b")
    dead = f"http://127.0.0.1:{free_port()}"
    router = await start_router(
        {
            "backends": [{"name": "dead", "address": dead}, {"name": "b", "address": b.url}],
            "rules": [rule("dead", "b")],
        }
    )
    response = await client.post(router.url + CHAT, json=BODY)
    assert response.status_code == 200
    assert response.headers["x-hotseat-backend"] == "b"


async def test_upstream_4xx_passes_through(upstream, start_router, client, audit):
    """An upstream's own 4xx is the answer: no fallback, body and status kept."""
    a, b = await upstream("a"), await upstream("b")
    a.mode = "status"
    a.status = 422
    router = await start_router(
        {
            "backends": [{"name": "a", "address": a.url}, {"name": "b", "address": b.url}],
            "rules": [rule("a", "b")],
        }
    )
    response = await client.post(router.url + CHAT, json=BODY)
    assert response.status_code == 422
    assert response.json()["error"]["message"] == "a says 422"
    assert response.headers["x-hotseat-backend"] == "a"
    assert b.requests == []
    event = await audit.request_event(response.headers["x-hotseat-request-id"])
    assert (event["outcome"], event["status"]) == ("served", 422)


async def test_all_backends_failed_is_502(upstream, start_router, client, audit):
    """When every backend fails the client gets 502 all_backends_failed."""
    a = await upstream("a")
    a.mode = "status"
    router = await start_router(
        {
            "backends": [
                {"name": "a", "address": a.url},
                {"name": "dead", "address": f"http://127.0.0.1:{free_port()}"},
            ],
            "rules": [rule("a", "dead")],
        }
    )
    response = await client.post(router.url + CHAT, json=BODY)
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "all_backends_failed"
    assert response.json()["error"]["type"] == "server_error"
    event = await audit.request_event(response.headers["x-hotseat-request-id"])
    assert event["outcome"] == "all_backends_failed"


class ManualClock:
    """The router's quarantine clock, moved by the test: a quarantine lasts exactly as
    long as the test says, however slowly the machine runs the requests in it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def quarantine_config(a, b, quarantine: str) -> dict[str, object]:
    return {
        "router": {"quarantine": quarantine},
        "backends": [{"name": "a", "address": a.url}, {"name": "b", "address": b.url}],
        "rules": [rule("a", "b")],
    }


ONE_FAILURE = {"health_failures": 1, "health_clients": 1}
"""Passive health set to quarantine on a backend's first failure (these tests are about
the quarantine itself; tests/security/test_health.py about what starts one)."""


def healthy(metrics: str, backend: str) -> float:
    for line in metrics.splitlines():
        if line.startswith("hotseat_router_backend_healthy") and f'backend="{backend}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no health gauge for {backend}")


async def test_quarantine_then_one_trial_then_recovery(upstream, start_router, client):
    """A failed backend is skipped while quarantined, then gets one trial and recovers."""
    a, b = await upstream("a"), await upstream("b")
    a.mode = "status"
    clock = ManualClock()
    router = await start_router(quarantine_config(a, b, "10s"), health_clock=clock, **ONE_FAILURE)
    url = router.url + CHAT
    assert (await client.post(url, json=BODY)).headers["x-hotseat-backend"] == "b"
    clock.now += 9.9  # still inside the quarantine
    for _ in range(3):
        assert (await client.post(url, json=BODY)).headers["x-hotseat-backend"] == "b"
    assert len(a.requests) == 1
    assert healthy((await client.get(router.url + "/metrics")).text, "a") == 0.0
    clock.now += 0.2  # past it: one trial, which succeeds
    a.mode = "ok"
    assert (await client.post(url, json=BODY)).headers["x-hotseat-backend"] == "a"
    assert (await client.post(url, json=BODY)).headers["x-hotseat-backend"] == "a"
    assert len(a.requests) == 3
    assert healthy((await client.get(router.url + "/metrics")).text, "a") == 1.0


async def test_failed_trial_requarantines(upstream, start_router, client):
    """A trial that fails puts the backend back in quarantine at once."""
    a, b = await upstream("a"), await upstream("b")
    a.mode = "status"
    clock = ManualClock()
    router = await start_router(quarantine_config(a, b, "10s"), health_clock=clock, **ONE_FAILURE)
    url = router.url + CHAT
    await client.post(url, json=BODY)
    clock.now += 10.1
    assert (await client.post(url, json=BODY)).headers["x-hotseat-backend"] == "b"  # trial
    clock.now += 9.9  # inside the quarantine the failed trial started
    assert (await client.post(url, json=BODY)).headers["x-hotseat-backend"] == "b"
    assert len(a.requests) == 2


async def test_quarantine_runs_on_the_real_clock(upstream, start_router, client):
    """By default a quarantine is real time: once it has passed, the backend is tried."""
    a, b = await upstream("a"), await upstream("b")
    a.mode = "status"
    quarantine = 0.3
    router = await start_router(
        quarantine_config(a, b, f"{int(quarantine * 1000)}ms"), **ONE_FAILURE
    )
    url = router.url + CHAT
    assert (await client.post(url, json=BODY)).headers["x-hotseat-backend"] == "b"
    quarantined_by = time.monotonic()  # a's failure was recorded before this answer
    a.mode = "ok"
    # Letting the quarantine pass is the behaviour under test (a lower bound only: any
    # request after it gets the trial, however late it comes).
    await asyncio.sleep(max(0.0, quarantined_by + quarantine - time.monotonic()))  # the span
    assert (await client.post(url, json=BODY)).headers["x-hotseat-backend"] == "a"


async def test_per_attempt_timeout_rule_over_backend(upstream, start_router, client, audit):
    """A hanging backend is abandoned after the rule's timeout and the next one serves."""
    a, b = await upstream("a"), await upstream("b")
    a.mode = "hang"
    router = await start_router(
        {
            "router": {"timeout": "1h"},
            "backends": [
                {"name": "a", "address": a.url, "timeout": "1h"},
                {"name": "b", "address": b.url},
            ],
            # The rule's timeout applies to b's attempt too: long enough for any machine.
            "rules": [rule("a", "b", timeout="2s")],
        }
    )
    started = time.monotonic()
    response = await client.post(router.url + CHAT, json=BODY)
    elapsed = time.monotonic() - started
    # b served: a's attempt ended, and only the rule's timer could end it within the test
    # (a's own and the router's are an hour); never sooner than the rule's 2 s.
    assert response.headers["x-hotseat-backend"] == "b"
    assert elapsed >= 2, elapsed
    await asyncio.wait_for(a.disconnected.wait(), 5)


async def test_per_attempt_timeout_backend_over_router(upstream, start_router, client):
    """Without a rule timeout the backend's applies, before the router default."""
    a, b = await upstream("a"), await upstream("b")
    a.mode = "hang"
    router = await start_router(
        {
            "router": {"timeout": "1h"},
            "backends": [
                {"name": "a", "address": a.url, "timeout": "300ms"},
                {"name": "b", "address": b.url},
            ],
            "rules": [rule("a", "b")],
        }
    )
    started = time.monotonic()
    response = await client.post(router.url + CHAT, json=BODY)
    # b served: only the backend's 300 ms could end a's attempt within the test (the
    # router's is an hour); never sooner than those 300 ms.
    assert response.headers["x-hotseat-backend"] == "b"
    assert time.monotonic() - started >= 0.3


async def test_overall_deadline_spans_the_walk(upstream, start_router, client, audit):
    """requestTimeout bounds the whole walk: two slow backends cannot take two timeouts."""
    a, b, c = await upstream("a"), await upstream("b"), await upstream("c")
    a.mode = b.mode = "hang"
    router = await start_router(
        {
            "router": {"requestTimeout": "700ms", "timeout": "500ms"},
            "backends": [
                {"name": "a", "address": a.url},
                {"name": "b", "address": b.url},
                {"name": "c", "address": c.url},
            ],
            "rules": [rule("a", "b", "c")],
        }
    )
    started = time.monotonic()
    response = await client.post(router.url + CHAT, json=BODY)
    elapsed = time.monotonic() - started
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "request_timeout"
    assert elapsed >= 0.7
    # Two attempt timeouts (a, then b) would have left time to try c: the walk ended at
    # the request's deadline instead.
    assert c.requests == []
    event = await audit.request_event(response.headers["x-hotseat-request-id"])
    assert (event["outcome"], event["reason"]) == ("all_backends_failed", "request_timeout")
    # The deadline says nothing about b's health: it is tried again at once.
    b.mode = "ok"
    response = await client.post(router.url + CHAT, json=BODY)
    assert response.headers["x-hotseat-backend"] == "b"


async def test_sensitive_request_never_egresses(upstream, start_router, client, audit):
    """A sensitive classification may use only local backends; else 503 fail_closed."""
    local, cloud = await upstream("local"), await upstream("cloud")
    router = await start_router(
        {
            "backends": [
                {"name": "local", "address": local.url},
                {"name": "cloud", "address": cloud.url, "tier": "cloud"},
            ],
            "rules": [rule("local", "cloud")],
        }
    )
    url = router.url + CHAT
    sensitive = {"x-hotseat-classification": "phi"}
    assert (await client.post(url, json=BODY, headers=sensitive)).headers[
        "x-hotseat-backend"
    ] == "local"
    local.mode = "status"
    response = await client.post(url, json=BODY, headers=sensitive)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "fail_closed"
    assert int(response.headers["retry-after"]) >= 1
    assert cloud.requests == []
    event = await audit.request_event(response.headers["x-hotseat-request-id"])
    assert event["outcome"] == "fail_closed"
    # An ordinary request may still fall back to the cloud.
    ordinary = await client.post(url, json=BODY)
    assert ordinary.headers["x-hotseat-backend"] == "cloud"


async def test_cloud_backend_gets_its_own_bearer(upstream, start_router, client, monkeypatch):
    """A cloud backend receives Bearer from credentialsEnv, never the client's key."""
    cloud = await upstream("cloud")
    cloud.mode = "echo"
    monkeypatch.setenv("HOTSEAT_TEST_CLOUD_KEY", "sk-upstream")
    router = await start_router(
        {
            "backends": [
                {
                    "name": "cloud",
                    "address": cloud.url,
                    "tier": "cloud",
                    "credentialsEnv": "HOTSEAT_TEST_CLOUD_KEY",
                }
            ],
            "defaultRoute": "cloud",
            "unknownModels": "DefaultRoute",
        }
    )
    await client.post(
        router.url + CHAT, json=BODY, headers={"authorization": "Bearer client-secret"}
    )
    assert cloud.requests[-1].header("authorization") == "Bearer sk-upstream"
