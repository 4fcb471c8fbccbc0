"""Measure real llama.cpp members through the ``process`` driver: load, swap, generation.

Runs the prepared ``llama-server`` (``prepare.py``) on the generated models with the same
driver the pool controller uses, on free loopback ports, and prints a Markdown table:

- load: ``driver.load`` from nothing to ``/health`` 200 (process start, model load);
- unload: ``driver.unload`` of an idle member until its process and port are gone;
- swap: unload one member and load the other (what a controller swap spends in the driver);
- generation: tokens per second of one request on one thread (``-t 1``, as in the
  tests), as the server itself reports it.

Usage::

    python scripts/llama/measure.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import build_server
import httpx
import prepare

from hotseat.launcher import free_port
from hotseat_common.config.model import HotseatConfig
from hotseat_common.logging import configure_logging
from hotseat_pool_controller.drivers.process import ProcessDriver

MEMBERS = {"small": "tiny-small", "large": "tiny-large"}


def _config(server: Path, models: dict[str, Path], data_dir: Path) -> HotseatConfig:
    ports = {name: free_port() for name in MEMBERS}
    return HotseatConfig.model_validate({
        "backends": [
            {"name": name, "address": f"http://127.0.0.1:{port}",
             "pool": {"name": "cpu0", "member": name}}
            for name, port in ports.items()
        ],
        "pools": [{
            "name": "cpu0",
            "driver": {"kind": "process", "stopGracePeriod": "5s", "dataDir": str(data_dir)},
            "members": [
                {"name": name, "process": {"command": [
                    str(server), "-m", str(models[model]), "--alias", model,
                    "--host", "127.0.0.1", "--port", str(ports[name]),
                    "-c", "4096", "-np", "2", "-t", "1", "--metrics",
                ]}}
                for name, model in MEMBERS.items()
            ],
        }],
    })  # fmt: skip


async def _timed(action: Callable[[], Awaitable[None]]) -> float:
    began = time.perf_counter()
    await action()
    return time.perf_counter() - began


async def _tokens_per_second(address: str, model: str, tokens: int) -> float:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": "hello world"}],
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    async with httpx.AsyncClient(timeout=120, trust_env=False) as client:
        answer = await client.post(f"{address}/v1/chat/completions", json=body)
        answer.raise_for_status()
        return float(answer.json()["timings"]["predicted_per_second"])


def _row(name: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    return f"| {name} | {statistics.median(ms):.0f} | {ms[0]:.0f} | {ms[-1]:.0f} |"


async def measure(rounds: int) -> str:
    server = build_server.ensure()
    models = prepare.ensure_models()
    with tempfile.TemporaryDirectory(prefix="hotseat-measure-") as tmp:
        config = _config(server, models, Path(tmp))
        pool = config.pools[0]
        driver = ProcessDriver(config, pool)
        times: dict[str, list[float]] = {}
        speed: dict[str, float] = {}
        epoch = 0
        try:
            for name, model in MEMBERS.items():
                for _ in range(rounds):
                    epoch += 1
                    load = await _timed(partial(driver.load, name, epoch=epoch))
                    times.setdefault(f"load {name}", []).append(load)
                    unload = await _timed(partial(driver.unload, name, epoch=epoch))
                    times.setdefault(f"unload {name} (idle)", []).append(unload)
                await driver.load(name, epoch=epoch)
                backend = config.member_backend("cpu0", name)
                assert backend is not None  # noqa: S101 - built above
                speed[name] = await _tokens_per_second(backend.address, model, 1000)
                await driver.unload(name, epoch=epoch)
            await driver.load("small", epoch=epoch)
            for _ in range(rounds):
                for old, new in (("small", "large"), ("large", "small")):
                    epoch += 1

                    async def swap(o: str = old, n: str = new, e: int = epoch) -> None:
                        await driver.unload(o, epoch=e)
                        await driver.load(n, epoch=e)

                    times.setdefault(f"swap {old} -> {new}", []).append(await _timed(swap))
        finally:
            await driver.aclose()
    version = build_server.LLAMA_CPP_PYTHON_VERSION
    lines = [
        f"{rounds} rounds, llama-server of llama-cpp-python {version}, generated models",
        "",
        "| step | median ms | min ms | max ms |",
        "|---|---|---|---|",
        *(_row(name, values) for name, values in times.items()),
        "",
        "| member | generation, tokens/s (1000 tokens, one request) |",
        "|---|---|",
        *(f"| {name} ({MEMBERS[name]}) | {value:.0f} |" for name, value in speed.items()),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    configure_logging("measure", level="warning", fmt="console")
    print(asyncio.run(measure(args.rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
