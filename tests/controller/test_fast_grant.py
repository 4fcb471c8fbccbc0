"""The one-round-trip grant agrees with the pure decision on every pool state."""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import replace

import pytest
import redis.asyncio as aioredis
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hotseat.launcher import Managed
from hotseat_common.config.model import BusySignal, PoolActivation
from hotseat_common.keys import Keys
from hotseat_common.messages import Granted
from hotseat_pool_controller.decisions.acquire import decide_acquire
from hotseat_pool_controller.model import AcquireAsk, Phase, PoolPolicy
from hotseat_pool_controller.store.link import RedisLink
from hotseat_pool_controller.store.pool import PoolStore
from tests.support.pool_state import store_id

POLICY = PoolPolicy(
    name="gpu",
    members=("a", "b"),
    max_waiters=10,
    lease_ttl_ms=60_000,
    swap_timeout_ms=60_000,
    failure_backoff_ms=60_000,
    busy_signal=BusySignal.LEASES,
    default=None,
)
CAPACITY = replace(POLICY, capacity_gib=8.0, memory_gib={"a": 4.0, "b": 4.0})
"""A capacity pool (docs/adr/0008): a member of the set is granted unless unwell or
closed by ``maxWait``."""
SUBSETS = st.sampled_from(["", "a", "b", "a,b"])

states = st.fixed_dictionaries(
    {
        "phase": st.sampled_from([*list(Phase), None]),
        "resident": st.sampled_from(["a", "b", ""]),
        "member": st.sampled_from(["a", "b"]),
        "failed": st.booleans(),
        "held": st.booleans(),
        "waiting": st.booleans(),
        "leases": st.integers(0, 2),
        "residents": SUBSETS,
        "unwell": SUBSETS,
        "closing": SUBSETS,
    }
)


def _granting(member: str, *, leases: int) -> dict[str, object]:
    """A state in which a fresh grant is due (random states rarely are: about 1 in 30)."""
    return {
        "phase": Phase.IDLE,
        "resident": member,
        "member": member,
        "failed": False,
        "held": False,
        "waiting": False,
        "leases": leases,
        "residents": member,
        "unwell": "",
        "closing": "",
    }


@pytest.mark.parametrize("policy", [POLICY, CAPACITY], ids=["one-resident", "capacity"])
async def test_fast_grant_matches_decide_acquire(
    redis_server: Managed, link: RedisLink, policy: PoolPolicy
) -> None:
    """For random states, the fast path grants exactly when decide_acquire grants afresh
    (a capacity pool's states add its residency set, unwell and closed members)."""
    client: aioredis.Redis = aioredis.from_url(redis_server.url, decode_responses=True)

    @settings(max_examples=150, deadline=None)
    @given(state=states)
    @example(state=_granting("a", leases=0))
    @example(state=_granting("b", leases=2))
    @example(state=_granting("a", leases=1))
    def run(state: dict[str, object]) -> None:
        drawn.append(state)

    drawn: list[dict[str, object]] = []
    run()
    verdicts: Counter[bool] = Counter()
    try:
        for state in drawn:
            store = PoolStore(link, Keys("f" + uuid.uuid4().hex[:8]), policy)
            member = str(state["member"])
            if state["phase"] is not None:
                await client.hset(
                    store.keys.pool_state("gpu"),
                    mapping={
                        "phase": str(state["phase"]),
                        "resident": str(state["resident"]),
                        "epoch": "5",
                        "store": await store_id(link),
                    },
                )
                if policy.has_capacity:
                    await client.hset(
                        store.keys.pool_state("gpu"),
                        # It never writes the one resident of a one-resident pool.
                        mapping={
                            "resident": "",
                            **{k: str(state[k]) for k in ("residents", "unwell", "closing")},
                        },
                    )
            for i in range(int(state["leases"])):  # type: ignore[call-overload]
                await client.zadd(
                    store.keys.pool_leases("gpu", str(state["resident"]) or "a"), {f"x{i}": 2**50}
                )
            if state["failed"]:
                await client.hset(store.keys.pool_state("gpu"), f"failed.{member}", 2**50)
            if state["held"]:
                granted_before = await store.grant_if_resident(member, "old", "req", "r")
                if granted_before is None:
                    await client.hset(store.keys.pool_attempt_leases("gpu"), "req", "old")
            if state["waiting"]:
                await client.zadd(store.keys.pool_waiters("gpu", member), {"req": 2**50})
            snap = await store.snapshot("req")
            deadline = snap.now_ms + 1000
            ask = AcquireAsk(member, PoolActivation.IF_IDLE, "req", "client", "r", deadline, "new")
            expected = decide_acquire(snap, ask, policy, "c")
            fresh_grant = isinstance(expected.reply, Granted) and expected.reply.lease_id == "new"
            fast = await store.grant_if_resident(member, "new", "req", "r", request_id="client")
            assert (fast is not None) == fresh_grant, (state, snap, expected.reply, fast)
            verdicts[fresh_grant] += 1
            if fast is not None:
                after = await store.snapshot("req")
                assert after.attempt_lease is not None
                assert after.attempt_lease.lease_id == "new"
                assert after.attempt_lease.epoch == 5
                assert not after.attempt_waiting
            await store.reset()
    finally:
        await client.aclose()
    # Both answers were compared many times: a fast path that always (or never) granted
    # could not pass by agreeing with a decision that happened to go one way only.
    assert verdicts[True] >= 3, verdicts
    assert verdicts[False] >= 50, verdicts
