"""Prompt caches carried across swaps on real ``llama-server`` members (docs/adr/0007):
real controller and router processes, the process driver, the tiny generated models."""

from __future__ import annotations

import dataclasses
import importlib.util
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.realserver.conftest import ROOT, Llama
from tests.realserver.support import llama_config, port_of, streaming
from tests.support.stack import Stack

pytestmark = pytest.mark.realserver

Make = Callable[[dict[str, Any]], Stack]
POOL = "cpu0"
PROMPT = " ".join(["the hot seat model takes turns on one gpu while others wait"] * 30)
"""About 700 tokens of the tiny models' vocabulary."""
SUFFIX = " and then a short follow up"
HANDFUL = 4


def carrying(llama: Llama, data: Path, **options: Any) -> dict[str, Any]:
    """Pool cpu0 (small the default, large), both carrying their slots over swaps."""
    config = llama_config(llama, data, **options)
    for member in config["pools"][0]["members"]:
        member["cache"] = {"carryOver": True}
    return config


def slot_dir(data: Path, member: str) -> Path:
    return data / POOL / "slots" / member


def member_url(config: dict[str, Any], member: str) -> str:
    return f"http://127.0.0.1:{port_of(config, member)}"


async def started(make_stack: Make, config: dict[str, Any]) -> Stack:
    stack = make_stack(config)
    stack.start_controller("c1")
    stack.start_router()
    await stack.wait_resident("small", pool=POOL, timeout=60)
    return stack


async def complete(stack: Stack, model: str, prompt: str) -> dict[str, Any]:
    """A completion through the router; the answer (with llama.cpp's ``timings``)."""
    body = {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0}
    async with httpx.AsyncClient(timeout=90, trust_env=False) as client:
        response = await client.post(f"{stack.routers[0].url}/v1/completions", json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def tokens(url: str, text: str) -> int:
    async with httpx.AsyncClient(timeout=10, trust_env=False) as client:
        response = await client.post(f"{url}/tokenize", json={"content": text})
    return len(response.json()["tokens"])


async def away_and_back(stack: Stack) -> tuple[dict[str, Any], dict[str, Any]]:
    """The long prompt to small; a request to large (small swapped away); the same prompt
    and a short suffix to small (swapped back). The first and the last answers."""
    first = await complete(stack, "small", PROMPT)
    await stack.wait_resident("small", pool=POOL)
    await complete(stack, "large", "hello")
    await stack.wait_resident("large", pool=POOL)
    back = await complete(stack, "small", PROMPT + SUFFIX)
    return first, back


def swaps_to(events: list[dict[str, Any]], member: str) -> list[dict[str, Any]]:
    return [e for e in events if e["outcome"] == "swap_completed" and e["to_member"] == member]


async def metric(url: str, name: str, **labels: str) -> float:
    async with httpx.AsyncClient(timeout=5, trust_env=False) as client:
        text = (await client.get(f"{url}/metrics")).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


@pytest.mark.parametrize("carry", [True, False], ids=["carry-over", "no-carry-over"])
async def test_after_a_swap_back_only_the_new_suffix_is_evaluated(
    make_stack: Make, llama: Llama, tmp_path: Path, carry: bool
) -> None:
    """A prompt of hundreds of tokens evaluates them all; after a swap away and back, the
    same prompt plus a short suffix evaluates only the suffix (and a handful) with
    carry-over, the whole prompt again without it. With it, the swaps' audit events say
    what was saved and restored, and small's slot directory holds the saved slot."""
    data = tmp_path / "members"
    config = carrying(llama, data) if carry else llama_config(llama, data)
    stack = await started(make_stack, config)
    first, back = await away_and_back(stack)
    print(f"\nprompt_n first {first['timings']['prompt_n']}, after the swap back "
          f"{back['timings']['prompt_n']} (carry-over {'on' if carry else 'off'})")  # fmt: skip

    assert first["timings"]["cache_n"] == 0
    whole = first["timings"]["prompt_n"]
    assert whole > 500
    if not carry:
        assert back["timings"]["cache_n"] == 0
        assert back["timings"]["prompt_n"] > whole
        assert not slot_dir(data, "small").exists()
        return
    suffix = await tokens(member_url(config, "small"), SUFFIX)
    assert back["timings"]["prompt_n"] <= suffix + HANDFUL
    assert back["timings"]["cache_n"] >= whole
    events = await stack.settled_audit()
    [away] = swaps_to(events, "large")
    [home] = swaps_to(events, "small")[-1:]
    assert away["cache_saved_tokens"] >= whole
    assert away["cache_saved_bytes"] > 0
    assert home["cache_restored_tokens"] == away["cache_saved_tokens"]
    assert home["cache_restored_bytes"] == away["cache_saved_bytes"]
    [saved] = slot_dir(data, "small").iterdir()
    assert saved.name.startswith("hotseat-")
    assert saved.name.endswith(".bin")


def _generator() -> ModuleType:
    path = ROOT / "scripts" / "llama" / "tiny_gguf.py"
    spec = importlib.util.spec_from_file_location("tiny_gguf", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("tiny_gguf", module)
    spec.loader.exec_module(module)
    return module


async def test_a_cache_saved_for_another_model_file_is_never_restored(
    make_stack: Make, llama: Llama, tmp_path: Path
) -> None:
    """Small's model file is replaced, while small is away, by another model of the very
    same shapes (other weights): llama-server itself would accept the old save (a copy is
    restored by hand at the end), but the controller restores nothing: the save's key
    names the old file's identity, so it is deleted as stale and the prompt is evaluated
    whole again."""
    data = tmp_path / "members"
    model = tmp_path / "small.gguf"
    shutil.copyfile(llama.models["tiny-small"], model)
    config = carrying(llama, data, model_paths={"small": str(model)})
    stack = await started(make_stack, config)
    first = await complete(stack, "small", PROMPT)
    await complete(stack, "large", "hello")
    await stack.wait_resident("large", pool=POOL)
    [saved] = slot_dir(data, "small").iterdir()
    shutil.copyfile(saved, saved.with_name("control.bin"))
    generator = _generator()
    generator.write_model(dataclasses.replace(generator.SMALL, seed=99), model)

    back = await complete(stack, "small", PROMPT + SUFFIX)
    assert back["timings"]["cache_n"] == 0
    assert back["timings"]["prompt_n"] > first["timings"]["prompt_n"]
    events = await stack.settled_audit()
    [home] = swaps_to(events, "small")[-1:]
    assert home["cache_restored_tokens"] == 0
    assert not saved.exists()
    dropped = "hotseat_pool_cache_files_dropped_total"
    assert await metric(stack.controller_url, dropped, member="small", reason="stale") == 1
    async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
        by_hand = await client.post(
            f"{member_url(config, 'small')}/slots/1",
            params={"action": "restore"},
            json={"filename": "control.bin"},
        )
    assert by_hand.status_code == 200, by_hand.text
    assert by_hand.json()["n_restored"] > 0  # llama-server took another model's cache


@pytest.mark.parametrize("fault", ["directory-gone", "timeout"])
async def test_a_failed_save_does_not_fail_the_swap(
    make_stack: Make, llama: Llama, tmp_path: Path, fault: str
) -> None:
    """Small's save fails (its slot directory removed under the running server) or takes
    longer than its saveTimeout: the failure is counted with its reason, the swap to large
    completes and large serves."""
    data = tmp_path / "members"
    config = carrying(llama, data)
    if fault == "timeout":
        config["pools"][0]["members"][0]["cache"]["saveTimeout"] = "1ms"
    stack = await started(make_stack, config)
    await complete(stack, "small", PROMPT)
    if fault == "directory-gone":
        shutil.rmtree(slot_dir(data, "small"))
    answer = await complete(stack, "large", "hello")
    assert answer["choices"][0]["text"] is not None
    events = await stack.settled_audit()
    assert not [e for e in events if e["outcome"] == "swap_failed"]
    [away] = swaps_to(events, "large")
    assert away["cache_saved_tokens"] == 0
    reason = "error" if fault == "directory-gone" else "timeout"
    failures = "hotseat_pool_cache_failures_total"
    assert await metric(stack.controller_url, failures, member="small", reason=reason) == 1


async def test_a_member_serving_traffic_that_bypassed_the_router_is_not_saved(
    make_stack: Make, llama: Llama, tmp_path: Path
) -> None:
    """A forced admin swap while small's real /slots is busy with a stream that bypassed
    the router: no save is attempted (reason busy), the swap completes all the same."""
    data = tmp_path / "members"
    config = carrying(llama, data, grace="1s")
    stack = await started(make_stack, config)
    await complete(stack, "small", PROMPT)
    admin = {"authorization": f"Bearer {stack.admin_token}"}
    async with (
        streaming(member_url(config, "small"), "small", max_tokens=1900),
        httpx.AsyncClient(timeout=10, trust_env=False) as client,
    ):
        forced = await client.post(
            f"{stack.controller_url}/v1/pools/{POOL}/swap",
            json={"member": "large", "force": True},
            headers=admin,
        )
        assert forced.status_code == 200, forced.text
        await stack.wait_resident("large", pool=POOL, timeout=30)
    failures = "hotseat_pool_cache_failures_total"
    assert await metric(stack.controller_url, failures, member="small", reason="busy") == 1
    assert not list(slot_dir(data, "small").iterdir())
