"""The shared GPU ledger: admission against gpuMemoryGiB, oom, and the residency checks
other tests use to assert "never two residents"."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from hotseat.launcher import free_port, start_redis
from hotseat_common.keys import Keys
from hotseat_sim.timeline import (
    LedgerEntry,
    LedgerEvent,
    Overlap,
    cuts,
    lost_writes,
    over_capacity,
    overlaps,
    read_timeline,
    refused_requests,
    residencies,
    served_while_not_resident,
    unloaded_while_serving,
)
from tests.sim.conftest import StartSim
from tests.support.oracle import judge
from tests.support.sim import run_sim, sim_pool_config, wait_for_timeline
from tests.support.waiting import eventually


@pytest.fixture
def config():
    return sim_pool_config(
        {"small": {"memoryGiB": 6}, "big": {"memoryGiB": 20}},
        gpu_gib=24,
    )


async def test_load_beyond_gpu_memory_fails_with_oom(
    start_sim: StartSim, config, redis, keys: Keys
) -> None:
    """Loading big while small holds 6 of 24 GiB fails (state failed) and the ledger shows oom."""
    small = await start_sim(config, "small")
    big = await start_sim(config, "big")
    await small.load(epoch=1)
    await small.wait_for_state("ready")
    response = await big.load(epoch=1)
    assert response.json()["state"] == "failed"
    state = await big.state()
    assert state["state"] == "failed"
    assert "out of memory" in state["error"]
    assert (await big.http.get("/health")).status_code == 503
    assert await redis.hgetall(keys.sim_resident("gpu0")) == {"small": "6.0"}
    timeline = await read_timeline(redis, keys, "gpu0")
    oom = [e for e in timeline if e.event is LedgerEvent.OOM]
    assert len(oom) == 1
    assert oom[0].member == "big"
    assert (oom[0].fields["gib"], oom[0].fields["used"], oom[0].fields["capacity"]) == (
        "20.0",
        "6",
        "24.0",
    )
    assert overlaps(timeline) == []


async def test_members_loaded_in_sequence_never_overlap(
    start_sim: StartSim, config, redis, keys: Keys
) -> None:
    """small then big (unload before load) pass the overlap and served-while-resident checks."""
    small = await start_sim(config, "small")
    big = await start_sim(config, "big")
    for sim, epoch in ((small, 1), (big, 2)):
        await sim.load(epoch=epoch)
        await sim.wait_for_state("ready")
        async with sim.openai() as client:
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2
            )
        await sim.unload(epoch=epoch)
        await sim.wait_for_state("unloaded")
    timeline = await wait_for_timeline(
        redis, keys, "gpu0", lambda t: sum(e.event is LedgerEvent.SERVE_END for e in t) == 2
    )
    assert overlaps(timeline) == []
    assert served_while_not_resident(timeline) == []
    spans = residencies(timeline)
    assert [r.member for r in spans] == ["small", "big"]
    assert spans[0].end is not None
    assert spans[0].end.id < spans[1].start.id or spans[0].end.time <= spans[1].start.time
    assert all(e.fields.get("epoch") for e in timeline if e.event is LedgerEvent.LOAD_START)
    assert await redis.hgetall(keys.sim_resident("gpu0")) == {}


async def test_requests_to_an_unloaded_member_are_recorded_as_refused(
    start_sim: StartSim, config, redis, keys: Keys
) -> None:
    """A request that reaches a member that is not ready is refused and shows in the ledger."""
    small = await start_sim(config, "small")
    response = await small.http.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
        headers={"x-hotseat-request-id": "too-early"},
    )
    assert response.status_code == 503
    timeline = await wait_for_timeline(redis, keys, "gpu0", lambda t: bool(refused_requests(t)))
    [refused] = refused_requests(timeline)
    assert (refused.member, refused.fields["request_id"]) == ("small", "too-early")
    assert served_while_not_resident(timeline) == []


async def test_restart_forgets_stale_residency(
    start_sim: StartSim, config, redis, keys: Keys
) -> None:
    """A sim that starts while the ledger still lists its member (it died) frees that memory."""
    await redis.hset(keys.sim_resident("gpu0"), "big", "20.0")
    big = await start_sim(config, "big")
    assert (await big.state())["state"] == "unloaded"
    assert await redis.hgetall(keys.sim_resident("gpu0")) == {}
    timeline = await read_timeline(redis, keys, "gpu0")
    assert [(e.event, e.member, e.fields["reason"]) for e in timeline] == [
        (LedgerEvent.UNLOADED, "big", "restart")
    ]


async def test_shutdown_releases_memory(start_sim: StartSim, config, redis, keys: Keys) -> None:
    """A sim that stops while loaded releases its memory on the ledger."""
    small = await start_sim(config, "small", loaded=True)
    assert await redis.hgetall(keys.sim_resident("gpu0")) == {"small": "6.0"}
    await small.stop()
    assert await redis.hgetall(keys.sim_resident("gpu0")) == {}
    timeline = await read_timeline(redis, keys, "gpu0")
    assert timeline[-1].event is LedgerEvent.UNLOADED
    assert timeline[-1].fields["reason"] == "shutdown"


async def test_unpooled_backend_serves_without_a_ledger(start_sim: StartSim, redis, prefix) -> None:
    """An unpooled backend started loaded serves at once and writes no ledger."""
    config = sim_pool_config({"a": {}}, unpooled={"embedder": free_port()})
    sim = await start_sim(config, "embedder", loaded=True)
    state = await sim.state()
    assert (state["state"], state["pool"], state["member"]) == ("ready", None, "embedder")
    async with sim.openai() as client:
        result = await client.embeddings.create(model="embedder", input="x")
    assert len(result.data) == 1
    assert await redis.keys(f"{prefix}:*") == []


def entry(event: str, member: str, n: int, **fields: str) -> LedgerEntry:
    return LedgerEntry.of(event, member, f"{1000 + n}-0", **fields)


def test_overlap_check_finds_two_residents() -> None:
    """A constructed timeline where b loads before a unloads fails the overlap check."""
    timeline = [
        entry("load_start", "a", 1),
        entry("loaded", "a", 2),
        entry("unload_start", "a", 3),
        entry("load_start", "b", 4),
        entry("unloaded", "a", 5),
        entry("loaded", "b", 6),
    ]
    assert overlaps(timeline) == [Overlap("a", "b", timeline[3])]
    spans = residencies(timeline)
    assert [(r.member, r.end is None) for r in spans] == [("a", False), ("b", True)]


def test_overlap_check_passes_a_clean_swap() -> None:
    """Unloaded before the next load_start is no overlap, nor is reloading the same member."""
    timeline = [
        entry("load_start", "a", 1),
        entry("loaded", "a", 2),
        entry("unload_start", "a", 3),
        entry("unloaded", "a", 4),
        entry("oom", "b", 5),
        entry("load_start", "b", 6),
        entry("unloaded", "b", 7),
        entry("load_start", "a", 8),
    ]
    assert overlaps(timeline) == []


def test_capacity_verdict_allows_co_residents_and_counts_an_over_capacity_load() -> None:
    """In a capacity pool two members may hold the GPU together while their declared sizes
    fit; a load that takes the held memory (an unloading member's included) beyond the
    capacity is counted, and the one-resident verdict would have called both overlaps."""
    fits = [
        entry("load_start", "a", 1, gib="6"),
        entry("loaded", "a", 2),
        entry("load_start", "b", 3, gib="10"),
        entry("loaded", "b", 4),
        entry("unload_start", "a", 5),
        entry("unloaded", "a", 6),
        entry("load_start", "c", 7, gib="14"),
    ]
    assert over_capacity(fits, 24) == []
    assert judge(fits, capacity_gib=24).ok
    assert not judge(fits).ok  # one-resident: b loaded beside a
    over = [*fits[:5], entry("load_start", "c", 6, gib="14"), entry("unloaded", "a", 7)]
    assert over_capacity(over, 24) == [over[5]]
    verdict = judge(over, capacity_gib=24)
    assert verdict.summary()["over_capacity"] == 1
    assert verdict.summary()["overlaps"] == 0
    assert not verdict.ok


def test_served_while_not_resident_check() -> None:
    """serve_start before loaded or after unload_start is flagged; one while ready is not."""
    timeline = [
        entry("serve_start", "a", 1, request_id="before"),
        entry("load_start", "a", 2),
        entry("serve_start", "a", 3, request_id="loading"),
        entry("loaded", "a", 4),
        entry("serve_start", "a", 5, request_id="fine"),
        entry("unload_start", "a", 6),
        entry("serve_start", "a", 7, request_id="after"),
    ]
    flagged = [e.fields["request_id"] for e in served_while_not_resident(timeline)]
    assert flagged == ["before", "loading", "after"]


def test_cut_check_finds_a_request_in_flight_at_an_unload() -> None:
    """A request still in flight when its member starts unloading is cut; one that ended
    before is not; requests are told apart by ticket, not by a client id they share."""
    timeline = [
        entry("load_start", "a", 1),
        entry("loaded", "a", 2),
        entry("serve_start", "a", 3, request_id="same", ticket="1", boot="x"),
        entry("serve_start", "a", 4, request_id="same", ticket="2", boot="x"),
        entry("serve_end", "a", 5, request_id="same", ticket="1", boot="x", outcome="completed"),
        entry("unload_start", "a", 6),
        entry("serve_end", "a", 7, request_id="same", ticket="2", boot="x", outcome="aborted"),
        entry("unloaded", "a", 8, reason="unload"),
    ]
    found = cuts(timeline)
    assert [(c.request.fields["ticket"], c.cause) for c in found] == [("2", "unload")]
    assert unloaded_while_serving(timeline) == [timeline[5]]
    verdict = judge(timeline)
    assert not verdict.ok
    assert verdict.summary()["cut"] == 1
    assert verdict.summary()["unloaded_while_serving"] == 1


def test_cut_by_a_crash_counts_and_an_excused_cut_is_counted_apart() -> None:
    """A crash that frees memory under a request cuts it; naming the request (its router
    died past its lease) moves it to ``excused`` and the verdict passes."""
    timeline = [
        entry("load_start", "a", 1),
        entry("loaded", "a", 2),
        entry("serve_start", "a", 3, request_id="r1", ticket="1"),
        entry("unloaded", "a", 4, reason="crash"),
    ]
    assert [c.cause for c in cuts(timeline)] == ["crash"]
    assert not judge(timeline).ok
    pardoned = judge(timeline, excused={"r1"})
    assert pardoned.ok, pardoned
    assert (pardoned.summary()["cut"], pardoned.summary()["excused"]) == (0, 1)


def test_verdict_refuses_an_empty_ledger_and_counts_lost_writes() -> None:
    """An empty ledger is no evidence; a gap in a sim's sequence is a lost write."""
    assert not judge([]).ok
    assert judge([]).empty
    timeline = [
        entry("load_start", "a", 1, boot="b1", seq="1"),
        entry("loaded", "a", 2, boot="b1", seq="2"),
        entry("unload_start", "a", 3, boot="b1", seq="4"),
    ]
    assert lost_writes(timeline) == [("b1", 3)]
    assert judge(timeline).summary()["lost_writes"] == 1


async def test_sim_records_a_request_cut_by_an_unload(
    start_sim: StartSim, config, redis, keys: Keys
) -> None:
    """A real sim unloaded under a streaming request: the ledger shows the request in
    flight at the unload, numbered without gaps, and the verdict fails on it."""
    small = await start_sim(config, "small")
    await small.load(epoch=1)
    await small.wait_for_state("ready")
    client = small.openai()
    stream = await client.chat.completions.create(
        model="small",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=400,
        stream=True,
        extra_headers={"x-hotseat-request-id": "victim"},
    )
    async for _chunk in stream:
        break  # the request is being served
    await small.unload(epoch=2)
    timeline = await wait_for_timeline(
        redis,
        keys,
        "gpu0",
        lambda t: (
            any(e.event is LedgerEvent.UNLOADED for e in t)
            and any(e.event is LedgerEvent.SERVE_END for e in t)
        ),
    )
    await stream.close()
    found = cuts(timeline)
    assert [(c.request_id, c.cause) for c in found] == [("victim", "unload")]
    assert lost_writes(timeline) == []
    assert {e.fields["boot"] for e in timeline} == {e.fields["boot"] for e in timeline[:1]}
    verdict = judge(timeline)
    assert verdict.summary()["cut"] == 1
    assert verdict.summary()["unloaded_while_serving"] == 1


async def test_a_failed_ledger_write_is_counted_and_fails_the_verdict(
    config, prefix: str, tmp_path: Path
) -> None:
    """The ledger's Redis dies under a serving sim: the request is still answered, but the
    entries it should have written are lost; the sim counts each failed write (an error
    log too) and the verdict that includes those counts fails, where the ledger alone
    (its last entries simply missing, no gap after them) would have looked whole."""
    store = start_redis(tmp_path / "ledger-redis")
    try:
        async with run_sim(config, "small", redis_url=store.url, key_prefix=prefix) as small:
            await small.load(epoch=1)
            await small.wait_for_state("ready")
            client: aioredis.Redis = aioredis.from_url(store.url, decode_responses=True)
            try:
                timeline = await read_timeline(client, Keys(prefix), "gpu0")
            finally:
                await client.aclose()
            assert judge(timeline).ok, judge(timeline)
            store.kill()
            async with small.openai() as openai:
                await openai.chat.completions.create(
                    model="small", messages=[{"role": "user", "content": "x"}], max_tokens=2
                )

            async def failures() -> int:
                return int((await small.state())["ledger_write_failures"])

            counted = await eventually(failures)
            assert lost_writes(timeline) == []  # no gap: the lost entries were the last ones
            verdict = replace(judge(timeline), write_failures=counted)
            assert not verdict.ok
            assert verdict.summary()["write_failures"] == counted >= 1
    finally:
        store.stop()
