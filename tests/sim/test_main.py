"""``hotseat-sim`` as a real process: binds the backend's address, starts loaded on request,
releases its memory on SIGTERM, and refuses bad invocations with exit status 2."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import httpx
import yaml

from hotseat.launcher import Managed, find_binary, free_port, spawn, wait_for_http
from hotseat_common.keys import Keys


def write_config(path: Path, port: int) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "backends": [
                    {
                        "name": "a",
                        "address": f"http://127.0.0.1:{port}",
                        "pool": {"name": "gpu0", "member": "a"},
                    }
                ],
                "pools": [
                    {
                        "name": "gpu0",
                        "driver": {"kind": "sim", "gpuMemoryGiB": 8},
                        "members": [{"name": "a", "sim": {"loadSeconds": 0.05, "memoryGiB": 5}}],
                    }
                ],
                "rules": [{"name": "r", "route": {"backends": ["a"]}}],
            }
        )
    )
    return path


async def test_sim_process_serves_its_backend_address(
    tmp_path: Path, redis_server: Managed, redis, prefix: str
) -> None:
    """The process listens on the backend's port, starts loaded, frees the ledger on SIGTERM."""
    port = free_port()
    config = write_config(tmp_path / "hotseat.yaml", port)
    argv = [
        find_binary("hotseat-sim"),
        "--config", str(config), "--backend", "a", "--loaded", "true",
        "--redis-url", redis_server.url, "--key-prefix", prefix, "--log-format", "console",
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    proc = spawn("sim-a", argv, url=url, log_path=tmp_path / "sim.log")
    try:
        wait_for_http(proc, url + "/readyz", 30)
        async with httpx.AsyncClient(base_url=url, timeout=5) as client:
            health = await client.get("/health")
            assert health.status_code == 200
            assert health.headers["x-sim-member"] == "a"
            assert (await client.get("/control/state")).json()["state"] == "ready"
        assert await redis.hgetall(Keys(prefix).sim_resident("gpu0")) == {"a": "5.0"}
    finally:
        code = proc.stop()
    # uvicorn re-raises the SIGTERM it handled once shutdown is complete
    assert code in {0, -signal.SIGTERM}, proc.log_text()
    assert "Application shutdown complete" in proc.log_text()
    assert await redis.hgetall(Keys(prefix).sim_resident("gpu0")) == {}


def test_bad_invocations_exit_2(tmp_path: Path) -> None:
    """No backend, an unknown backend or an invalid config exit with status 2 and a message."""
    config = write_config(tmp_path / "hotseat.yaml", free_port())
    broken = tmp_path / "broken.yaml"
    broken.write_text("pools: [{name: x}]\n")
    sim = find_binary("hotseat-sim")
    cases = {
        "--backend": [sim, "--config", str(config)],
        "no backend named 'zzz'": [sim, "--config", str(config), "--backend", "zzz"],
        "invalid config": [sim, "--config", str(broken), "--backend", "a"],
    }
    for expected, argv in cases.items():
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        assert done.returncode == 2, (argv, done.stderr)
        assert expected in done.stderr
