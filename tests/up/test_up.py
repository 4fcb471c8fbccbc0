"""``hotseat up`` end to end: a real subprocess starts the stack, the printed examples
answer, and SIGINT or SIGTERM stops every process it started within 30 s."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from hotseat.launcher import (
    FREE_PORTS_ENV,
    Managed,
    find_binary,
    free_port,
    nats_reachable,
    redis_reachable,
)
from hotseat.up import STOP_BUDGET_S, installed
from tests.up.harness import READY, Up, descendants, gone, run_json, write_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SERVICES = {
    "router": "hotseat_router.main",
    "controller": "hotseat_pool_controller.main",
    "audit": "hotseat_audit.main",
}


def stack_env(prefix: str, nats_url: str, redis_url: str) -> dict[str, str]:
    return {
        "HOTSEAT_NATS_URL": nats_url,
        "HOTSEAT_REDIS_URL": redis_url,
        **own_names(prefix),
    }


def own_names(prefix: str) -> dict[str, str]:
    """Names no other test shares, and a state directory of the test's own."""
    return {
        "HOTSEAT_STATE_DIR": str(Path(tempfile.mkdtemp(prefix=f"{prefix}-state-"))),
        "HOTSEAT_SUBJECT_PREFIX": prefix,
        "HOTSEAT_KEY_PREFIX": prefix,
        "HOTSEAT_AUDIT_STREAM": f"{prefix}_AUDIT",
    }


def up_argv(config: Path, router_port: int, *more: str) -> list[str]:
    """``hotseat up`` with every service on a free port of its own (the fixed defaults
    are for one stack per machine; tests run many)."""
    return [find_binary("hotseat"), "up", "--config", str(config), "--port", str(router_port),
            "--controller-port", "0", "--audit-port", "0", *more]  # fmt: skip


def sim_ports() -> dict[str, int]:
    return {name: free_port() for name in ("a", "b", "embed")}


def assert_services_as_installed(up: Up, parts: dict[str, str]) -> None:
    for name, module in SERVICES.items():
        if installed(module):
            assert parts[name].startswith("http://127.0.0.1:"), up.output
            assert httpx.get(parts[name] + "/readyz", timeout=5).status_code == 200
        else:
            assert name not in parts
            assert f"skipping {name}" in up.output


def test_up_launches_private_infra_serves_and_stops_cleanly(tmp_path: Path, prefix: str) -> None:
    """With no NATS/Redis reachable, up launches its own; curl and SDK answer; SIGINT stops all."""
    ports = sim_ports()
    config = write_config(tmp_path / "hotseat.yaml", ports)
    closed = free_port()
    router_port = free_port()
    env = stack_env(prefix, f"nats://127.0.0.1:{closed}", f"redis://127.0.0.1:{closed}/0")
    up = Up.start(up_argv(config, router_port), env)
    children: set[int] = set()
    try:
        parts = up.wait_ready()
        assert parts["nats"].startswith("nats://127.0.0.1:")
        assert parts["redis"].startswith("redis://127.0.0.1:")
        assert str(closed) not in parts["nats"] + parts["redis"]
        assert nats_reachable(parts["nats"])
        assert redis_reachable(parts["redis"])
        for name, port in ports.items():
            assert parts[f"sim-{name}"] == f"http://127.0.0.1:{port}"
        assert_services_as_installed(up, parts)
        if "router" in parts:
            assert parts["router"] == f"http://127.0.0.1:{router_port}"
        sim = "http://127.0.0.1:{}".format
        assert httpx.get(sim(ports["embed"]) + "/health").status_code == 200  # unpooled: loaded
        assert httpx.get(sim(ports["b"]) + "/control/state").json()["state"] == "unloaded"

        children = descendants(up.popen.pid)
        assert len(children) >= 5, children  # nats, redis, three sims (+ services)

        reply = run_json(up.example("curl"))
        assert reply["object"] == "chat.completion"
        assert reply["usage"]["completion_tokens"] == 16
        assert reply["choices"][0]["message"]["content"]
        sdk = subprocess.run(
            up.example("python"), capture_output=True, text=True, timeout=60, check=False
        )
        assert sdk.returncode == 0, sdk.stderr
        assert sdk.stdout.strip()

        code, _elapsed = up.signal_and_wait(signal.SIGINT, timeout=4 * STOP_BUDGET_S)
        left = [pid for pid in children if not gone(pid)]  # before the cleanup below
    finally:
        up.kill_tree(children)
    assert code == 0, up.output
    # Every part stopped on its SIGTERM: up kills what is left at its stop budget, and
    # says so (an event, where the elapsed time would measure the machine's load).
    assert "did not stop on SIGTERM" not in up.output, up.output
    assert "hotseat up: stopped" in up.output
    assert left == [], up.output
    assert not nats_reachable(parts["nats"])
    assert not redis_reachable(parts["redis"])
    with pytest.raises(httpx.ConnectError):
        httpx.get(sim(ports["a"]) + "/health", timeout=2)


def test_up_reuses_running_infra_and_leaves_it_on_sigterm(
    tmp_path: Path, prefix: str, nats_server: Managed, redis_server: Managed
) -> None:
    """NATS and Redis that answer are reused, not restarted, and survive the stack's SIGTERM."""
    config = write_config(tmp_path / "hotseat.yaml", sim_ports())
    env = stack_env(prefix, nats_server.url, redis_server.url)
    up = Up.start(up_argv(config, free_port()), env)
    children: set[int] = set()
    try:
        parts = up.wait_ready()
        assert parts["nats"] == nats_server.url
        assert parts["redis"] == redis_server.url
        assert f"reusing NATS at {nats_server.url}" in up.output
        assert f"reusing Redis at {redis_server.url}" in up.output
        assert_services_as_installed(up, parts)
        children = descendants(up.popen.pid)
        assert nats_server.pid not in children
        code, _elapsed = up.signal_and_wait(signal.SIGTERM, timeout=4 * STOP_BUDGET_S)
        left = [pid for pid in children if not gone(pid)]  # before the cleanup below
    finally:
        up.kill_tree(children)
    assert code == 0, up.output
    # Every part stopped on its SIGTERM: up kills what is left at its stop budget, and
    # says so (an event, where the elapsed time would measure the machine's load).
    assert "did not stop on SIGTERM" not in up.output, up.output
    assert left == [], up.output
    assert nats_server.alive()
    assert redis_server.alive()
    assert nats_reachable(nats_server.url)


def test_up_without_services_targets_a_sim_directly(
    tmp_path: Path, prefix: str, nats_server: Managed, redis_server: Managed
) -> None:
    """With no service installed, up loads the pool's default member and the curl hits the sim."""
    ports = sim_ports()
    config = write_config(tmp_path / "hotseat.yaml", ports)
    program = (
        "import sys; from pathlib import Path; from hotseat.up import run_up; "
        f"sys.exit(run_up(config_path=Path({str(config)!r}), ports={{'router': 1}}, "
        "available=lambda module: False))"
    )
    up = Up.start(
        [sys.executable, "-c", program], stack_env(prefix, nats_server.url, redis_server.url)
    )
    children: set[int] = set()
    try:
        parts = up.wait_ready()
        assert not {"router", "controller", "audit"} & parts.keys()
        for name in SERVICES:
            assert f"skipping {name}" in up.output
        assert "no controller; loading gpu0/a directly" in up.output
        curl = up.example("curl")
        assert any(f"127.0.0.1:{ports['embed']}/v1" in word for word in curl), curl
        reply = run_json(curl)
        assert reply["usage"]["completion_tokens"] == 16
        state = httpx.get(f"http://127.0.0.1:{ports['a']}/control/state").json()
        assert state["state"] == "ready"
        children = descendants(up.popen.pid)
        code, _ = up.signal_and_wait(signal.SIGINT)
        left = [pid for pid in children if not gone(pid)]  # before the cleanup below
    finally:
        up.kill_tree(children)
    assert code == 0, up.output
    assert left == [], up.output


def test_up_uses_only_the_servers_it_is_given_and_tells_the_other_commands(
    tmp_path: Path, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no HOTSEAT_NATS_URL / HOTSEAT_REDIS_URL, up launches private NATS and Redis
    even where servers answer on the default ports (their state would mix with this
    stack's); "ready" comes only once the pool's default member is resident (an 8 s load),
    after progress lines while it loads; ``hotseat status`` and ``hotseat audit`` find
    the controller and audit through the recorded URLs, with no flag; the record is gone
    after the stop."""
    for name in ("HOTSEAT_NATS_URL", "HOTSEAT_REDIS_URL", "HOTSEAT_CONTROLLER_URL",
                 "HOTSEAT_AUDIT_URL"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    config = write_config(tmp_path / "hotseat.yaml", sim_ports(), load_a_s=8)
    env = own_names(prefix)
    children: set[int] = set()
    state = Path(env["HOTSEAT_STATE_DIR"]) / "up.json"
    # The commands' default ports taken (by these sockets, or already by someone else): the
    # commands can find the controller and audit only through what up records.
    with _held(8090), _held(8082):
        up = Up.start(up_argv(config, free_port()), env)
        try:
            parts = up.wait_ready()
        except BaseException:
            up.kill_tree()
            raise
    try:
        children = descendants(up.popen.pid)
        assert "reusing" not in up.output
        assert not parts["nats"].endswith(":4222"), "attached to a NATS it was not given"
        assert ":6379" not in parts["redis"], "attached to a Redis it was not given"
        assert any(_runs(pid, b"nats-server") for pid in children), "no private NATS"
        assert any(_runs(pid, b"redis-server") for pid in children), "no private Redis"
        assert state.is_file()
        if "controller" in parts:
            assert not parts["controller"].endswith(":8090"), up.output
            ready = up.lines.index(next(line for line in up.lines if line.startswith(READY)))
            loading = [n for n, line in enumerate(up.lines) if line.startswith(LOADING_A)]
            warm = [n for n, line in enumerate(up.lines) if line.startswith(WARM_A)]
            # The first line as the load starts, another while it runs (8 s, longer than
            # up's progress interval), then the warm one, all before "ready".
            assert len(loading) >= 2, up.output
            assert loading[-1] < warm[0] < ready, up.output
            assert "s of ~8s)" in up.lines[loading[-1]], up.output
            pool = httpx.get(f"{parts['controller']}/v1/pools/gpu0", timeout=5).json()
            assert (pool["phase"], pool["resident"]) == ("idle", "a"), up.output
            assert parts["console"] == f"{parts['controller']}/ui", up.output
            console = httpx.get(parts["console"], timeout=5)
            assert console.status_code == 200
            assert "/ui/assets/console.js" in console.text
            status = _hotseat("status", env=env)
            assert status.returncode == 0, status.stderr
            assert status.stdout.splitlines()[1].split()[:3] == ["gpu0", "a", "idle"]
        if "audit" in parts:
            audit = _hotseat("audit", "query", "--limit", "1", env=env)
            assert audit.returncode == 0, audit.stderr
        code, _ = up.signal_and_wait(signal.SIGTERM)
    finally:
        up.kill_tree(children)
    assert code == 0, up.output
    assert not state.exists(), "the record of a stopped stack was left behind"


LOADING_A = "hotseat up: gpu0: loading a ("
WARM_A = "hotseat up: gpu0: a resident"


def _hotseat(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [find_binary("hotseat"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **env},
    )


@contextlib.contextmanager
def _held(port: int) -> Iterator[None]:
    """Listen on ``port`` for the block, if it is free (else someone else holds it)."""
    with socket.socket() as sock:
        with contextlib.suppress(OSError):
            sock.bind(("127.0.0.1", port))
            sock.listen()
        yield


def _runs(pid: int, binary: bytes) -> bool:
    try:
        return binary in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def run_to_exit(argv: list[str], env: dict[str, str]) -> tuple[int, Up]:
    """Run an up that is expected to give up by itself: its exit code, and its output
    up to its last line ("stopped in ...")."""
    up = Up.start(argv, env)
    try:
        code = up.popen.wait(60)
        up.wait_for(lambda line: "stopped in" in line, timeout=10)
    finally:
        up.kill_tree()
    return code, up


def test_a_services_port_in_use_stops_up_before_it_starts_anything(
    tmp_path: Path, prefix: str
) -> None:
    """The services' ports are fixed: one in use is not swapped for another behind the
    user's back (the commands would not find it); up exits 1 naming the port and the flag
    that moves it, with nothing started."""
    config = write_config(tmp_path / "hotseat.yaml", sim_ports())
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        argv = [find_binary("hotseat"), "up", "--config", str(config), "--port", str(free_port()),
                "--controller-port", str(port), "--audit-port", "0"]  # fmt: skip
        code, up = run_to_exit(argv, own_names(prefix))
    assert code == 1, up.output
    assert f"port {port} for the controller is already in use" in up.output
    assert "--controller-port" in up.output
    assert not up.parts(), up.output  # no NATS, Redis or sim was started


def test_up_rejects_an_invalid_config(tmp_path: Path) -> None:
    """An invalid config is reported with its paths and up exits 1 without starting anything."""
    broken = tmp_path / "broken.yaml"
    broken.write_text("rules: [{name: r, route: {backends: [nope], poolActivation: ifidle}}]\n")
    done = subprocess.run(
        [find_binary("hotseat"), "up", "--config", str(broken)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "rules[0].route.poolActivation" in done.stdout
    assert "hotseat up: stopping" not in done.stdout


def test_a_bad_free_port_range_stops_up_with_what_is_expected(tmp_path: Path, prefix: str) -> None:
    """``HOTSEAT_FREE_PORTS`` that is not a range of ports stops up before it starts
    anything, saying what the variable must hold."""
    config = write_config(tmp_path / "hotseat.yaml", sim_ports())
    argv = [find_binary("hotseat"), "up", "--config", str(config), "--port", "0",
            "--controller-port", "0", "--audit-port", "0"]  # fmt: skip
    code, up = run_to_exit(argv, {**own_names(prefix), FREE_PORTS_ENV: "9000-8000"})
    assert code == 1, up.output
    assert f"failed to start: {FREE_PORTS_ENV} must be LOW-HIGH" in up.output
    assert "'9000-8000'" in up.output
    assert not up.parts(), up.output
