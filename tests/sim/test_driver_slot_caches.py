"""The controller drivers' slot caches (``drivers/slot_cache.py``) against a real sim: what a
cut save leaves, where a restore goes, and the pool's disk budget."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from hotseat.launcher import free_port
from hotseat_common.config import HotseatConfig, parse_config
from hotseat_pool_controller.drivers.base import CacheFailure
from hotseat_pool_controller.drivers.slot_cache import SlotCaches, cache_file_name
from tests.sim.conftest import StartSim
from tests.support.sim import FAST_SIM, SimHandle

KEY = "0123456789abcdef"
TOKEN_BYTES = 1000


def pool_config(
    tmp_path: Path,
    *,
    pool_budget: str | None = None,
    io: float = 2e9,
    ports: dict[str, int] | None = None,
    **cache: Any,
) -> HotseatConfig:
    """Members a and b of one sim pool, both carrying their slots (one slot each), their
    slot files written and read at ``io`` bytes/s."""
    ports = ports or {name: free_port() for name in ("a", "b")}
    sim = {**FAST_SIM, "slots": 1, "cacheBytesPerToken": TOKEN_BYTES, "cacheIoBytesPerSecond": io}
    members = [
        {
            "name": name,
            "sim": sim,
            "cache": {"carryOver": True, "dir": str(tmp_path / name), **cache.get(name, {})},
        }
        for name in ("a", "b")
    ]
    return parse_config(
        {
            "backends": [
                {
                    "name": name,
                    "address": f"http://127.0.0.1:{port}",
                    "pool": {"name": "gpu0", "member": name},
                }
                for name, port in ports.items()
            ],
            "pools": [
                {
                    "name": "gpu0",
                    "driver": {"kind": "sim"},
                    "cache": {"maxBytes": pool_budget} if pool_budget else {},
                    "members": members,
                }
            ],
        }
    )


async def chat(sim: SimHandle, words: int) -> None:
    prompt = " ".join(f"t{i}" for i in range(words))
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": 2}
    assert (await sim.http.post("/v1/chat/completions", json=body)).status_code == 200


def saved_tokens(path: Path) -> int:
    return len(json.loads(path.read_bytes().split(b"\n", 1)[0])["tokens"])


async def test_a_save_cut_by_its_timeout_leaves_the_previous_file_whole(
    start_sim: StartSim, tmp_path: Path
) -> None:
    """A sim writing its slot files at 100 kB/s: a save within saveTimeout, then a longer
    conversation whose save outlasts a saveTimeout of 300 ms. The file still holds the
    first save (the cut one never replaced it), and the step reports a timeout rather than
    raising."""
    ports = {"a": free_port(), "b": free_port()}
    config = pool_config(tmp_path, io=1e5, ports=ports, a={"saveTimeout": "30s"})
    hasty = pool_config(tmp_path, io=1e5, ports=ports, a={"saveTimeout": "300ms"})
    sim = await start_sim(config, "a", loaded=True)
    await chat(sim, 100)
    caches = SlotCaches(config.pools[0])
    first = await caches.save("a", sim.url, KEY)
    assert (first.slots, first.tokens, first.failures) == (1, 102, ())
    final = tmp_path / "a" / cache_file_name(KEY, 0)
    assert saved_tokens(final) == 102

    await chat(sim, 300)
    cut_short = SlotCaches(hasty.pools[0])
    cut = await cut_short.save("a", sim.url, KEY)
    assert [f.reason for f in cut.failures] == [CacheFailure.TIMEOUT]
    assert cut.slots == 0
    assert saved_tokens(final) == 102
    await caches.aclose()
    await cut_short.aclose()


async def test_a_restore_never_replaces_a_slot_in_use(start_sim: StartSim, tmp_path: Path) -> None:
    """A saved slot is restored into an empty slot, and left alone when the slot already
    holds a conversation (nothing restored, nothing failed)."""
    config = pool_config(tmp_path)
    caches = SlotCaches(config.pools[0])
    sim = await start_sim(config, "a", loaded=True)
    await chat(sim, 50)
    assert (await caches.save("a", sim.url, KEY)).tokens == 52
    await sim.unload()
    await sim.wait_for_state("unloaded")
    await sim.load()
    await sim.wait_for_state("ready")
    restored = await caches.restore("a", sim.url, KEY)
    assert (restored.slots, restored.tokens, restored.bytes) == (1, 52, 52 * TOKEN_BYTES)

    await chat(sim, 10)  # another conversation takes the slot
    again = await caches.restore("a", sim.url, KEY)
    assert (again.slots, again.tokens, again.failures) == (0, 0, ())
    async with httpx.AsyncClient() as client:
        [slot] = (await client.get(f"{sim.url}/slots")).json()
    assert slot["n_prompt_tokens"] == 12
    await caches.aclose()


async def test_the_pool_budget_drops_the_least_recently_used_across_members(
    start_sim: StartSim, tmp_path: Path
) -> None:
    """Two members within their own budgets but over the pool's together: the older save
    (a's) is deleted when b saves, and counted as dropped by budget."""
    config = pool_config(tmp_path, pool_budget="150KB")
    caches = SlotCaches(config.pools[0])
    a = await start_sim(config, "a", loaded=True)
    b = await start_sim(config, "b", loaded=True)
    await chat(a, 98)
    await chat(b, 98)
    assert (await caches.save("a", a.url, KEY)).dropped_budget == 0
    second = await caches.save("b", b.url, KEY)
    assert second.dropped_budget == 1
    assert not list((tmp_path / "a").iterdir())
    assert [p.name for p in (tmp_path / "b").iterdir()] == [cache_file_name(KEY, 0)]
    await caches.aclose()


async def test_a_file_the_server_refuses_is_deleted(start_sim: StartSim, tmp_path: Path) -> None:
    """A file under this member's key that its server refuses (here: written by another
    model) fails the restore with reason error and is deleted, so no later swap tries it
    again; the slot stays empty."""
    config = pool_config(tmp_path)
    caches = SlotCaches(config.pools[0])
    a = await start_sim(config, "a", loaded=True)
    b = await start_sim(config, "b", loaded=True)
    await chat(b, 30)
    assert (await caches.save("b", b.url, KEY)).tokens == 32
    foreign = tmp_path / "a" / cache_file_name(KEY, 0)
    foreign.write_bytes((tmp_path / "b" / cache_file_name(KEY, 0)).read_bytes())
    refused = await caches.restore("a", a.url, KEY)
    assert [f.reason for f in refused.failures] == [CacheFailure.ERROR]
    assert refused.slots == 0
    assert not foreign.exists()
    async with httpx.AsyncClient() as client:
        [slot] = (await client.get(f"{a.url}/slots")).json()
    assert "n_prompt_tokens" not in slot
    await caches.aclose()
