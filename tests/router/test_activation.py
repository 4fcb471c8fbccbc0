"""The router's side of the activation contract, driven by a scripted activation client."""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from hotseat_common.errors import (
    ActivationTimeout,
    ControllerUnavailable,
    IncumbentBusy,
    QueueFull,
    SwapFailed,
)
from tests.router.fake_activation import FakeActivation
from tests.support.waiting import eventually

CHAT = "/v1/chat/completions"
BODY = {"model": "m", "messages": []}


@pytest.fixture
async def pooled(upstream, start_router):
    """Rule r: pooled a (gpu0/a), pooled b (gpu0/b), then plain c; IfIdle."""
    fakes = [await upstream(n) for n in ("a", "b", "c")]
    activation = FakeActivation()

    async def start(*, backends=("a", "b", "c"), router_policy=None, rule_timeout=None):
        config = {
            "router": router_policy or {},
            "backends": [
                {"name": "a", "address": fakes[0].url, "pool": {"name": "gpu0", "member": "a"}},
                {"name": "b", "address": fakes[1].url, "pool": {"name": "gpu0", "member": "b"}},
                {"name": "c", "address": fakes[2].url},
            ],
            "pools": [
                {"name": "gpu0", "swapBudget": "45s", "members": [{"name": "a"}, {"name": "b"}]}
            ],
            "rules": [
                {
                    "name": "r",
                    "route": {"backends": list(backends), "poolActivation": "IfIdle"},
                    **({"timeout": rule_timeout} if rule_timeout else {}),
                }
            ],
        }
        return await start_router(config, activation_factory=activation.factory)

    return start, activation, fakes


def busy_skips(metrics: str, member: str) -> float:
    pattern = rf'^hotseat_pool_busy_skips_total\{{[^}}]*member="{member}"[^}}]*\}} (\S+)$'
    found = re.search(pattern, metrics, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def test_granted_lease_released_after_body(pooled, client, audit):
    """A pooled backend is leased with the rule's mode and the pool's budget, then released."""
    start, activation, _ = pooled
    router = await start()
    started = time.monotonic()
    response = await client.post(router.url + CHAT, json=BODY)
    took = time.monotonic() - started
    assert response.headers["x-hotseat-backend"] == "a"
    (acquire,) = activation.acquires
    assert (acquire.pool, acquire.member, acquire.mode) == ("gpu0", "a", "IfIdle")
    # The pool's 45 s budget less what the request had spent before it asked: never more
    # than that budget, never less than it minus the whole request as the client saw it.
    assert 45 - took <= acquire.budget_s <= 45
    assert acquire.request_id == response.headers["x-hotseat-request-id"]
    assert activation.released == activation.granted
    event = await audit.request_event(acquire.request_id)
    assert (event["pool"], event["member"], event["backend"]) == ("gpu0", "a", "a")


async def test_busy_skip_moves_on_and_is_audited(pooled, client, audit, prefix):
    """Incumbent busy skips the backend: busy_skip event with the request id, counter, next."""
    start, activation, fakes = pooled
    activation.errors["a"] = IncumbentBusy("b is serving", retry_after=2)
    router = await start()
    response = await client.post(router.url + CHAT, json=BODY)
    rid = response.headers["x-hotseat-request-id"]
    assert response.status_code == 200
    assert response.headers["x-hotseat-backend"] == "b"
    assert fakes[0].requests == []
    await audit.wait_for(lambda e: e["kind"] == "pool")
    (skip,) = [e for e in await audit.settled() if e["kind"] == "pool"]
    assert (skip["outcome"], skip["request_id"], skip["pool"], skip["member"]) == (
        "busy_skip",
        rid,
        "gpu0",
        "a",
    )
    assert skip["router"] == f"router-{prefix}"
    metrics = (await client.get(router.url + "/metrics")).text
    assert busy_skips(metrics, "a") == 1.0
    assert f'hotseat_pool_busy_skips_total{{member="a",pool="gpu0",router="router-{prefix}"}}' in (
        metrics
    )


async def test_a_request_served_unpooled_after_a_busy_skip_names_no_pool(pooled, client, audit):
    """The pool asked and skipped is in the busy_skip event; the request event names the
    unpooled backend that served it, and no pool or member."""
    start, activation, _ = pooled
    activation.errors["a"] = IncumbentBusy("b is serving", retry_after=2)
    router = await start(backends=("a", "c"))
    response = await client.post(router.url + CHAT, json=BODY)
    assert response.headers["x-hotseat-backend"] == "c"
    event = await audit.request_event(response.headers["x-hotseat-request-id"])
    assert (event["backend"], event.get("pool"), event.get("member")) == ("c", None, None)


async def test_all_busy_is_503_with_retry_after(pooled, client, audit):
    """Every backend skipped as busy: 503 pool_incumbent_busy with whole-second Retry-After."""
    start, activation, _ = pooled
    activation.errors["a"] = IncumbentBusy("busy", retry_after=2.2)
    activation.errors["b"] = IncumbentBusy("busy", retry_after=4)
    router = await start(backends=("a", "b"))
    response = await client.post(router.url + CHAT, json=BODY)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "pool_incumbent_busy"
    assert response.headers["retry-after"] == "3"
    event = await audit.request_event(response.headers["x-hotseat-request-id"])
    assert event["outcome"] == "pool_incumbent_busy"
    assert (event["pool"], event["member"]) == ("gpu0", "b")  # the last one asked
    skips = [e for e in await audit.settled() if e["outcome"] == "busy_skip"]
    assert sorted(s["member"] for s in skips) == ["a", "b"]


def sample(metrics: str, name: str, **labels: str) -> float:
    """The value of ``name`` whose labels include ``labels`` (0 when there is none)."""
    for line in metrics.splitlines():
        series, _, value = line.rpartition(" ")
        if series.startswith(name + "{") and all(
            f'{key}="{want}"' in series for key, want in labels.items()
        ):
            return float(value)
    return 0.0


async def test_each_hold_is_observed_with_how_it_ended(pooled, client):
    """One request skips a (busy) and is served by b: the router's hold metrics count a
    hold ended ``busy`` on a and one ``granted`` on b, both by priority, and none held."""
    start, activation, _ = pooled
    activation.errors["a"] = IncumbentBusy("busy", retry_after=2)
    router = await start()
    response = await client.post(router.url + CHAT, json=BODY)
    assert response.headers["x-hotseat-backend"] == "b"
    metrics = (await client.get(router.url + "/metrics")).text
    hold = "hotseat_pool_hold_duration_seconds_count"
    assert sample(metrics, hold, pool="gpu0", member="a", result="busy") == 1
    assert sample(metrics, hold, pool="gpu0", member="b", result="granted") == 1
    assert sample(metrics, hold, result="granted", member="a") == 0
    assert sample(metrics, "hotseat_pool_hold_by_priority_seconds_count", pool="gpu0") == 2
    for member in ("a", "b"):
        assert sample(metrics, "hotseat_pool_held_requests", member=member) == 0
    assert 'hotseat_pool_held_requests{member="a",pool="gpu0"' in metrics


async def test_retry_after_is_at_least_one_second(pooled, client):
    """A sub-second or unknown retry hint still gives Retry-After: 1."""
    start, activation, _ = pooled
    activation.errors["a"] = IncumbentBusy("busy", retry_after=0.1)
    router = await start(backends=("a",))
    response = await client.post(router.url + CHAT, json=BODY)
    assert response.headers["retry-after"] == "1"


async def test_queue_full_skips_then_503(pooled, client, audit):
    """A full wait queue skips the backend; with nothing else, 503 pool_queue_full."""
    start, activation, _ = pooled
    activation.errors["a"] = QueueFull("full", retry_after=3)
    router = await start()
    response = await client.post(router.url + CHAT, json=BODY)
    assert response.headers["x-hotseat-backend"] == "b"
    activation.errors["b"] = QueueFull("full", retry_after=5)
    router2 = await start(backends=("a", "b"))
    response = await client.post(router2.url + CHAT, json=BODY)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "pool_queue_full"
    assert response.headers["retry-after"] == "3"
    event = await audit.request_event(response.headers["x-hotseat-request-id"])
    assert event["outcome"] == "pool_queue_full"


async def test_activation_timeout_answers_at_once(pooled, client, audit):
    """The swap budget elapsing answers 503 pool_activation_timeout without trying further."""
    start, activation, fakes = pooled
    activation.errors["a"] = ActivationTimeout("budget spent", retry_after=7)
    router = await start()
    response = await client.post(router.url + CHAT, json=BODY)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "pool_activation_timeout"
    assert response.headers["retry-after"] == "7"
    assert [a.member for a in activation.acquires] == ["a"]
    assert all(f.requests == [] for f in fakes)
    event = await audit.request_event(response.headers["x-hotseat-request-id"])
    assert event["outcome"] == "pool_activation_timeout"
    assert (event["pool"], event["member"]) == ("gpu0", "a")


async def test_swap_failed_moves_on(pooled, client):
    """A failed swap is a failed backend: the next one serves."""
    start, activation, _ = pooled
    activation.errors["a"] = SwapFailed("load failed")
    router = await start()
    response = await client.post(router.url + CHAT, json=BODY)
    assert response.headers["x-hotseat-backend"] == "b"


async def test_controller_unavailable_moves_on_then_fails_closed(pooled, client, audit):
    """No controller: pooled backends are skipped; with nothing served, 503 fail-closed."""
    start, activation, _ = pooled
    activation.errors["a"] = ControllerUnavailable("no responders")
    activation.errors["b"] = ControllerUnavailable("no responders", retry_after=2)
    router = await start()
    assert (await client.post(router.url + CHAT, json=BODY)).headers["x-hotseat-backend"] == "c"
    router2 = await start(backends=("a", "b"))
    response = await client.post(router2.url + CHAT, json=BODY)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "controller_unavailable"
    assert response.headers["retry-after"] == "2"
    event = await audit.request_event(response.headers["x-hotseat-request-id"])
    assert (event["outcome"], event["reason"]) == ("fail_closed", "controller_unavailable")


async def test_hold_does_not_eat_attempt_timeout(pooled, client):
    """Time held for a swap is not counted against the per-attempt timeout."""
    start, activation, fakes = pooled
    fakes[0].mode = "slow"
    fakes[0].delay_s = 0.3
    activation.hold["a"] = asyncio.Event()
    router = await start(rule_timeout="2s")
    request = asyncio.create_task(client.post(router.url + CHAT, json=BODY))
    await asyncio.wait_for(activation.asked.wait(), 5)
    # Held for most of the attempt timeout, on purpose: held time plus the upstream's
    # 0.3 s exceed the 2 s, so an attempt timer started at the hold would have fired.
    await asyncio.sleep(1.8)  # the hold's length is the behaviour under test
    activation.hold["a"].set()
    response = await request
    assert response.status_code == 200
    assert response.headers["x-hotseat-backend"] == "a"


async def test_lease_released_on_5xx_and_reported_on_refusal(pooled, client):
    """A failing member's lease is released; a connection failure is reported."""
    start, activation, fakes = pooled
    fakes[0].mode = "status"
    router = await start()
    response = await client.post(router.url + CHAT, json=BODY)
    assert response.headers["x-hotseat-backend"] == "b"
    assert [lease.member for lease in activation.released] == ["a", "b"]
    await fakes[1].stop()
    await client.post(router.url + CHAT, json=BODY)
    assert ("b", "connect") in activation.reported


async def test_lease_released_when_client_leaves_stream(pooled, client, audit):
    """The lease is released when the client disconnects mid-stream."""
    start, activation, fakes = pooled
    fakes[0].mode = "stream_forever"
    router = await start()
    async with client.stream("POST", router.url + CHAT, json={**BODY, "stream": True}) as r:
        await anext(r.aiter_raw())
        assert activation.released == []
    await asyncio.wait_for(activation.released_event.wait(), 3)
    assert activation.released == activation.granted


async def test_streams_that_ended_no_longer_watch_their_lease(pooled, client, audit):
    """Each stream watches its lease for a loss while it streams and stops when it ends,
    however it ends: a lease shared by many requests keeps no trace of those that left."""
    start, activation, fakes = pooled
    router = await start()
    for _ in range(3):
        response = await client.post(router.url + CHAT, json={**BODY, "stream": True})
        assert response.status_code == 200
    fakes[0].mode = "stream_forever"
    async with client.stream("POST", router.url + CHAT, json={**BODY, "stream": True}) as r:
        await anext(r.aiter_raw())
        assert activation.granted[-1].lost.watching == 1  # the stream in progress

    async def all_released() -> bool:
        return len(activation.released) == len(activation.granted) == 4

    await eventually(all_released)
    assert [lease.lost.watching for lease in activation.granted] == [0, 0, 0, 0]


async def test_lost_lease_ends_stream_with_error(pooled, client, audit):
    """A lease lost mid-stream ends the stream with an error event and closes the upstream."""
    start, activation, fakes = pooled
    fakes[0].mode = "stream_forever"
    router = await start()
    async with client.stream("POST", router.url + CHAT, json={**BODY, "stream": True}) as r:
        chunks = r.aiter_raw()
        await anext(chunks)
        activation.granted[0].lost.set()
        rest = b"".join([c async for c in chunks])
        rid = r.headers["x-hotseat-request-id"]
    assert b'"code":"lease_lost"' in rest
    await asyncio.wait_for(fakes[0].disconnected.wait(), 3)
    assert activation.released == activation.granted
    event = await audit.request_event(rid)
    assert (event["outcome"], event["reason"]) == ("served", "lease_lost")
