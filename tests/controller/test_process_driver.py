"""The ``process`` driver against real child processes: start, readiness, stop, escalation."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml

from hotseat.launcher import find_binary, free_port
from hotseat_common.config import load_config
from hotseat_common.config.model import HotseatConfig, Pool
from hotseat_common.keys import Keys
from hotseat_pool_controller.drivers import DriverError, build_driver, process
from hotseat_pool_controller.drivers.base import Fenced
from hotseat_pool_controller.drivers.process import ProcessDriver
from hotseat_pool_controller.drivers.processgroup import read_pid_file
from hotseat_sim.timeline import read_timeline, residencies
from tests.support.oracle import judge
from tests.support.waiting import eventually

MEMBER_SERVER = str(Path(__file__).with_name("member_server.py"))


def server_argv(port: int, *flags: str) -> list[str]:
    return [sys.executable, MEMBER_SERVER, "--port", str(port), *flags]


def make_config(
    data_dir: Path,
    members: dict[str, tuple[int, list[str]]],
    *,
    grace: float = 5.0,
    ready_timeout: float | None = None,
    extra: dict[str, dict[str, Any]] | None = None,
) -> tuple[HotseatConfig, Pool]:
    config = HotseatConfig.model_validate(
        {
            "backends": [
                {
                    "name": name,
                    "address": f"http://127.0.0.1:{port}",
                    "pool": {"name": "gpu0", "member": name},
                }
                for name, (port, _) in members.items()
            ],
            "pools": [
                {
                    "name": "gpu0",
                    "driver": {
                        "kind": "process",
                        "stopGracePeriod": grace,
                        "readyTimeout": ready_timeout,
                        "dataDir": str(data_dir),
                    },
                    "members": [
                        {"name": name, "process": {"command": argv, **(extra or {}).get(name, {})}}
                        for name, (_, argv) in members.items()
                    ],
                }
            ],
        }
    )
    pool = config.pool("gpu0")
    assert pool is not None
    return config, pool


@pytest.fixture
def drivers() -> Iterator[list[ProcessDriver]]:
    """Drivers made by a test; any process they leave is killed at teardown."""
    made: list[ProcessDriver] = []
    yield made
    for driver in made:
        for run in driver._running.values():
            try:
                os.killpg(run.pid, signal.SIGKILL)
            except ProcessLookupError:
                continue


@pytest.fixture
async def make_driver(
    drivers: list[ProcessDriver],
) -> AsyncIterator[Callable[[HotseatConfig, Pool], ProcessDriver]]:
    def make(config: HotseatConfig, pool: Pool) -> ProcessDriver:
        driver = build_driver(config, pool)
        assert isinstance(driver, ProcessDriver)
        drivers.append(driver)
        return driver

    yield make
    for driver in drivers:
        await driver.aclose()


def pid_of(data_dir: Path, member: str) -> int:
    record = read_pid_file(data_dir / "gpu0" / f"{member}.pid")
    assert record is not None, "no pid file"
    return record.pid


def group_of(pgid: int) -> list[int]:
    """Live (non-zombie) processes in group ``pgid``."""
    alive = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(proc.pid)
        except OSError:
            continue
    return alive


def is_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


async def health(port: int) -> int:
    async with httpx.AsyncClient(trust_env=False) as client:
        return (await client.get(f"http://127.0.0.1:{port}/health")).status_code


async def test_load_returns_once_health_answers_200(tmp_path, make_driver):
    """load starts the command and returns only after its health URL turns from 503 to 200."""
    port = free_port()
    config, pool = make_config(tmp_path, {"a": (port, server_argv(port, "--startup-delay", "0.6"))})
    driver = make_driver(config, pool)
    started = time.monotonic()
    await driver.load("a", epoch=1)
    assert time.monotonic() - started >= 0.6
    assert await health(port) == 200
    assert await driver.is_ready("a")
    assert await driver.residency() == {"a": True}
    log_text = (tmp_path / "gpu0" / "a.log").read_text()
    assert "--- hotseat: starting a (epoch 1)" in log_text
    assert f"member_server: listening on 127.0.0.1:{port}" in log_text  # stdout
    assert "GET /health" in log_text  # stderr


async def test_unload_stops_the_whole_group_and_frees_the_port(tmp_path, make_driver):
    """unload returns with the leader and its worker gone, the port closed, no pid file."""
    port = free_port()
    # An hour's grace: unload can only return within the test because SIGTERM was
    # honoured (a driver that waited for the grace period would hang the test instead).
    config, pool = make_config(tmp_path, {"a": (port, server_argv(port, "--child"))}, grace=3600)
    driver = make_driver(config, pool)
    await driver.load("a", epoch=1)
    leader = pid_of(tmp_path, "a")
    group = group_of(leader)
    assert leader in group
    assert len(group) == 2, "the server and its worker"
    await driver.unload("a", epoch=2)
    assert all(is_gone(pid) for pid in group)
    assert group_of(leader) == []
    assert not port_open(port)
    assert not (tmp_path / "gpu0" / "a.pid").exists()
    assert not await driver.is_ready("a")
    assert await driver.residency() == {"a": False}


async def test_worker_outliving_its_leader_is_killed(tmp_path, make_driver):
    """A worker that ignores SIGTERM after its leader exits is SIGKILLed before unload returns."""
    port = free_port()
    config, pool = make_config(
        tmp_path, {"a": (port, server_argv(port, "--child-ignores-sigterm"))}, grace=0.5
    )
    driver = make_driver(config, pool)
    await driver.load("a", epoch=1)
    leader = pid_of(tmp_path, "a")
    group = group_of(leader)
    assert len(group) == 2
    started = time.monotonic()
    await driver.unload("a", epoch=2)
    assert time.monotonic() - started >= 0.5, "the worker's grace period was waited for"
    assert all(is_gone(pid) for pid in group)


async def test_sigterm_ignoring_member_is_killed_after_the_grace_period(tmp_path, make_driver):
    """A member that ignores SIGTERM (llama-server mid-request) is SIGKILLed after the grace."""
    port = free_port()
    argv = server_argv(port, "--ignore-sigterm", "--child")
    config, pool = make_config(tmp_path, {"a": (port, argv)}, grace=0.8)
    driver = make_driver(config, pool)
    await driver.load("a", epoch=1)
    leader = pid_of(tmp_path, "a")
    group = group_of(leader)
    assert len(group) == 2
    started = time.monotonic()
    await driver.unload("a", epoch=2)
    assert time.monotonic() - started >= 0.8, "killed before its grace period was over"
    assert all(is_gone(pid) for pid in group)
    assert not port_open(port)


async def test_member_that_dies_out_of_band_is_not_ready_and_reloads(tmp_path, make_driver):
    """A member killed behind the driver's back reads as not ready; the next load starts anew."""
    port = free_port()
    config, pool = make_config(tmp_path, {"a": (port, server_argv(port))})
    driver = make_driver(config, pool)
    await driver.load("a", epoch=1)
    first = pid_of(tmp_path, "a")
    os.killpg(first, signal.SIGKILL)

    async def gone() -> bool:
        return not (await driver.residency())["a"]

    await eventually(gone, timeout=30, interval=0.02)
    assert not await driver.is_ready("a")
    await driver.load("a", epoch=2)
    second = pid_of(tmp_path, "a")
    assert second != first
    assert await driver.is_ready("a")


async def test_load_restarts_a_running_member_that_stopped_answering(tmp_path, make_driver):
    """A member that was ready and now fails its health check is replaced by a fresh process."""
    port = free_port()
    config, pool = make_config(tmp_path, {"a": (port, server_argv(port))})
    driver = make_driver(config, pool)
    await driver.load("a", epoch=1)
    first = pid_of(tmp_path, "a")
    async with httpx.AsyncClient(trust_env=False) as client:
        await client.put(f"http://127.0.0.1:{port}/test/sick", content=b"1")
    assert not await driver.is_ready("a")
    assert await driver.residency() == {"a": True}, "alive, but not ready"
    await driver.load("a", epoch=2)
    assert is_gone(first)
    assert pid_of(tmp_path, "a") != first
    assert await driver.is_ready("a")


async def test_unwritable_data_dir_is_a_driver_error(tmp_path, make_driver):
    """A data dir that cannot be created fails the load as a DriverError, starting nothing."""
    port = free_port()
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    config, pool = make_config(blocker, {"a": (port, server_argv(port))})
    driver = make_driver(config, pool)
    with pytest.raises(DriverError, match="cannot open its log or data dir"):
        await driver.load("a", epoch=1)
    assert not port_open(port)


async def test_missing_binary_is_a_clear_error(tmp_path, make_driver):
    """A command that does not exist fails the load with its name, and leaves nothing behind."""
    port = free_port()
    config, pool = make_config(
        tmp_path,
        {
            "a": (port, ["/nonexistent/llama-server", "-m", "x.gguf"]),
            "b": (free_port(), ["hotseat-no-such-server"]),
        },
    )
    driver = make_driver(config, pool)
    with pytest.raises(DriverError, match=r"cannot start '/nonexistent/llama-server': not found"):
        await driver.load("a", epoch=1)
    with pytest.raises(DriverError, match=r"'hotseat-no-such-server': not found .* on PATH"):
        await driver.load("b", epoch=1)
    assert await driver.residency() == {"a": False, "b": False}
    assert not (tmp_path / "gpu0" / "a.pid").exists()


async def test_member_exiting_before_ready_fails_with_its_log(tmp_path, make_driver):
    """A member that exits while loading fails the load at once, quoting its exit code and log."""
    port = free_port()
    argv = server_argv(port, "--startup-delay", "30", "--exit-after", "0.3", "--child")
    config, pool = make_config(tmp_path, {"a": (port, argv)})
    driver = make_driver(config, pool)
    with pytest.raises(DriverError) as caught:
        await driver.load("a", epoch=1)
    message = str(caught.value)
    assert "exited before ready (exit code 3)" in message  # the exit, not a wait ran out
    assert "failed to load model 'missing.gguf'" in message
    assert "--- hotseat: starting" not in message, "only this start's lines"
    worker = re.search(r"worker pid (\d+)", message)
    assert worker is not None
    assert is_gone(int(worker.group(1))), "the worker left behind by the dead server was killed too"
    assert await driver.residency() == {"a": False}
    assert not port_open(port)


async def test_ready_timeout_stops_a_member_that_never_gets_ready(tmp_path, make_driver):
    """readyTimeout bounds the load; the slow member is stopped, not left running."""
    port = free_port()
    argv = server_argv(port, "--startup-delay", "60")
    config, pool = make_config(tmp_path, {"a": (port, argv)}, ready_timeout=0.7)
    driver = make_driver(config, pool)
    with pytest.raises(DriverError, match=r"not ready after 0.7s \(readyTimeout\)"):
        await driver.load("a", epoch=1)
    assert await driver.residency() == {"a": False}
    assert not port_open(port)


async def test_load_and_unload_are_idempotent(tmp_path, make_driver):
    """A second load keeps the same process; unloading twice, or a cold member, is a no-op."""
    port = free_port()
    config, pool = make_config(tmp_path, {"a": (port, server_argv(port))})
    driver = make_driver(config, pool)
    await driver.unload("a", epoch=1)  # cold: nothing to stop, nothing started
    assert not (tmp_path / "gpu0" / "a.log").exists()
    await driver.load("a", epoch=2)
    pid = pid_of(tmp_path, "a")
    await driver.load("a", epoch=3)
    assert pid_of(tmp_path, "a") == pid
    await driver.unload("a", epoch=4)
    await driver.unload("a", epoch=5)
    assert is_gone(pid)


async def test_cancelled_load_leaves_a_process_unload_can_stop(tmp_path, make_driver):
    """A load cancelled while the member loads (swap deadline) leaves it stoppable by unload."""
    port = free_port()
    config, pool = make_config(tmp_path, {"a": (port, server_argv(port, "--startup-delay", "60"))})
    driver = make_driver(config, pool)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.8):
            await driver.load("a", epoch=1)
    pid = pid_of(tmp_path, "a")
    assert await driver.residency() == {"a": True}, "loading counts as resident"
    assert not await driver.is_ready("a")
    await driver.unload("a", epoch=2)
    assert is_gone(pid)
    assert not port_open(port)


async def test_is_idle_reads_llama_cpp_slots(tmp_path, make_driver):
    """is_idle follows /slots' is_processing, and raises when it cannot ask."""
    port = free_port()
    config, pool = make_config(tmp_path, {"a": (port, server_argv(port))})
    driver = make_driver(config, pool)
    with pytest.raises(DriverError, match="not running"):
        await driver.is_idle("a")
    await driver.load("a", epoch=1)
    assert await driver.is_idle("a")
    async with httpx.AsyncClient(trust_env=False) as client:
        await client.put(f"http://127.0.0.1:{port}/test/busy", content=b"1")
    assert not await driver.is_idle("a")


async def test_is_idle_fails_closed_on_a_bad_slots_url(tmp_path, make_driver):
    """A /slots URL that answers 404 is an error, never 'idle'."""
    port = free_port()
    config, pool = make_config(
        tmp_path,
        {"a": (port, server_argv(port))},
        extra={"a": {"slotsUrl": f"http://127.0.0.1:{port}/nope"}},
    )
    driver = make_driver(config, pool)
    await driver.load("a", epoch=1)
    with pytest.raises(DriverError, match="cannot tell whether idle"):
        await driver.is_idle("a")


async def test_aclose_stops_every_member(tmp_path, make_driver):
    """Closing the driver (controller shutdown) leaves no member process behind."""
    ports = [free_port(), free_port()]
    config, pool = make_config(
        tmp_path,
        {
            "a": (ports[0], server_argv(ports[0], "--child")),
            "b": (ports[1], server_argv(ports[1], "--ignore-sigterm")),
        },
        grace=0.5,
    )
    driver = make_driver(config, pool)
    await asyncio.gather(driver.load("a", epoch=1), driver.load("b", epoch=1))
    pids = group_of(pid_of(tmp_path, "a")) + group_of(pid_of(tmp_path, "b"))
    assert len(pids) == 3
    await driver.aclose()
    assert all(is_gone(pid) for pid in pids)
    assert not any(port_open(p) for p in ports)


async def test_another_driver_finds_and_stops_a_member_through_its_pid_file(tmp_path, make_driver):
    """A second driver on the host (restarted or standby controller) sees and stops the member."""
    port = free_port()
    config, pool = make_config(tmp_path, {"a": (port, server_argv(port, "--child"))})
    first = make_driver(config, pool)
    second = make_driver(config, pool)
    await first.load("a", epoch=1)
    pids = group_of(pid_of(tmp_path, "a"))
    assert await second.residency() == {"a": True}
    assert await second.is_ready("a")
    await second.load("a", epoch=2)  # already running: no second process
    assert group_of(pid_of(tmp_path, "a")) == pids
    await second.unload("a", epoch=3)
    assert all(is_gone(pid) for pid in pids)
    assert not port_open(port)
    assert not await first.is_ready("a")


async def test_foreign_listener_on_the_port_blocks_load_and_unload(
    tmp_path, make_driver, monkeypatch
):
    """Something else on the member's port fails load (never mistaken for ready) and unload."""
    monkeypatch.setattr(process, "PORT_RELEASE_TIMEOUT_S", 0.5)
    port = free_port()
    config, pool = make_config(tmp_path, {"a": (port, server_argv(port))})
    driver = make_driver(config, pool)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen()
        with pytest.raises(DriverError, match="already accepts connections"):
            await driver.load("a", epoch=1)
        with pytest.raises(DriverError, match="still accepts connections"):
            await driver.unload("a", epoch=1)
    assert not (tmp_path / "gpu0" / "a.pid").exists()


async def test_env_and_cwd_reach_the_process(tmp_path, make_driver):
    """The member's env is merged into the controller's, and it runs in its cwd."""
    port = free_port()
    workdir = tmp_path / "work"
    workdir.mkdir()
    script = (
        "import os, pathlib, runpy, sys; "
        "seen = os.environ['HOTSEAT_TEST_VALUE'] + ' ' + os.environ['PATH']; "
        "pathlib.Path('seen.txt').write_text(seen); "
        f"sys.argv = [{MEMBER_SERVER!r}, '--port', '{port}']; "
        f"runpy.run_path({MEMBER_SERVER!r}, run_name='__main__')"
    )
    config, pool = make_config(
        tmp_path,
        {"a": (port, [sys.executable, "-c", script])},
        extra={"a": {"env": {"HOTSEAT_TEST_VALUE": "x42"}, "cwd": str(workdir)}},
    )
    driver = make_driver(config, pool)
    await driver.load("a", epoch=1)
    seen = (workdir / "seen.txt").read_text()
    assert seen == "x42 " + os.environ["PATH"]


async def test_variables_and_home_are_expanded_in_the_command(tmp_path, make_driver, monkeypatch):
    """${NAME} (member env over the controller's), ${NAME:-default}, $$ and a leading ~ are
    expanded in the command; a bare $NAME is left for a shell to read."""
    port = free_port()
    monkeypatch.setenv("HOTSEAT_TEST_FROM_CONTROLLER", "ctl")
    monkeypatch.setenv("HOTSEAT_TEST_EMPTY", "")
    script = (
        "import pathlib, runpy, sys; "
        "pathlib.Path(sys.argv[1]).write_text('\\n'.join(sys.argv[2:])); "
        f"sys.argv = [{MEMBER_SERVER!r}, '--port', '{port}']; "
        f"runpy.run_path({MEMBER_SERVER!r}, run_name='__main__')"
    )
    argv = [
        sys.executable, "-c", script, "${HOTSEAT_TEST_OUT}/seen.txt",
        "${HOTSEAT_TEST_FROM_CONTROLLER}", "${HOTSEAT_TEST_MEMBER}",
        "${HOTSEAT_TEST_UNSET_X:-fallback}", "${HOTSEAT_TEST_EMPTY:-was-empty}",
        "~/models", "cost $$5", "$HOME",
    ]  # fmt: skip
    env = {"HOTSEAT_TEST_MEMBER": "member", "HOTSEAT_TEST_OUT": str(tmp_path)}
    config, pool = make_config(tmp_path, {"a": (port, argv)}, extra={"a": {"env": env}})
    driver = make_driver(config, pool)
    await driver.load("a", epoch=1)
    seen = (tmp_path / "seen.txt").read_text().split("\n")
    home = str(Path.home())
    assert seen == ["ctl", "member", "fallback", "was-empty", f"{home}/models", "cost $5", "$HOME"]


async def test_unset_variable_fails_the_load_by_name(tmp_path, make_driver):
    """A command naming an unset ${NAME} without a default fails its load, naming it; nothing
    is started."""
    port = free_port()
    argv = [*server_argv(port), "--model", "${HOTSEAT_TEST_NEVER_SET}/m.gguf"]
    config, pool = make_config(tmp_path, {"a": (port, argv)})
    driver = make_driver(config, pool)
    with pytest.raises(DriverError, match=r"\$\{HOTSEAT_TEST_NEVER_SET\}, not set"):
        await driver.load("a", epoch=1)
    assert await driver.residency() == {"a": False}
    assert not (tmp_path / "gpu0" / "a.pid").exists()


# --- the sim backend started as a command -------------------------------------------------


def write_sim_config(
    path: Path, ports: dict[str, int], *, redis_url: str, prefix: str, grace: float
) -> tuple[HotseatConfig, Pool]:
    """A process pool whose members are ``hotseat-sim`` processes sharing one ledger."""
    sim = find_binary("hotseat-sim")
    document = {
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
                "driver": {
                    "kind": "process",
                    "stopGracePeriod": grace,
                    "dataDir": str(path.parent),
                },
                "members": [
                    {
                        "name": name,
                        "sim": {"loadSeconds": 0.3, "tokensPerSecond": 20},
                        "process": {
                            "command": [
                                sim,
                                "--config",
                                str(path),
                                "--backend",
                                name,
                                "--load-on-start",
                                "true",
                                "--redis-url",
                                redis_url,
                                "--key-prefix",
                                prefix,
                                "--log-format",
                                "console",
                            ]
                        },
                    }
                    for name in ports
                ],
            }
        ],
    }
    path.write_text(yaml.safe_dump(document))
    config = load_config(path)
    pool = config.pool("gpu0")
    assert pool is not None
    return config, pool


@pytest.mark.slow
async def test_sim_members_swap_through_the_process_driver(
    tmp_path, make_driver, redis_server, redis, prefix
):
    """Two hotseat-sim processes take turns: the old one is gone (pid, port) before the new
    one starts, the GPU ledger shows no overlap, and closing the driver leaves no process."""
    ports = {"a": free_port(), "b": free_port()}
    config, pool = write_sim_config(
        tmp_path / "hotseat.yaml", ports, redis_url=redis_server.url, prefix=prefix, grace=5
    )
    driver = make_driver(config, pool)
    await driver.load("a", epoch=1)
    a_pid = pid_of(tmp_path, "a")
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        body = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        answer = await client.post(f"http://127.0.0.1:{ports['a']}/v1/chat/completions", json=body)
        assert answer.status_code == 200, answer.text
    await driver.unload("a", epoch=2)
    assert is_gone(a_pid)
    assert not port_open(ports["a"])
    await driver.load("b", epoch=2)
    b_pid = pid_of(tmp_path, "b")
    assert await driver.residency() == {"a": False, "b": True}
    timeline = await read_timeline(redis, Keys(prefix), "gpu0")
    verdict = judge(timeline)
    assert verdict.ok, verdict.summary()
    assert [r.member for r in residencies(timeline)] == ["a", "b"]
    await driver.aclose()
    assert is_gone(b_pid)
    assert not port_open(ports["b"])


@pytest.mark.slow
async def test_sim_member_serving_a_stream_is_killed_after_the_grace_period(
    tmp_path, make_driver, redis_server, prefix
):
    """A sim that waits for its in-flight stream on SIGTERM is SIGKILLed after stopGracePeriod."""
    ports = {"a": free_port()}
    config, pool = write_sim_config(
        tmp_path / "hotseat.yaml", ports, redis_url=redis_server.url, prefix=prefix, grace=1
    )
    driver = make_driver(config, pool)
    await driver.load("a", epoch=1)
    pid = pid_of(tmp_path, "a")
    url = f"http://127.0.0.1:{ports['a']}/v1/chat/completions"
    body = {
        "model": "a",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 72_000,  # an hour at 20 tokens/s: only the kill ends it in the test
        "stream": True,
    }
    async with (
        httpx.AsyncClient(trust_env=False, timeout=30) as client,
        client.stream("POST", url, json=body) as stream,
    ):
        assert stream.status_code == 200
        chunks = stream.aiter_lines()
        await anext(chunks)  # the stream is flowing
        assert not await driver.is_idle("a")
        started = time.monotonic()
        await driver.unload("a", epoch=2)
        elapsed = time.monotonic() - started
        with pytest.raises(httpx.HTTPError):
            async for _ in chunks:
                pass
    # Killed once the 1 s grace was over (never sooner), not left to finish its stream.
    assert elapsed >= 1.0, elapsed
    assert is_gone(pid)
    assert not port_open(ports["a"])


@pytest.mark.slow
async def test_a_thawed_stale_owner_can_neither_stop_nor_start_a_member(
    tmp_path, make_driver, redis_server, redis, prefix
):
    """Two controllers' drivers on one host: after the newer owner (epoch 2) moved the pool
    from a to b and b serves a stream, the older owner (epoch 1, thawed) can neither stop b
    nor start a, both refused by the host's epoch fence; the stream ends cleanly, the ledger
    shows no overlap and no cut, and the stale driver's shutdown leaves b running."""
    ports = {"a": free_port(), "b": free_port()}
    config, pool = write_sim_config(
        tmp_path / "hotseat.yaml", ports, redis_url=redis_server.url, prefix=prefix, grace=1
    )
    stale, newer = make_driver(config, pool), make_driver(config, pool)
    await stale.load("a", epoch=1)
    await newer.unload("a", epoch=2)
    await newer.load("b", epoch=2)
    url = f"http://127.0.0.1:{ports['b']}/v1/chat/completions"
    body = {"model": "b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 30,
            "stream": True}  # fmt: skip
    async with (
        httpx.AsyncClient(trust_env=False, timeout=30) as client,
        client.stream("POST", url, json=body) as stream,
    ):
        lines = stream.aiter_lines()
        await anext(lines)  # b is serving
        with pytest.raises(Fenced):
            await stale.unload("b", epoch=1)
        with pytest.raises(Fenced):
            await stale.load("a", epoch=1)
        rest = [line async for line in lines]
    assert "data: [DONE]" in rest
    await stale.aclose()
    assert await newer.is_ready("b")
    assert not port_open(ports["a"])
    timeline = await read_timeline(redis, Keys(prefix), "gpu0")
    verdict = judge(timeline)
    assert verdict.ok, verdict.summary()
