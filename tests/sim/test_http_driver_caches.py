"""The ``http`` driver carrying a member's prompt cache over its unload and load, against a
real server that stays up and serves llama.cpp's slot API (a sim, driven through its
control URLs): saved before the unload call, restored after the load, keyed by
``cache.modelFile``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hotseat.launcher import free_port
from hotseat_common.config import HotseatConfig, parse_config
from hotseat_pool_controller.drivers.http import HttpDriver
from tests.sim.conftest import StartSim
from tests.support.sim import FAST_SIM, SimHandle

PROMPT = " ".join(f"w{i}" for i in range(200))


def http_pool(tmp_path: Path, model: Path) -> HotseatConfig:
    """One http member whose server (a sim) loads and unloads on its control URLs."""
    url = f"http://127.0.0.1:{free_port()}"
    member = {
        "name": "a",
        "sim": {**FAST_SIM, "slots": 1},
        "http": {
            "loadUrl": f"{url}/control/load",
            "unloadUrl": f"{url}/control/unload",
            "loadedCheck": {"url": f"{url}/control/state", "field": "state", "equals": "ready"},
        },
        "cache": {"carryOver": True, "dir": str(tmp_path / "slots"), "modelFile": str(model)},
    }
    return parse_config(
        {
            "backends": [{"name": "a", "address": url, "pool": {"name": "p", "member": "a"}}],
            "pools": [{"name": "p", "driver": {"kind": "http"}, "members": [member]}],
        }
    )


async def chat(sim: SimHandle, *turns: str) -> dict[str, Any]:
    roles = ("user", "assistant")
    messages = [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)]
    response = await sim.http.post(
        "/v1/chat/completions", json={"model": "m", "messages": messages, "max_tokens": 2}
    )
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def test_the_cache_survives_an_unload_and_load_through_the_http_driver(
    start_sim: StartSim, tmp_path: Path
) -> None:
    """Saved before the unload call, restored after the load: the next turn evaluates only
    its own tokens."""
    model = tmp_path / "model.gguf"
    model.write_bytes(b"weights")
    config = http_pool(tmp_path, model)
    sim = await start_sim(config, "a")
    driver = HttpDriver(config, config.pools[0])
    try:
        await driver.load("a", epoch=1)
        first = await chat(sim, PROMPT)
        saved = await driver.save_caches("a")
        assert (saved.slots, saved.tokens, saved.failures) == (1, 202, ())
        await driver.unload("a", epoch=2)
        await driver.load("a", epoch=3)
        restored = await driver.restore_caches("a")
        assert (restored.slots, restored.tokens) == (1, 202)
        reply = first["choices"][0]["message"]["content"]
        assert (await chat(sim, PROMPT, reply, "next"))["timings"]["prompt_n"] == 1
    finally:
        await driver.aclose()


async def test_nothing_is_restored_once_the_model_file_changed(
    start_sim: StartSim, tmp_path: Path
) -> None:
    """The model file named by cache.modelFile changes while the member is unloaded: its
    old save is deleted as stale and nothing is restored."""
    model = tmp_path / "model.gguf"
    model.write_bytes(b"weights")
    config = http_pool(tmp_path, model)
    sim = await start_sim(config, "a")
    driver = HttpDriver(config, config.pools[0])
    try:
        await driver.load("a", epoch=1)
        await chat(sim, PROMPT)
        assert (await driver.save_caches("a")).tokens == 202
        await driver.unload("a", epoch=2)
        model.write_bytes(b"other weights")
        await driver.load("a", epoch=3)
        restored = await driver.restore_caches("a")
        assert (restored.slots, restored.dropped_stale) == (0, 1)
        assert (await chat(sim, PROMPT, "x", "next"))["timings"]["cache_n"] == 0
        assert not list((tmp_path / "slots").iterdir())
    finally:
        await driver.aclose()


async def test_a_member_that_is_not_loaded_has_nothing_to_save(
    start_sim: StartSim, tmp_path: Path
) -> None:
    """Unloaded (its loaded check fails), the member is not asked for its slots."""
    model = tmp_path / "model.gguf"
    model.write_bytes(b"weights")
    config = http_pool(tmp_path, model)
    await start_sim(config, "a")
    driver = HttpDriver(config, config.pools[0])
    try:
        report = await driver.save_caches("a")
        assert (report.note, report.failures) == ("not running", ())
    finally:
        await driver.aclose()
