"""Every key a store script touches is one it was given in KEYS (Redis Cluster's rule for
scripts, and what proxies that route by KEYS rely on). The scripts run here against a
real Redis with ``redis.call`` wrapped to refuse any key that was not declared."""

from __future__ import annotations

import pytest
from redis.exceptions import ResponseError

from hotseat.launcher import Managed
from hotseat_common.keys import Keys
from hotseat_pool_controller.store.link import LuaScript, RedisLink
from hotseat_pool_controller.store.pool import PoolStore
from tests.controller.test_stateful import POLICY, ControllerMachine, run_to_quiescence
from tests.support.pool_state import store_id

SCRIPTS = ("_snapshot", "_apply", "_renew", "_release", "_reap", "_grant_fast", "_cancel")

REFUSE_UNDECLARED = """
local declared = {}
for _, key in ipairs(KEYS) do declared[key] = true end
local real = redis
local redis = setmetatable({
  call = function(command, ...)
    local key = ...
    if string.upper(command) ~= 'TIME' and not declared[key] then
      error('undeclared key ' .. tostring(key) .. ' in ' .. command)
    end
    return real.call(command, ...)
  end,
}, {__index = real})
"""


def refuse_undeclared_keys(store: PoolStore) -> PoolStore:
    for name in SCRIPTS:
        script: LuaScript = getattr(store, name)
        setattr(store, name, LuaScript(REFUSE_UNDECLARED + script.source))
    return store


async def test_the_guard_itself_refuses_an_undeclared_key(link: RedisLink) -> None:
    """The check can fail: a script touching a key outside KEYS is refused."""
    sneaky = LuaScript(REFUSE_UNDECLARED + "return redis.call('GET', 'not-declared')")
    with pytest.raises(ResponseError, match="undeclared key not-declared"):
        await link.script(sneaky, ["declared"], [])


async def test_hot_path_scripts_touch_only_declared_keys(link: RedisLink, prefix: str) -> None:
    store = refuse_undeclared_keys(PoolStore(link, Keys(prefix), POLICY))
    state = store.keys.pool_state(POLICY.name)
    await link.execute(
        "HSET", state, "phase", "idle", "resident", "a", "epoch", "4", "store", await store_id(link)
    )
    granted = await store.grant_if_resident("a", "l1", "r1", "router")
    assert granted is not None
    assert await store.renew("a", "l1")
    assert (await store.release("a", "l1")).removed
    assert await store.grant_if_resident("a", "l2", "r2", "router") is not None
    assert await store.cancel("a", "r2")  # frees the lease it was granted
    assert await store.reap() == []
    snap = await store.snapshot("r1")
    assert snap.resident == "a"
    await store.reset()


def test_every_transition_touches_only_declared_keys(redis_server: Managed) -> None:
    """The stateful machine's whole repertoire (acquires, releases, expiries, cancels,
    ticks, swap steps, failures, controller deaths) with the keys checked."""
    ControllerMachine.redis_url = redis_server.url

    class Declared(ControllerMachine):
        def __init__(self) -> None:
            super().__init__()
            refuse_undeclared_keys(self.store)

    run_to_quiescence(Declared, examples=20, steps=30)
