"""The sim's prompt cache: each slot keeps its last prompt and reply, a request evaluates
only what its slot has not cached (``timings``), and llama.cpp's slot save, restore and
erase carry a slot's cache across an unload."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from hotseat.launcher import free_port
from hotseat_common.config import HotseatConfig, parse_config
from tests.sim.conftest import StartSim
from tests.support.sim import FAST_SIM, SimHandle
from tests.support.waiting import eventually

CHAT = "/v1/chat/completions"
PROMPT = " ".join(f"w{i}" for i in range(300))
BYTES_PER_TOKEN = 1000


def cache_config(tmp_path: Path, *, carry: bool = True, **sim: Any) -> HotseatConfig:
    """Members ``a`` and ``b`` of one sim pool, each with its own slot directory."""
    members = []
    for name in ("a", "b"):
        member: dict[str, Any] = {
            "name": name,
            "sim": {**FAST_SIM, "cacheBytesPerToken": BYTES_PER_TOKEN, **sim},
        }
        if carry:
            member["cache"] = {"carryOver": True, "dir": str(tmp_path / name)}
        members.append(member)
    return parse_config(
        {
            "backends": [
                {
                    "name": name,
                    "address": f"http://127.0.0.1:{free_port()}",
                    "pool": {"name": "gpu0", "member": name},
                }
                for name in ("a", "b")
            ],
            "pools": [{"name": "gpu0", "driver": {"kind": "sim"}, "members": members}],
        }
    )


def messages(*turns: str) -> list[dict[str, str]]:
    roles = ("user", "assistant")
    return [{"role": roles[i % 2], "content": text} for i, text in enumerate(turns)]


async def chat(sim: SimHandle, *turns: str, max_tokens: int = 4) -> dict[str, Any]:
    response = await sim.http.post(
        CHAT, json={"model": "m", "messages": messages(*turns), "max_tokens": max_tokens}
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def reply(body: dict[str, Any]) -> str:
    return str(body["choices"][0]["message"]["content"])


async def slot_action(sim: SimHandle, slot: int, action: str, **body: Any) -> Any:
    return await sim.http.post(f"/slots/{slot}", params={"action": action}, json=body)


async def test_a_request_evaluates_only_what_its_slot_has_not_cached(
    start_sim: StartSim, tmp_path: Path
) -> None:
    """A 300-token prompt evaluates all 300 (at prefillTokensPerSecond); the same
    conversation plus a 3-token turn then evaluates only those 3."""
    config = cache_config(tmp_path, prefillTokensPerSecond=3000, slots=1)
    sim = await start_sim(config, "a", loaded=True)
    first = await chat(sim, PROMPT)
    assert first["timings"]["prompt_n"] == 300
    assert first["timings"]["cache_n"] == 0
    assert first["timings"]["prompt_ms"] >= 300 / 3000 * 1000
    second = await chat(sim, PROMPT, reply(first), "one more turn")
    assert second["timings"]["cache_n"] == 300 + 4  # the prompt and the 4-token reply
    assert second["timings"]["prompt_n"] == 3
    [slot] = (await sim.http.get("/slots")).json()
    assert slot["n_prompt_tokens"] == 300 + 4 + 3 + 4


async def test_a_request_takes_the_slot_that_cached_its_prefix(
    start_sim: StartSim, tmp_path: Path
) -> None:
    """Two conversations in two slots: each next turn goes to the slot holding its own
    conversation, so both evaluate only their new turn."""
    config = cache_config(tmp_path, slots=2)
    sim = await start_sim(config, "a", loaded=True)
    one = await chat(sim, PROMPT)
    two = await chat(sim, "another conversation entirely " * 20)
    again_one = await chat(sim, PROMPT, reply(one), "next")
    again_two = await chat(sim, "another conversation entirely " * 20, reply(two), "next")
    assert again_one["timings"]["prompt_n"] == 1
    assert again_two["timings"]["prompt_n"] == 1


async def test_save_and_restore_carry_a_slot_across_an_unload(
    start_sim: StartSim, tmp_path: Path
) -> None:
    """A saved slot survives an unload and a load (which empty every slot): restored, the
    next turn of its conversation evaluates only the new tokens."""
    config = cache_config(tmp_path, slots=1)
    sim = await start_sim(config, "a", loaded=True)
    first = await chat(sim, PROMPT)
    saved = await slot_action(sim, 0, "save", filename="conversation.bin")
    assert saved.status_code == 200, saved.text
    cached = 300 + 4
    assert saved.json()["n_saved"] == cached
    assert saved.json()["n_written"] == cached * BYTES_PER_TOKEN
    assert (tmp_path / "a" / "conversation.bin").stat().st_size == cached * BYTES_PER_TOKEN

    await sim.unload()
    await sim.wait_for_state("unloaded")
    await sim.load()
    await sim.wait_for_state("ready")
    assert "n_prompt_tokens" not in (await sim.http.get("/slots")).json()[0]
    restored = await slot_action(sim, 0, "restore", filename="conversation.bin")
    assert restored.status_code == 200, restored.text
    assert restored.json()["n_restored"] == cached
    assert restored.json()["n_read"] == cached * BYTES_PER_TOKEN
    after = await chat(sim, PROMPT, reply(first), "a new turn here")
    assert after["timings"]["prompt_n"] == 4
    assert after["timings"]["cache_n"] == cached


async def test_without_a_cache_directory_slot_actions_answer_501(
    start_sim: StartSim, tmp_path: Path
) -> None:
    """A member that does not carry its cache answers 501 like llama-server started
    without --slot-save-path."""
    sim = await start_sim(cache_config(tmp_path, carry=False), "a", loaded=True)
    for action in ("save", "restore", "erase"):
        answer = await slot_action(sim, 0, action, filename="x.bin")
        assert answer.status_code == 501, answer.text
        assert answer.json()["error"]["type"] == "not_supported_error"


async def test_bad_slot_ids_file_names_and_files_are_refused(
    start_sim: StartSim, tmp_path: Path
) -> None:
    """400 for a slot that does not exist, a file name with a directory or '..', a missing
    file, and a file saved by another model (which empties the slot, as llama.cpp does)."""
    config = cache_config(tmp_path, slots=1)
    a = await start_sim(config, "a", loaded=True)
    b = await start_sim(config, "b", loaded=True)
    assert (await slot_action(a, 5, "save", filename="x.bin")).status_code == 400
    for name in ("../x.bin", "sub/x.bin", "a..b", "", "x.bin."):
        assert (await slot_action(a, 0, "save", filename=name)).status_code == 400, name
    assert (await slot_action(a, 0, "restore", filename="missing.bin")).status_code == 400
    assert (await slot_action(a, 0, "dance")).status_code == 400

    await chat(a, PROMPT)
    assert (await slot_action(a, 0, "save", filename="from-a.bin")).status_code == 200
    (tmp_path / "b").mkdir(exist_ok=True)
    (tmp_path / "b" / "from-a.bin").write_bytes((tmp_path / "a" / "from-a.bin").read_bytes())
    await chat(b, "something of its own")
    refused = await slot_action(b, 0, "restore", filename="from-a.bin")
    assert refused.status_code == 400
    assert "invalid slot save file" in refused.json()["error"]["message"]
    assert "n_prompt_tokens" not in (await b.http.get("/slots")).json()[0]


async def test_erase_empties_a_slot(start_sim: StartSim, tmp_path: Path) -> None:
    """Erase answers how many tokens it dropped; the next request evaluates all again."""
    sim = await start_sim(cache_config(tmp_path, slots=1), "a", loaded=True)
    await chat(sim, PROMPT)
    erased = await slot_action(sim, 0, "erase")
    assert erased.json() == {"id_slot": 0, "n_erased": 304}
    assert (await chat(sim, PROMPT))["timings"]["prompt_n"] == 300


async def test_a_save_waits_for_the_request_in_its_slot(
    start_sim: StartSim, tmp_path: Path
) -> None:
    """A save of a slot that is generating is answered only after that request ended, and
    holds the whole conversation it produced (llama.cpp defers the task the same way)."""
    config = cache_config(tmp_path, slots=1, tokensPerSecond=40)
    sim = await start_sim(config, "a", loaded=True)
    request = asyncio.create_task(chat(sim, PROMPT, max_tokens=20))

    async def processing() -> bool:
        return bool((await sim.http.get("/slots")).json()[0]["is_processing"])

    await eventually(processing, interval=0.005)
    saved = await slot_action(sim, 0, "save", filename="late.bin")
    assert request.done()
    assert saved.json()["n_saved"] == 300 + 20
    header = json.loads((tmp_path / "a" / "late.bin").read_bytes().split(b"\n", 1)[0])
    assert len(header["tokens"]) == 320
