"""A capacity pool of real ``llama-server`` members (docs/adr/0008): two tiny models
resident together, each its own process, and a third that evicts the least recently used
idle one while the other keeps its process and serves on."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hotseat.launcher import free_port
from tests.realserver.conftest import Llama
from tests.realserver.support import alive, chat, member_command, pid_of, port_open
from tests.support.stack import Stack
from tests.support.waiting import eventually

pytestmark = pytest.mark.realserver

Make = Callable[[dict[str, Any]], Stack]
POOL = "cpu0"
MODELS = {"a": "tiny-small", "b": "tiny-small", "c": "tiny-large"}
"""Member -> the generated model its server serves (a and b: two servers of one file)."""


def capacity_config(llama: Llama, data_dir: Path) -> dict[str, Any]:
    """Pool ``cpu0`` with room for two members of 1 GiB (declared: the tiny models are far
    smaller; the controller plans with what the config says)."""
    ports = {name: free_port() for name in MODELS}
    return {
        "router": {"name": "r", "requestTimeout": "60s"},
        "backends": [
            {
                "name": name,
                "address": f"http://127.0.0.1:{port}",
                "timeout": "30s",
                "pool": {"name": POOL, "member": name},
            }
            for name, port in ports.items()
        ],
        "pools": [
            {
                "name": POOL,
                "swapBudget": "60s",
                "swapTimeout": "90s",
                "leaseTtl": "3s",
                "capacity": {"gpuMemoryGiB": 2},
                "driver": {
                    "kind": "process",
                    "stopGracePeriod": "2s",
                    "readyTimeout": "60s",
                    "dataDir": str(data_dir),
                },
                "members": [
                    {
                        "name": name,
                        "memoryGiB": 1,
                        "process": {"command": member_command(llama, model, ports[name])},
                    }
                    for name, model in MODELS.items()
                ],
            }
        ],
        "rules": [
            {"name": name, "match": {"models": [name]}, "route": {"backends": [name]}}
            for name in MODELS
        ],
    }


async def residents(stack: Stack) -> set[str]:
    """The residency set once no plan is in flight or due."""

    async def settled() -> set[str] | None:
        state = await stack.pool(POOL)
        done = state["phase"] == "idle" and not state["evicting"] and not state["queue"]
        return set(state["residents"]) if done else None

    result: set[str] = await eventually(settled, timeout=60)
    return result


def port(config: dict[str, Any], member: str) -> int:
    backend = next(b for b in config["backends"] if b["name"] == member)
    return int(backend["address"].rsplit(":", 1)[1])


async def test_two_tiny_models_co_resident_and_a_third_evicts_the_least_recently_used(
    llama: Llama, make_stack: Make, tmp_path: Path
) -> None:
    config = capacity_config(llama, tmp_path / "data")
    stack = make_stack(config)
    stack.start_controller("c1")
    stack.start_router()
    await stack.wait_pool_known(POOL)
    url = stack.routers[0].url
    for member in ("a", "b"):
        response = await chat(url, member, 4)
        assert response.status_code == 200, response.text
    assert await residents(stack) == {"a", "b"}
    pid_a = pid_of(tmp_path / "data", "a")
    pid_b = pid_of(tmp_path / "data", "b")
    assert pid_a is not None
    assert alive(pid_a)
    assert pid_b is not None
    assert alive(pid_b)
    assert (await chat(url, "a", 4)).status_code == 200  # b is the least recently used
    response = await chat(url, "c", 4)
    assert response.status_code == 200, response.text
    assert await residents(stack) == {"a", "c"}, "not the least recently used evicted"
    assert not alive(pid_b), "the least recently used member's server still runs"
    assert not port_open(port(config, "b"))
    assert pid_of(tmp_path / "data", "a") == pid_a, "a was restarted"
    assert alive(pid_a)
    assert (await chat(url, "a", 4)).status_code == 200
