"""Busy is re-learned, not assumed away, after the store lost its state (ADR 0005).

Against real redis-server processes: a state written on another server reads as unknown;
a rebuild stamps the state with this server; while the store relearns, a renewal of a
lease it forgot is written back for the resident (and only for it, and only then);
while the state is unknown a renewal is answered "cannot tell", never "gone"."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hotseat.launcher import Managed, start_redis
from hotseat_common.config.model import BusySignal
from hotseat_common.keys import Keys
from hotseat_common.settings import RedisSettings
from hotseat_pool_controller.decisions.admin import decide_admin_swap
from hotseat_pool_controller.decisions.recovery import decide_rebuild
from hotseat_pool_controller.decisions.swap import decide_begin_load, decide_commit
from hotseat_pool_controller.model import NOTHING, Phase, PoolPolicy
from hotseat_pool_controller.store.link import RedisLink
from hotseat_pool_controller.store.pool import PoolStore, Renewal
from tests.support.pool_state import store_id

POLICY = PoolPolicy(
    name="gpu0",
    members=("judge", "coder"),
    max_waiters=10,
    lease_ttl_ms=5_000,
    swap_timeout_ms=60_000,
    failure_backoff_ms=5_000,
    busy_signal=BusySignal.LEASES,
    default=None,
)


@pytest.fixture
async def other_server(tmp_path: Path) -> AsyncIterator[Managed]:
    """A second redis-server: the state it holds was written on another server."""
    proc = start_redis(tmp_path / "other")
    yield proc
    proc.stop()


async def rebuild(store: PoolStore, relearn_ms: int = 3_000) -> None:
    await store.decide(lambda s: decide_rebuild(s, ("judge",), relearn_ms=relearn_ms))


async def test_a_state_written_on_another_server_is_unknown_until_rebuilt(
    link: RedisLink, other_server: Managed, prefix: str
) -> None:
    """A state copied from another server (as a failover or a restore would leave it) is
    unknown here, keeps its epoch for the next one to exceed, and a rebuild makes it
    this server's."""
    keys = Keys(prefix)
    other = RedisLink(RedisSettings(redis_url=other_server.url))
    try:
        written_there = await store_id(other)
    finally:
        await other.aclose()
    assert written_there != await store_id(link)
    state = keys.pool_state("gpu0")
    await link.execute(
        "HSET", state, "phase", "idle", "resident", "coder", "epoch", "41", "store", written_there
    )
    store = PoolStore(link, keys, POLICY)
    snap = await store.snapshot()
    assert snap.phase is Phase.UNKNOWN
    assert snap.epoch == 41
    await rebuild(store)
    after = await store.snapshot()
    assert (after.phase, after.resident) == (Phase.IDLE, "judge")
    assert after.epoch > 41
    assert after.relearning
    assert await link.execute("HGET", state, "store") == await store_id(link)
    await store.reset()


async def test_renewals_of_forgotten_leases_are_adopted_only_while_relearning(
    link: RedisLink, prefix: str
) -> None:
    """Unknown state: "cannot tell". Rebuilt: the resident's forgotten lease (of an older
    epoch) is written back and counts; another member's, or one from a newer epoch, is
    refused; after the window the same renewal is refused."""
    store = PoolStore(link, Keys(prefix), POLICY)
    unknown = await store.renew("judge", "l-old", epoch=7, attempt="a1", router="r")
    assert unknown.outcome is Renewal.UNKNOWN
    await rebuild(store, relearn_ms=2_000)
    snap = await store.snapshot()
    adopted = await store.renew("judge", "l-old", epoch=7, attempt="a1", router="r")
    assert adopted.outcome is Renewal.RENEWED
    assert (await store.snapshot()).live_leases("judge") == 1
    refused_member = await store.renew("coder", "l-coder", epoch=7, attempt="a2", router="r")
    assert refused_member.outcome is Renewal.GONE
    newer = await store.renew("judge", "l-new", epoch=snap.epoch + 1, attempt="a3", router="r")
    assert newer.outcome is Renewal.GONE
    assert (await store.release("judge", "l-old")).removed
    await link.execute("HSET", Keys(prefix).pool_state("gpu0"), "relearn", "1")  # window over
    late = await store.renew("judge", "l-old", epoch=7, attempt="a1", router="r")
    assert late.outcome is Renewal.GONE
    await store.reset()


async def test_a_renewal_tells_the_router_to_stop_sharing_an_unhealthy_resident(
    link: RedisLink, prefix: str
) -> None:
    """A live lease on a resident marked unhealthy renews, but not as shareable."""
    keys = Keys(prefix)
    store = PoolStore(link, keys, POLICY)
    await rebuild(store, relearn_ms=0)
    granted = await store.grant_if_resident("judge", "l1", "a1", "r")
    assert granted is not None
    assert (await store.renew("judge", "l1")).shareable
    await link.execute("HSET", keys.pool_state("gpu0"), "unhealthy", "1")
    renewed = await store.renew("judge", "l1")
    assert renewed.outcome is Renewal.RENEWED
    assert not renewed.shareable
    assert await store.grant_if_resident("judge", "l2", "a2", "r") is None
    await store.reset()


async def test_a_renewal_the_store_never_knew_is_gone_after_a_swap_ended_relearning(
    link: RedisLink, prefix: str
) -> None:
    """A swap clears the relearn window (the field is written empty); a renewal of a lease
    the store does not hold, on the new resident, is then "gone", not a script error that
    the router would read as "controller unavailable"."""
    store = PoolStore(link, Keys(prefix), POLICY)
    await rebuild(store, relearn_ms=0)  # the window is over: an operator may swap
    await store.decide(lambda s: decide_admin_swap(s, "coder", "c1", POLICY))
    epoch = (await store.snapshot()).epoch
    for step in (decide_begin_load, decide_commit):
        await store.decide(lambda s, step=step: step(s, epoch, "c1") or NOTHING)
    snap = await store.snapshot()
    assert (snap.phase, snap.resident, snap.relearning) == (Phase.IDLE, "coder", False)
    assert await link.execute("HGET", Keys(prefix).pool_state("gpu0"), "relearn") == ""
    stray = await store.renew("coder", "l-never", epoch=epoch, attempt="a9", router="r")
    assert stray.outcome is Renewal.GONE
    await store.reset()
