"""``examples/llama.yaml`` under ``hotseat up``: real llama-server members, end to end."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from hotseat.launcher import Managed, find_binary, free_port
from hotseat.up import STOP_BUDGET_S
from hotseat_common.config import load_config
from hotseat_pool_controller.drivers.expansion import expand
from tests.realserver.conftest import Llama
from tests.realserver.support import alive, pid_of, port_open
from tests.up.harness import Up, descendants, gone

pytestmark = [pytest.mark.realserver, pytest.mark.timeout(300)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama.yaml"


def cache_env(llama: Llama) -> dict[str, str]:
    """``HOTSEAT_LLAMA_CACHE`` pointing at where the session's preparation put things."""
    return {"HOTSEAT_LLAMA_CACHE": str(Path(llama.server).parents[2])}


def relocated(document: dict[str, Any], data_dir: Path) -> tuple[dict[str, Any], dict[str, int]]:
    """The example with each member on a free port (address and ``--port``) and its pid
    files and logs under ``data_dir``."""
    ports: dict[str, int] = {}
    for backend in document["backends"]:
        old = backend["address"].rsplit(":", 1)[1]
        ports[backend["name"]] = free_port()
        backend["address"] = f"http://127.0.0.1:{ports[backend['name']]}"
        member = next(m for m in document["pools"][0]["members"] if m["name"] == backend["name"])
        command = member["process"]["command"]
        command[command.index(old)] = str(ports[backend["name"]])
    document["pools"][0]["driver"]["dataDir"] = str(data_dir)
    return document, ports


def test_example_paths_name_the_prepared_binary_and_models(llama: Llama) -> None:
    """The example's ${HOTSEAT_LLAMA_CACHE:-...} paths expand to the binary and models that
    scripts/llama/prepare.py made (the versions in the example are the scripts' versions)."""
    pool = load_config(EXAMPLE).pools[0]
    env = cache_env(llama)
    argv = {m.name: m.process.command for m in pool.members if m.process is not None}
    commands = {name: [expand(a, env).value for a in command] for name, command in argv.items()}
    assert commands["assistant"][0] == llama.server
    assert commands["coder"][0] == llama.server
    assert (
        commands["assistant"][commands["assistant"].index("-m") + 1] == llama.models["tiny-small"]
    )
    assert commands["coder"][commands["coder"].index("-m") + 1] == llama.models["tiny-large"]
    unset = expand(argv["assistant"][0], {}).value
    server = Path(llama.server).relative_to(env["HOTSEAT_LLAMA_CACHE"])
    assert unset == str(Path.home() / ".cache" / "hotseat" / server)


def test_hotseat_up_runs_the_example_with_real_members(
    llama: Llama, tmp_path: Path, prefix: str, nats_server: Managed, redis_server: Managed
) -> None:
    """hotseat up --config examples/llama.yaml: the default member's llama-server warms, a
    request for coder swaps to the other llama-server (the first one gone), the servers'
    own /metrics answer, and SIGINT stops every process, llama-servers included."""
    document, ports = relocated(yaml.safe_load(EXAMPLE.read_text()), tmp_path / "members")
    config = tmp_path / "llama.yaml"
    config.write_text(yaml.safe_dump(document))
    env = {
        **cache_env(llama),
        "HOTSEAT_NATS_URL": nats_server.url,
        "HOTSEAT_REDIS_URL": redis_server.url,
        "HOTSEAT_SUBJECT_PREFIX": prefix,
        "HOTSEAT_KEY_PREFIX": prefix,
        "HOTSEAT_AUDIT_STREAM": f"{prefix}_AUDIT",
        "HOTSEAT_STATE_DIR": str(tmp_path / "state"),
    }
    router_port = free_port()
    argv = [find_binary("hotseat"), "up", "--config", str(config), "--port", str(router_port),
            "--controller-port", "0", "--audit-port", "0"]  # fmt: skip
    up = Up.start(argv, env)
    children: set[int] = set()
    data = tmp_path / "members"
    try:
        parts = up.wait_ready(timeout=120)
        router = parts["router"]
        with httpx.Client(timeout=60, trust_env=False) as client:
            body = {
                "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": 8,
                "temperature": 0,
                "ignore_eos": True,
            }
            first = client.post(
                f"{router}/v1/chat/completions", json={**body, "model": "assistant"}
            )
            assert first.status_code == 200, first.text
            assert first.headers["x-hotseat-backend"] == "assistant"
            assistant_pid = pid_of(data, "assistant")
            assert assistant_pid is not None
            metrics = client.get(f"http://127.0.0.1:{ports['assistant']}/metrics").text
            assert "llamacpp:tokens_predicted_total" in metrics
            second = client.post(f"{router}/v1/chat/completions", json={**body, "model": "coder"})
            assert second.status_code == 200, second.text
            assert second.headers["x-hotseat-backend"] == "coder"
            assert second.json()["usage"]["completion_tokens"] == 8
        assert not alive(assistant_pid)
        assert not port_open(ports["assistant"])
        coder_pid = pid_of(data, "coder")
        assert coder_pid is not None
        children = descendants(up.popen.pid)
        assert coder_pid in children
        code, _elapsed = up.signal_and_wait(signal.SIGINT, timeout=4 * STOP_BUDGET_S)
        left = [pid for pid in children if not gone(pid)]
    finally:
        up.kill_tree(children)
    assert code == 0, up.output
    # Every part stopped on its SIGTERM: up kills what is left at its stop budget, and
    # says so (an event, where the elapsed time would measure the machine's load).
    assert "did not stop on SIGTERM" not in up.output, up.output
    assert left == [], up.output
    assert not port_open(ports["coder"])
