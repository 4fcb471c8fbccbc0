"""The web console at ``/ui`` in headless Chromium against a live stack: the resident,
then a swap in progress with its waiters, then the timeline bar of that swap with its
cause and waiters (a screenshot of each state under the test's temp dir); admin actions
ask for the token and a wrong one gets the admin API's 401. Every request the page makes
outside the stack is refused and must not happen."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
from playwright.async_api import Browser

from tests.console.conftest import StartStack, open_console
from tests.controller.test_capacity_e2e import capacity_config
from tests.controller.test_fleet_e2e import fleet_config
from tests.support.clients import live_stream
from tests.support.stack import Stack

POOL = '[data-pool="gpu0"]'
SWAP_RUNNING_WITH_WAITERS = """() => {
    const pool = document.querySelector('[data-pool="gpu0"]');
    const coder = pool && pool.querySelector('tr[data-member="coder"]');
    const running = pool && ["unloading", "loading"].includes(pool.dataset.phase)
        && coder && Number(coder.dataset.waiters) > 0;
    return running ? {
        resident: pool.dataset.resident,
        waiters: Number(coder.dataset.waiters),
        queue: coder.dataset.queue,
        swap: pool.querySelector(".swap").textContent,
    } : null;
}"""
"""The pool card as one consistent read, once it shows a swap with waiters for coder."""
HORIZONTAL_OVERFLOW = "document.documentElement.scrollWidth - document.documentElement.clientWidth"


async def test_the_console_shows_the_resident_then_a_swap_with_its_waiters_then_its_bar(
    console_stack: Stack, browser: Browser, tmp_path: Path
) -> None:
    stack = console_stack
    await stack.wait_resident("judge")
    console = await open_console(browser, stack.controller_url, tmp_path / "screenshots")
    page = console.page

    await page.wait_for_selector(f'{POOL}[data-resident="judge"][data-phase="idle"]')
    assert await page.text_content(f"{POOL} .resident-name") == "judge"
    await console.shot("1-resident")

    ids = [f"console-waiter-{i}" for i in range(3)]
    body = {"model": "coder", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    async with httpx.AsyncClient(base_url=stack.routers[0].url, timeout=60) as client:
        sends = [
            asyncio.create_task(
                client.post("/v1/chat/completions", json=body, headers={"x-hotseat-request-id": i})
            )
            for i in ids
        ]
        running = await page.wait_for_function(SWAP_RUNNING_WITH_WAITERS, timeout=20_000)
        card = await running.json_value()
        assert card["resident"] == "", "nothing serves while the swap runs"
        assert "coder" in card["swap"]
        assert 1 <= card["waiters"] <= len(ids)
        assert card["queue"] == "1", "coder is next in line"
        await console.shot("2-swap-in-progress")
        responses = await asyncio.gather(*sends)
    assert [r.status_code for r in responses] == [200] * len(ids)

    bar = f'{POOL} .swap-bar[data-to="coder"][data-outcome="swap_completed"]'
    await page.wait_for_selector(f'{bar}[data-waiters="{len(ids)}"]', timeout=45_000)
    await page.click(bar)
    selected = await page.text_content(f"{POOL} .swap-list li.selected") or ""
    assert "judge \u2192 coder" in selected
    assert "demand" in selected
    assert "caused by request console-waiter-" in selected, selected
    for request_id in ids:
        assert request_id in selected, selected
    await page.wait_for_selector(f'{POOL} [data-track="judge"] .span')
    await page.wait_for_selector(f'{POOL} [data-track="coder"] .span')
    await page.wait_for_selector('#outcomes-body tr[data-rule="coder"]')
    await console.shot("3-timeline-bar")
    await page.click(f'{POOL} .zoom button:text-is("10 min")')
    await page.wait_for_selector(f'{POOL} .timeline h3:has-text("Last 10 minutes")')
    await page.wait_for_selector(f'{bar}[data-waiters="{len(ids)}"]')
    await console.shot("4-timeline-10-minutes")
    assert console.offline.refused == [], "the page reached outside the stack"
    assert console.errors == []


async def test_admin_actions_ask_for_the_token_and_a_wrong_one_gets_401(
    console_stack: Stack, browser: Browser, tmp_path: Path
) -> None:
    """On a phone-sized screen: nothing overflows sideways; "Swap in" asks for the token,
    a wrong one is refused by the admin API (401) and nothing moves; the right one starts
    the swap through the same API."""
    stack = console_stack
    await stack.wait_resident("judge")
    console = await open_console(
        browser, stack.controller_url, tmp_path / "screenshots", width=390, height=844
    )
    page = console.page
    await page.wait_for_selector(f'{POOL}[data-resident="judge"][data-phase="idle"]')
    assert await page.evaluate(HORIZONTAL_OVERFLOW) <= 0
    await console.shot("phone")

    await page.click(f'{POOL} tr[data-member="coder"] button')
    await page.wait_for_selector("#token-dialog[open]")
    await page.fill("#token-input", "not-the-token")
    await page.click("#token-submit")
    await page.wait_for_selector('#token-error[data-status="401"]')
    await console.shot("admin-401")
    state = await stack.pool()
    assert (state["resident"], state["swapping"]) == ("judge", None)

    await page.fill("#token-input", stack.admin_token)
    await page.click("#token-submit")
    await page.wait_for_selector("#token-dialog[open]", state="detached")
    await page.wait_for_selector(
        f'{POOL}[data-resident="coder"][data-phase="idle"]', timeout=20_000
    )
    await stack.wait_resident("coder")
    assert console.offline.refused == []
    assert console.errors == []


async def test_a_capacity_pool_shows_its_residents_side_by_side(
    start_console_stack: StartStack, browser: Browser, tmp_path: Path
) -> None:
    """a and b (6 GiB each) in a 24 GiB pool: once both served, the card names both
    residents and the free memory, and the timeline has a span on each member's track at
    once (a loaded beside b, nobody unloaded)."""
    stack = start_console_stack(capacity_config({"a": {"memoryGiB": 6}, "b": {"memoryGiB": 6}}))
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    async with httpx.AsyncClient(base_url=stack.routers[0].url, timeout=60) as client:
        for member in ("a", "b"):
            response = await client.post("/v1/chat/completions", json={**body, "model": member})
            assert response.status_code == 200, response.text
    console = await open_console(browser, stack.controller_url, tmp_path / "screenshots")
    page = console.page
    await page.wait_for_selector(f'{POOL}[data-residents="a b"][data-phase="idle"]')
    line = await page.text_content(f"{POOL} .resident") or ""
    assert "Residents: a, b" in line
    assert "12 of 24 GiB free" in line
    await page.wait_for_selector(f'{POOL} [data-track="a"] .span', timeout=45_000)
    await page.wait_for_selector(f'{POOL} [data-track="b"] .span', timeout=45_000)
    assert await page.locator(f'{POOL} .swap-bar[data-outcome="swap_completed"]').count() == 2
    await console.shot("capacity-residents")
    assert console.offline.refused == []
    assert console.errors == []


GROUP = '[data-group="assistant"]'


def copy_row(pool: str, status: str, leases: int) -> str:
    return f'{GROUP} tr[data-copy="{pool}"][data-status="{status}"][data-leases="{leases}"]'


async def test_a_model_group_shows_its_copies_and_its_last_placement(
    start_console_stack: StartStack, browser: Browser, tmp_path: Path
) -> None:
    """The group assistant over gpu0..gpu3, warm on gpu0 and gpu1: with one stream live
    on each copy, the group's card shows both copies resident with a lease of their 4
    slots, gpu2 and gpu3 absent, and the last placement and why (the second stream's:
    gpu1, resident_least_busy)."""
    defaults = {"gpu0": "assistant", "gpu1": "assistant", "gpu2": "other", "gpu3": "other"}
    stack = start_console_stack(fleet_config(defaults=defaults))
    for pool, member in defaults.items():
        await stack.wait_resident(member, pool=pool, timeout=30)
    console = await open_console(browser, stack.controller_url, tmp_path / "screenshots")
    page = console.page
    await page.wait_for_selector(copy_row("gpu0", "resident", 0))
    await page.wait_for_selector(copy_row("gpu2", "absent", 0))
    url = stack.routers[0].url
    async with (
        live_stream(url, "assistant", 1200) as first,
        live_stream(url, "assistant", 1200) as second,
    ):
        await page.wait_for_selector(copy_row("gpu0", "resident", 1))
        await page.wait_for_selector(copy_row("gpu1", "resident", 1))
        await page.wait_for_selector(f'{GROUP}[data-placed="gpu1"]')
        assert await page.text_content(f'{GROUP} tr[data-copy="gpu1"] td.num') == "1/4"
        for pool in ("gpu2", "gpu3"):
            assert await page.locator(copy_row(pool, "absent", 0)).count() == 1
        line = await page.text_content(f"{GROUP} .placement") or ""
        assert "placed: gpu1, reason: resident_least_busy" in line, line
        await console.shot("model-group")
        assert not first.done(), "the first stream is live"
        assert not second.done(), "the second stream is live"
    assert console.offline.refused == []
    assert console.errors == []
