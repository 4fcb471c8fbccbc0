"""Prompt caches carried across swaps (docs/adr/0007), end to end with sim members: real
controller and router processes, the sims' llama.cpp slot API, real NATS and Redis."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.stack import Stack, pool_stack_config

Make = Callable[[dict[str, Any]], Stack]
PROMPT = " ".join(f"w{i}" for i in range(400))
REPLY_TOKENS = 4
SUFFIX = "and then a short follow up"


def carrying(tmp_path: Path, **cache: Any) -> dict[str, Any]:
    """Judge (the default) and coder, both carrying their cache over swaps."""
    config = pool_stack_config()
    for member in config["pools"][0]["members"]:
        member["cache"] = {"carryOver": True, "dir": str(tmp_path / member["name"]), **cache}
    return config


async def started(make_stack: Make, config: dict[str, Any]) -> Stack:
    stack = make_stack(config)
    stack.start_sims()
    stack.start_controller("c1")
    stack.start_router()
    await stack.wait_resident("judge")
    return stack


async def ask(stack: Stack, model: str, *turns: str) -> dict[str, Any]:
    roles = ("user", "assistant")
    body = {
        "model": model,
        "messages": [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)],
        "max_tokens": REPLY_TOKENS,
    }
    async with httpx.AsyncClient(timeout=60) as client:
        response = await client.post(f"{stack.routers[0].url}/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def conversation_swapped_away_and_back(stack: Stack) -> dict[str, Any]:
    """A long prompt to judge, a request to coder (swap away), the same conversation plus
    a short turn to judge (swap back): that last answer."""
    first = await ask(stack, "judge", PROMPT)
    assert first["timings"]["prompt_n"] == 400
    await stack.wait_slots_idle("judge")
    await ask(stack, "coder", "something else")
    await stack.wait_slots_idle("coder")
    reply = first["choices"][0]["message"]["content"]
    return await ask(stack, "judge", PROMPT, reply, SUFFIX)


def swaps_to(events: list[dict[str, Any]], member: str) -> list[dict[str, Any]]:
    return [e for e in events if e["outcome"] == "swap_completed" and e["to_member"] == member]


async def metric(url: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples on ``url``/metrics whose labels include ``labels``."""
    async with httpx.AsyncClient(timeout=5) as client:
        text = (await client.get(f"{url}/metrics")).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


async def test_swapped_back_the_conversation_evaluates_only_its_new_turn(
    make_stack: Make, tmp_path: Path
) -> None:
    """With carry-over, judge's slots are saved as it is swapped away and restored as it
    comes back: the next turn evaluates only its own tokens; the swaps' audit events and
    the controller's metrics carry what was saved and restored."""
    stack = await started(make_stack, carrying(tmp_path))
    back = await conversation_swapped_away_and_back(stack)
    cached = 400 + REPLY_TOKENS
    assert back["timings"]["cache_n"] == cached
    assert back["timings"]["prompt_n"] == len(SUFFIX.split())

    events = await stack.settled_audit()
    [away] = swaps_to(events, "coder")
    [home] = swaps_to(events, "judge")[-1:]
    assert away["cache_saved_tokens"] == cached
    assert away["cache_saved_bytes"] == cached * 131072  # the sim's default bytes per token
    assert away["cache_save_ms"] > 0
    assert home["cache_restored_tokens"] == cached
    assert home["cache_restored_bytes"] == cached * 131072
    assert home["cache_restore_ms"] > 0
    controller = stack.controllers["c1"].url
    total = "hotseat_pool_cache_tokens_total"
    assert await metric(controller, total, member="judge", action="save") == cached
    assert await metric(controller, total, member="judge", action="restore") == cached
    assert await metric(controller, "hotseat_pool_cache_failures_total") == 0
    assert [p.name for p in (tmp_path / "judge").iterdir()] != []
    await stack.assert_invariants()


async def test_without_carry_over_the_whole_conversation_is_evaluated_again(
    make_stack: Make,
) -> None:
    """The same conversation without carry-over: after the swap back, the whole prompt is
    evaluated again, and the swap events carry no cache figures."""
    stack = await started(make_stack, pool_stack_config())
    back = await conversation_swapped_away_and_back(stack)
    assert back["timings"]["cache_n"] == 0
    assert back["timings"]["prompt_n"] == 400 + REPLY_TOKENS + len(SUFFIX.split())
    events = await stack.settled_audit()
    assert all("cache_saved_tokens" not in e for e in swaps_to(events, "coder"))
    await stack.assert_invariants()


async def test_a_failed_save_does_not_fail_the_swap(make_stack: Make, tmp_path: Path) -> None:
    """Judge's save directory disappears under it: the save fails (counted, reason error),
    the swap to coder completes and coder serves; back home nothing is restored."""
    stack = await started(make_stack, carrying(tmp_path))
    await ask(stack, "judge", PROMPT)
    await stack.wait_slots_idle("judge")
    shutil.rmtree(tmp_path / "judge")
    answer = await ask(stack, "coder", "something else")
    assert answer["choices"][0]["message"]["content"]
    events = await stack.settled_audit()
    [away] = swaps_to(events, "coder")
    assert away["cache_saved_tokens"] == 0
    assert not [e for e in events if e["outcome"] == "swap_failed"]
    controller = stack.controllers["c1"].url
    failures = "hotseat_pool_cache_failures_total"
    assert await metric(controller, failures, member="judge", action="save", reason="error") == 1
    await stack.assert_invariants()


async def test_a_member_over_its_disk_budget_keeps_nothing_to_restore(
    make_stack: Make, tmp_path: Path
) -> None:
    """A save larger than the member's maxBytes is dropped at once (counted as budget):
    the swap back restores nothing and the whole conversation is evaluated again."""
    stack = await started(make_stack, carrying(tmp_path, maxBytes="10MiB"))
    back = await conversation_swapped_away_and_back(stack)
    assert back["timings"]["cache_n"] == 0
    controller = stack.controllers["c1"].url
    dropped = "hotseat_pool_cache_files_dropped_total"
    assert await metric(controller, dropped, member="judge", reason="budget") == 1
    assert not list((tmp_path / "judge").iterdir())
    await stack.assert_invariants()


async def test_nothing_is_restored_once_the_model_file_changed(
    make_stack: Make, tmp_path: Path
) -> None:
    """Judge's slots are saved under its model file's identity; the file is rewritten
    while judge is away: back home, the old save is deleted (stale), not restored."""
    model = tmp_path / "judge.gguf"
    model.write_bytes(b"GGUF model one")
    config = carrying(tmp_path)
    config["pools"][0]["members"][0]["cache"]["modelFile"] = str(model)
    stack = await started(make_stack, config)
    first = await ask(stack, "judge", PROMPT)
    await stack.wait_slots_idle("judge")
    await ask(stack, "coder", "something else")
    assert len(list((tmp_path / "judge").iterdir())) == 1
    model.write_bytes(b"GGUF model two, another model")
    await stack.wait_slots_idle("coder")
    reply = first["choices"][0]["message"]["content"]
    back = await ask(stack, "judge", PROMPT, reply, SUFFIX)
    assert back["timings"]["cache_n"] == 0
    events = await stack.settled_audit()
    [home] = swaps_to(events, "judge")[-1:]
    assert home["cache_restored_tokens"] == 0
    controller = stack.controllers["c1"].url
    dropped = "hotseat_pool_cache_files_dropped_total"
    assert await metric(controller, dropped, member="judge", reason="stale") == 1
    await stack.assert_invariants()
