"""The controller's pipelined Redis connection against real redis-server processes:
replies reach their own callers, scripts survive a flush, and broken, stalled and
authenticated servers behave as the store expects (redis-py's exception types)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
import redis.asyncio as aioredis
import uvloop
from redis.exceptions import AuthenticationError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from hotseat.launcher import Managed, start_redis
from hotseat_common.settings import RedisSettings
from hotseat_pool_controller.store.link import LuaScript, RedisLink

ECHO_ARGV = LuaScript("return {KEYS[1], ARGV[1], tonumber(ARGV[2]) * 2}")


def _settings(url: str, password: str | None = None) -> RedisSettings:
    return RedisSettings(redis_url=url, redis_password=password)


async def test_concurrent_commands_each_get_their_own_reply(link: RedisLink) -> None:
    """1,000 commands in flight at once on one socket, every fifth one an error reply:
    each caller gets exactly its own answer."""
    key = f"str-{uuid.uuid4().hex}"
    await link.execute("SET", key, "not a number")

    async def one(i: int) -> object:
        if i % 5 == 0:
            with pytest.raises(ResponseError, match="not an integer"):
                await link.execute("INCR", key)
            return "error"
        return await link.execute("ECHO", f"value-{i}")

    replies = await asyncio.gather(*(one(i) for i in range(1000)))
    assert replies == ["error" if i % 5 == 0 else f"value-{i}" for i in range(1000)]
    await link.execute("DEL", key)


async def test_a_script_is_sent_in_full_when_the_server_does_not_know_it(
    link: RedisLink, redis: aioredis.Redis
) -> None:
    await redis.script_flush()
    assert await link.script(ECHO_ARGV, ["k"], ["a", 21]) == ["k", "a", 42]
    assert await redis.script_exists(ECHO_ARGV.sha) == [True]
    assert await link.script(ECHO_ARGV, ["k2"], ["b", 1]) == ["k2", "b", 2]


async def test_a_broken_connection_fails_its_waiters_at_once_and_the_next_command_reconnects(
    link: RedisLink, redis: aioredis.Redis
) -> None:
    """CLIENT KILL cuts the link mid-command: the blocked command fails with a connection
    error well before its own timeout, and the link then works on a new connection."""
    name = f"link-{uuid.uuid4().hex[:8]}"
    await link.execute("CLIENT", "SETNAME", name)
    blocked = asyncio.create_task(link.execute("BLPOP", f"never-{name}", 30))
    client_id = await _client_listed(redis, name, command="blpop")
    await redis.execute_command("CLIENT", "KILL", "ID", client_id)
    with pytest.raises(RedisConnectionError):  # the cut, not the 30 s block running out
        await blocked
    assert await link.execute("PING") == "PONG"


async def test_a_command_cut_by_a_broken_connection_is_resent_when_allowed(
    redis_server: Managed, redis: aioredis.Redis
) -> None:
    """With retries, a command that met a broken connection is sent again on a new one."""
    name = f"retry-{uuid.uuid4().hex[:8]}"
    link = RedisLink(_settings(redis_server.url), retries=1, name=name)
    try:
        key = f"list-{name}"
        blocked = asyncio.create_task(link.execute("BLPOP", key, 30))
        first = await _client_listed(redis, name, command="blpop")
        await redis.execute_command("CLIENT", "KILL", "ID", first)
        second = await _client_listed(redis, name, command="blpop")  # resent
        assert second != first
        await redis.rpush(key, "done")
        assert await blocked == [key, "done"]
    finally:
        await link.aclose()


async def test_a_stalled_server_times_out_and_the_link_recovers(tmp_path: Path) -> None:
    """SIGSTOP the server: a command fails with TimeoutError after the link's timeout (not
    never); SIGCONT: the next command succeeds on a fresh connection."""
    server = start_redis(tmp_path / "redis")
    link = RedisLink(_settings(server.url), timeout=0.5)
    try:
        assert await link.execute("PING") == "PONG"
        os.kill(server.pid, signal.SIGSTOP)
        try:
            with pytest.raises(RedisTimeoutError):  # the link's own timeout ends the wait
                await link.execute("PING")
        finally:
            os.kill(server.pid, signal.SIGCONT)
        assert await link.execute("PING") == "PONG"
    finally:
        await link.aclose()
        server.stop()


async def test_a_restarted_server_is_reached_again(tmp_path: Path) -> None:
    server = start_redis(tmp_path / "redis")
    port = int(server.url.rsplit(":", 1)[1].split("/")[0])
    link = RedisLink(_settings(server.url))
    try:
        await link.execute("SET", "k", "v1")
        server.stop()
        with pytest.raises(RedisConnectionError):
            await link.execute("GET", "k")
        server = start_redis(tmp_path / "redis", port=port)
        assert await link.execute("GET", "k") is None  # a new, empty server
    finally:
        await link.aclose()
        server.stop()


async def test_password_username_and_database_come_from_the_settings(tmp_path: Path) -> None:
    password = "link-pw-" + uuid.uuid4().hex[:8]
    server = start_redis(tmp_path / "redis", extra_args=["--requirepass", password])
    base = server.url.rsplit("/", 1)[0]
    check: aioredis.Redis = aioredis.from_url(f"{base}/3", password=password)
    try:
        link = RedisLink(_settings(f"{base}/3", password))
        await link.execute("SET", "in-db-3", "yes")
        await link.aclose()
        assert await check.get("in-db-3") == b"yes"

        in_url = RedisLink(_settings(f"{base.replace('//', f'//default:{password}@')}/0"))
        assert await in_url.execute("PING") == "PONG"
        await in_url.aclose()

        wrong = RedisLink(_settings(server.url, "wrong"))
        with pytest.raises(AuthenticationError):
            await wrong.execute("PING")
        await wrong.aclose()

        missing = RedisLink(_settings(server.url))
        with pytest.raises(ResponseError, match="NOAUTH"):
            await missing.execute("GET", "k")
        await missing.aclose()
    finally:
        await check.aclose()
        server.stop()


async def test_nothing_listens(tmp_path: Path) -> None:
    server = start_redis(tmp_path / "redis")
    url = server.url
    server.stop()
    link = RedisLink(_settings(url))
    with pytest.raises(RedisConnectionError, match="cannot connect"):
        await link.execute("PING")
    await link.aclose()
    with pytest.raises(RedisConnectionError, match="closed"):
        await link.execute("PING")


async def _client_listed(redis: aioredis.Redis, name: str, *, command: str) -> str:
    """The id of the client of that name, once it runs ``command`` on the server."""
    deadline = time.monotonic() + 30
    while True:
        clients = await redis.client_list()
        for client in clients:
            if client.get("name") == name and client.get("cmd") == command:
                return str(client["id"])
        assert time.monotonic() < deadline, f"{name} never ran {command}: {clients}"
        await asyncio.sleep(0.01)  # CLIENT LIST is polled: Redis announces no command


def test_the_same_under_uvloop_the_loop_the_services_run(redis_server: Managed) -> None:
    """uvloop's transports are not asyncio's classes: the link must work on both."""

    async def scenario() -> None:
        link = RedisLink(_settings(redis_server.url))
        try:
            await test_concurrent_commands_each_get_their_own_reply(link)
            assert await link.script(ECHO_ARGV, ["k"], ["u", 2]) == ["k", "u", 4]
        finally:
            await link.aclose()

    uvloop.run(scenario())
