"""Admin API, ``hotseat status``, busySignal leasesAndSlots and lease renewal, end to end."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from hotseat.launcher import find_binary
from hotseat.status_cli import format_pools
from hotseat_common.messages import PoolView
from tests.controller.test_activation_e2e import chat, loads, started, streaming
from tests.support.stack import Stack, pool_stack_config
from tests.support.waiting import eventually

Make = Callable[[dict[str, Any]], Stack]


async def test_admin_reads_and_forced_swaps(make_stack: Make) -> None:
    """GET needs no token; POST swap/unload refuse without the admin token and act with it."""
    stack = started(make_stack(pool_stack_config()))
    await stack.wait_resident("judge")
    base = f"{stack.controller_url}/v1/pools"
    auth = {"authorization": f"Bearer {stack.admin_token}"}
    async with httpx.AsyncClient(timeout=10) as client:
        listing = (await client.get(base)).json()
        assert [p["name"] for p in listing["pools"]] == ["gpu0"]
        pool = listing["pools"][0]
        assert {k: pool[k] for k in ("resident", "swapping", "leases", "waiters")} == {
            "resident": "judge",
            "swapping": None,
            "leases": {"judge": 0, "coder": 0},
            "waiters": {"judge": 0, "coder": 0},
        }
        assert (await client.get(f"{base}/nope")).status_code == 404
        denied = await client.post(f"{base}/gpu0/swap", json={"member": "coder"})
        assert denied.status_code == 401
        wrong = await client.post(
            f"{base}/gpu0/swap", json={"member": "coder"}, headers={"authorization": "Bearer x"}
        )
        assert wrong.status_code == 401
        swap = await client.post(f"{base}/gpu0/swap", json={"member": "coder"}, headers=auth)
        assert swap.status_code == 200, swap.text
        assert swap.json()["status"] == "started"
        await stack.wait_resident("coder")
        unload = await client.post(f"{base}/gpu0/unload", headers=auth)
        assert unload.status_code == 200, unload.text
        await stack.wait_resident(None)
    timeline = await stack.judged_ledger()
    assert timeline[-1].event == "unloaded"


async def test_the_pool_view_during_a_swap_says_what_is_true(make_stack: Make) -> None:
    """While a forced swap unloads judge and then loads coder, nothing is resident: the view
    names the member being unloaded, then the one loading, with the time the swap has run
    and (once a swap was measured) the time it is expected to take; ``hotseat status``
    prints that view with nothing resident."""
    config = pool_stack_config(judge={"unloadSeconds": 2}, coder={"loadSeconds": 3})
    stack = started(make_stack(config))
    await stack.wait_resident("judge")
    warm = await stack.pool()
    assert (warm["resident"], warm["unloading"], warm["loading"]) == ("judge", None, None)
    assert warm["swap_elapsed_s"] is None
    assert warm["swap_remaining_s"] is None
    async with httpx.AsyncClient(timeout=10) as client:
        swap = await client.post(
            f"{stack.controller_url}/v1/pools/gpu0/swap",
            json={"member": "coder"},
            headers={"authorization": f"Bearer {stack.admin_token}"},
        )
        assert swap.status_code == 200, swap.text

    unloading = await eventually(lambda: _in_phase(stack, "unloading"), interval=0.02)
    assert (unloading["resident"], unloading["unloading"], unloading["loading"]) == (
        None,
        "judge",
        None,
    )
    assert unloading["swapping"] == "coder"
    assert unloading["swap_elapsed_s"] >= 0
    assert unloading["swap_id"] is not None
    loading = await eventually(lambda: _in_phase(stack, "loading"), interval=0.02)
    assert (loading["resident"], loading["unloading"], loading["loading"]) == (None, None, "coder")
    assert loading["swap_id"] == unloading["swap_id"]  # one swap, one id, through its phases
    assert loading["swap_elapsed_s"] >= unloading["swap_elapsed_s"]
    if loading["swap_expected_s"] is not None:  # the warm-up of judge was measured
        expected_left = loading["swap_expected_s"] - loading["swap_elapsed_s"]
        assert loading["swap_remaining_s"] == pytest.approx(max(0.0, expected_left), abs=0.01)
    table = format_pools([PoolView.model_validate(loading)])  # as `hotseat status` prints it
    await stack.wait_resident("coder")
    done = await stack.pool()
    assert (done["resident"], done["unloading"], done["loading"]) == ("coder", None, None)
    assert done["swap_elapsed_s"] is None
    assert done["swap_id"] is None  # no swap in flight
    assert done["swap_expected_s"] is not None, "the swap just run was not measured"
    row = table.splitlines()[1]
    assert row.split()[:3] == ["gpu0", "-", "loading"], table  # nothing resident mid-swap
    assert "coder (loading " in row, table
    assert f", swap {loading['swap_id']})" in row, table  # for `hotseat audit swap ID`
    await stack.assert_invariants()


async def _hotseat_status(url: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [find_binary("hotseat"), "status", "--url", url],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


async def _in_phase(stack: Stack, phase: str) -> dict[str, Any] | None:
    pool = await stack.pool()
    return pool if pool["phase"] == phase else None


async def test_status_cli_prints_the_pools(make_stack: Make) -> None:
    """``hotseat status`` prints each pool's resident, phase and counts as a table."""
    stack = started(make_stack(pool_stack_config()))
    await stack.wait_resident("judge")
    result = await _hotseat_status(stack.controller_url)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "POOL",
        "RESIDENT",
        "PHASE",
        "SWAPPING",
        "EPOCH",
        "LEASES",
        "WAITERS",
    ]
    assert lines[1].split()[:4] == ["gpu0", "judge", "idle", "-"]
    failed = subprocess.run(
        [find_binary("hotseat"), "status", "--url", "http://127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert failed.returncode == 1
    assert "cannot read pools" in failed.stderr
    await stack.assert_invariants()


async def test_slots_count_traffic_that_bypassed_the_router(make_stack: Make) -> None:
    """busySignal leasesAndSlots: a request sent straight to judge (no lease) makes the
    IfIdle rule skip it as busy; with idle slots the swap happens."""
    stack = started(make_stack(pool_stack_config(pool={"busySignal": "leasesAndSlots"})))
    url = stack.routers[0].url
    await stack.wait_resident("judge")
    judge_url = stack.sims["judge"].url
    async with streaming(judge_url, "judge", max_tokens=200) as stream:  # 10 s
        response = await chat(url, "either")
        assert response.headers["x-hotseat-backend"] == "judge"
        assert not stream.done()
    assert loads(await stack.ledger(), "coder") == []
    # The stream's end reaches the client a moment before the sim frees its slot.
    await stack.wait_slots_idle("judge")
    swapped = await chat(url, "either")
    assert swapped.headers["x-hotseat-backend"] == "coder"
    await stack.assert_invariants()


async def test_admin_swap_respects_slots_busy_with_bypassing_traffic(make_stack: Make) -> None:
    """busySignal leasesAndSlots: while a request sent straight to judge runs (no lease),
    an admin swap is refused with 409 and judge is not unloaded; once it ends, the swap
    goes ahead."""
    stack = started(make_stack(pool_stack_config(pool={"busySignal": "leasesAndSlots"})))
    await stack.wait_resident("judge")
    swap = f"{stack.controller_url}/v1/pools/gpu0/swap"
    auth = {"authorization": f"Bearer {stack.admin_token}"}
    async with httpx.AsyncClient(timeout=10) as client:
        async with streaming(stack.sims["judge"].url, "judge", max_tokens=100) as stream:  # 5 s
            refused = await client.post(swap, json={"member": "coder"}, headers=auth)
            assert not stream.done()
            assert refused.status_code == 409, refused.text
            assert "slots" in refused.text
            assert await stream == "direct"  # ran to its end on judge, not cut
        await stack.wait_slots_idle("judge")
        accepted = await client.post(swap, json={"member": "coder"}, headers=auth)
        assert accepted.status_code == 200, accepted.text
        await stack.wait_resident("coder")
        # force: the operator's way past a member whose /slots stays busy.
        async with streaming(
            stack.sims["coder"].url, "coder", max_tokens=2000, request_id="bypass"
        ):  # 10 s: the forced unload cuts it
            unload = f"{stack.controller_url}/v1/pools/gpu0/unload"
            assert (await client.post(unload, headers=auth)).status_code == 409
            forced = await client.post(unload, json={"force": True}, headers=auth)
            assert forced.status_code == 200, forced.text
    await stack.wait_resident(None)
    # The forced unload cut the request that bypassed the router (it held no lease): the
    # operator's explicit choice, counted apart; nothing else was cut.
    verdict = await stack.assert_invariants(excused={"bypass"})
    assert verdict.summary()["excused"] == 1, verdict.summary()


async def test_long_stream_keeps_its_lease_by_renewal(make_stack: Make) -> None:
    """A stream much longer than the lease TTL stays leased (renewed), so IfIdle keeps
    skipping and no lease expires."""
    stack = started(make_stack(pool_stack_config()))
    url = stack.routers[0].url
    await stack.wait_resident("judge")
    ttl_ms = 2000
    async with streaming(url, "judge", max_tokens=200) as stream:  # 10 s, TTL 2 s
        [(lease, granted_expiry)] = (await stack.lease_expiries("judge")).items()

        async def renewed_twice_over() -> bool:
            # Each renewal sets the expiry to the store's now + TTL: an expiry two TTLs
            # past the granted one means the lease outlived that expiry by a whole TTL.
            expiry = (await stack.lease_expiries("judge")).get(lease)
            return expiry is not None and expiry >= granted_expiry + 2 * ttl_ms

        await eventually(renewed_twice_over, timeout=30, interval=0.1)
        assert list(await stack.lease_expiries("judge")) == [lease]
        response = await chat(url, "either")
        assert response.headers["x-hotseat-backend"] == "judge"
        assert await stream == "judge"
    assert [e for e in await stack.settled_audit() if e["outcome"] == "lease_expired"] == []
    await stack.assert_invariants()
