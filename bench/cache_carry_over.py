"""Prompt-cache carry-over across swaps (docs/adr/0007): what it changes, measured.

A chat workload alternates two members of one pool, each with its own growing
conversation: every turn swaps the other member back (an admin swap, timed until the
member is resident), then sends its conversation plus a new user message and measures the
time to the first streamed token and what the server evaluated (``timings.prompt_n``).
Once with ``cache.carryOver`` on both members, once without.

1. ``sim``: sim members with a prefill cost per token taken from a published llama.cpp
   figure: LLaMA 7B Q4_0 prompt processing on an Apple M2 Ultra, pp512 = 1164.00 tokens/s
   (ggml-org/llama.cpp pull request #3084, "Metal: PP speedup", table "M2 Ultra results").
   A constant rate is generous to the run without carry-over: llama.cpp's prompt
   processing slows as the context grows. Saved slots are sized like the KV cache of an
   8B model with grouped-query attention in F16 (128 KiB per token) and written and read
   at ``--io-gbps``. Conversations end at ``--conversation`` tokens (20,000 by default).
2. ``llama``: real ``llama-server`` members (the tiny generated models,
   ``scripts/llama/prepare.py``): tokens evaluated per request after each swap back, and
   the tokens that were new since the previous turn of that conversation.

Also printed: the time the save added to the unloads (against ``saveTimeout``) and the
restore to the loads, from the controller's ``hotseat_pool_cache_duration_seconds``.

Run: ``.venv/bin/python bench/cache_carry_over.py`` (``--part sim|llama``, ``--quick``).
Everything runs on loopback with private servers; nothing is left running.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from hotseat.launcher import (
    Managed,
    ProcessGroup,
    free_port,
    start_nats,
    start_redis,
    start_service,
)

ROOT = Path(__file__).resolve().parents[1]
POOL = "gpu0"
PREFILL_TOKENS_PER_SECOND = 1164.0
"""llama.cpp #3084, M2 Ultra, LLaMA 7B Q4_0, pp512 (tokens/s)."""
KV_BYTES_PER_TOKEN = 128 * 1024
"""An 8B model with grouped-query attention, F16 cache: 32 layers x 8 KV heads x 128 x 2 x 2."""
ADMIN_TOKEN = "bench-admin"  # noqa: S105 - a private stack on loopback, gone after the run
REPLY_TOKENS = 16


@dataclass
class Turn:
    mode: str
    member: str
    turn: int
    swap_s: float | None
    """Admin swap back until resident (None: the member was resident already)."""
    ttft_s: float
    prompt_n: int
    cache_n: int
    predicted_n: int
    new_tokens: int | None = None
    save_s: float = 0.0
    restore_s: float = 0.0


@dataclass
class Conversation:
    messages: list[dict[str, str]] = field(default_factory=list)
    seen: int | None = None
    """Tokens the member held after the previous turn (its prompt and reply)."""


# --- the stack ------------------------------------------------------------------------


class Bench:
    """NATS, Redis, a controller and a router around ``config``'s members."""

    def __init__(self, work: Path, config: dict[str, Any], *, sims: bool) -> None:
        self.work = work
        self.group = ProcessGroup()
        self.config = config
        self.sims = sims
        self.controller: Managed
        self.router: Managed

    def start(self) -> None:
        nats_proc = self.group.add(start_nats(self.work / "nats"))
        redis_proc = self.group.add(start_redis(self.work / "redis"))
        path = self.work / "hotseat.yaml"
        path.write_text(yaml.safe_dump(self.config))
        env = {
            "HOTSEAT_NATS_URL": nats_proc.url,
            "HOTSEAT_REDIS_URL": redis_proc.url,
            "HOTSEAT_SUBJECT_PREFIX": "bench",
            "HOTSEAT_KEY_PREFIX": "bench",
            "HOTSEAT_CONFIG": str(path),
            "HOTSEAT_LOG_LEVEL": "warning",
            "HOTSEAT_ADMIN_TOKEN": ADMIN_TOKEN,
        }
        if self.sims:
            for backend in self.config["backends"]:
                port = int(backend["address"].rsplit(":", 1)[1])
                self.group.add(
                    start_service(
                        f"sim-{backend['name']}",
                        "hotseat-sim",
                        ["--backend", backend["name"]],
                        port=port,
                        log_dir=self.work,
                        env=env,
                        ready_path="/control/state",
                    )
                )
        self.controller = self.group.add(
            start_service(
                "controller", "hotseat-controller", [], port=free_port(), log_dir=self.work, env=env
            )
        )
        self.router = self.group.add(
            start_service(
                "router", "hotseat-router", [], port=free_port(), log_dir=self.work, env=env
            )
        )

    def stop(self) -> None:
        self.group.stop_all()

    async def resident(self, http: httpx.AsyncClient, member: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while True:
            pool = (await http.get(f"{self.controller.url}/v1/pools/{POOL}")).json()
            if pool["resident"] == member and pool["swapping"] is None and pool["phase"] == "idle":
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{member} not resident after {timeout}s: {pool}")
            await asyncio.sleep(0.02)  # the controller announces swaps on NATS, not here

    async def swap_to(self, http: httpx.AsyncClient, member: str) -> float:
        began = time.perf_counter()
        answer = await http.post(
            f"{self.controller.url}/v1/pools/{POOL}/swap",
            json={"member": member},
            headers={"authorization": f"Bearer {ADMIN_TOKEN}"},
        )
        answer.raise_for_status()
        await self.resident(http, member)
        return time.perf_counter() - began

    async def cache_seconds(self, http: httpx.AsyncClient) -> dict[str, float]:
        """Seconds spent saving and restoring so far (the controller's histogram sums)."""
        text = (await http.get(f"{self.controller.url}/metrics")).text
        spent = {"save": 0.0, "restore": 0.0}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "hotseat_pool_cache_duration_seconds_sum":
                    spent[sample.labels["action"]] += sample.value
        return spent

    async def ask(
        self, http: httpx.AsyncClient, model: str, messages: list[dict[str, str]], **extra: Any
    ) -> tuple[float, str, dict[str, Any]]:
        """Stream one chat request: (time to the first content token, reply, timings)."""
        body = {
            "model": model,
            "messages": messages,
            "max_tokens": REPLY_TOKENS,
            "stream": True,
            "temperature": 0,
            **extra,
        }
        began = time.perf_counter()
        first: float | None = None
        reply: list[str] = []
        timings: dict[str, Any] = {}
        url = f"{self.router.url}/v1/chat/completions"
        async with http.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                raise RuntimeError(
                    f"{model}: HTTP {response.status_code} {await response.aread()!r}"
                )
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                timings = chunk.get("timings") or timings
                for choice in chunk.get("choices", []):
                    if text := (choice.get("delta") or {}).get("content"):
                        first = first or time.perf_counter()
                        reply.append(text)
        return (first or time.perf_counter()) - began, "".join(reply), timings


async def alternate(
    bench: Bench,
    mode: str,
    turns: int,
    opening: dict[str, str],
    message: str,
    *,
    stay: bool = False,
    **extra: Any,
) -> list[Turn]:
    """Turns of two conversations, one per member, each turn swapping its member back;
    ``stay``: all the turns of one member, then of the other (no swap between turns: what
    a member that never leaves the GPU evaluates)."""
    members = list(opening)
    talks = {m: Conversation([{"role": "user", "content": opening[m]}]) for m in members}
    order = (
        [(m, t) for m in members for t in range(turns + 1)]
        if stay
        else [(m, t) for t in range(turns + 1) for m in members]
    )
    rows: list[Turn] = []
    resident = members[0]
    async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=5), trust_env=False) as http:
        await bench.resident(http, resident)
        for member, turn in order:
            talk = talks[member]
            before = await bench.cache_seconds(http)
            swap = None if member == resident else await bench.swap_to(http, member)
            resident = member
            after = await bench.cache_seconds(http)
            ttft, reply, timings = await bench.ask(http, member, talk.messages, **extra)
            prompt_n, cache_n = int(timings["prompt_n"]), int(timings["cache_n"])
            predicted_n = int(timings.get("predicted_n", REPLY_TOKENS))
            rows.append(
                Turn(
                    mode,
                    member,
                    turn,
                    swap,
                    ttft,
                    prompt_n,
                    cache_n,
                    predicted_n,
                    new_tokens=None if talk.seen is None else prompt_n + cache_n - talk.seen,
                    save_s=after["save"] - before["save"],
                    restore_s=after["restore"] - before["restore"],
                )
            )
            talk.seen = prompt_n + cache_n + predicted_n
            talk.messages += [
                {"role": "assistant", "content": reply},
                {"role": "user", "content": f"{message} (turn {turn + 1})"},
            ]
            print(
                f"  {mode:<6} {member:<5} turn {turn}  prompt {prompt_n + cache_n:>6}  "
                f"evaluated {prompt_n:>6}  swap {fmt(swap)}  ttft {ttft:7.3f}s",
                flush=True,
            )
    return rows


def fmt(value: float | None) -> str:
    return "   -   " if value is None else f"{value:6.3f}s"


# --- part 1: sims with a published prefill cost ------------------------------------------


def sim_config(work: Path, carry: bool, args: argparse.Namespace) -> dict[str, Any]:
    names = ("alice", "bob")
    sim = {
        "loadSeconds": args.load_seconds,
        "unloadSeconds": 0.2,
        "memoryGiB": 20,
        "tokensPerSecond": 50,
        "slots": 1,
        "prefillTokensPerSecond": PREFILL_TOKENS_PER_SECOND,
        "cacheBytesPerToken": KV_BYTES_PER_TOKEN,
        "cacheIoBytesPerSecond": args.io_gbps * 1e9,
    }
    members = []
    for name in names:
        member: dict[str, Any] = {"name": name, "sim": sim}
        if carry:
            member["cache"] = {
                "carryOver": True,
                "dir": str(work / "slots" / name),
                "saveTimeout": "30s",
            }
        members.append(member)
    return {
        "router": {"name": "bench", "requestTimeout": "30m"},
        "backends": [
            {
                "name": n,
                "address": f"http://127.0.0.1:{free_port()}",
                "timeout": "20m",
                "pool": {"name": POOL, "member": n},
            }
            for n in names
        ],
        "pools": [
            {
                "name": POOL,
                "default": names[0],
                "swapBudget": "20m",
                "swapTimeout": "20m",
                "driver": {"kind": "sim", "gpuMemoryGiB": 24},
                "members": members,
            }
        ],
        "rules": [{"name": n, "match": {"models": [n]}, "route": {"backends": [n]}} for n in names],
    }


async def sim_part(args: argparse.Namespace) -> list[Turn]:
    turn_words = args.turn_tokens
    opening_words = args.conversation - args.turns * (turn_words + REPLY_TOKENS + 2)
    print(
        f"== sim: prefill {PREFILL_TOKENS_PER_SECOND:g} tokens/s (llama.cpp #3084, M2 Ultra, "
        f"LLaMA 7B Q4_0 pp512), load {args.load_seconds:g}s, slot files "
        f"{KV_BYTES_PER_TOKEN // 1024} KiB/token at {args.io_gbps:g} GB/s; conversations from "
        f"{opening_words} to about {args.conversation} tokens, {args.turns} turns each"
    )
    opening = {m: " ".join(f"{m}{i}" for i in range(opening_words)) for m in ("alice", "bob")}
    message = " ".join(["and what about this part of it"] * (turn_words // 7))
    rows: list[Turn] = []
    for carry in (True, False):
        work = Path(tempfile.mkdtemp(prefix="hotseat-bench-cache-"))
        bench = Bench(work, sim_config(work, carry, args), sims=True)
        try:
            bench.start()
            rows += await alternate(bench, "on" if carry else "off", args.turns, opening, message)
        finally:
            bench.stop()
    return rows


# --- part 2: real llama-server -----------------------------------------------------------


def prepared() -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "llama" / "prepare.py"), "--json"],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def llama_config(work: Path, carry: bool, llama: dict[str, Any]) -> dict[str, Any]:
    members = {"small": "tiny-small", "large": "tiny-large"}
    ports = {name: free_port() for name in members}
    pool_members = []
    for name, model in members.items():
        command = [
            llama["server"],
            "-m",
            llama["models"][model],
            "--alias",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            str(ports[name]),
            "-c",
            "4096",
            "-np",
            "1",
            "-t",
            "1",
        ]
        member: dict[str, Any] = {"name": name, "process": {"command": command}}
        if carry:
            member["cache"] = {"carryOver": True}
        pool_members.append(member)
    return {
        "router": {"name": "bench", "requestTimeout": "10m"},
        "backends": [
            {
                "name": n,
                "address": f"http://127.0.0.1:{p}",
                "timeout": "5m",
                "pool": {"name": POOL, "member": n},
            }
            for n, p in ports.items()
        ],
        "pools": [
            {
                "name": POOL,
                "default": "small",
                "swapBudget": "5m",
                "swapTimeout": "5m",
                "busySignal": "leasesAndSlots",
                "driver": {
                    "kind": "process",
                    "stopGracePeriod": "5s",
                    "readyTimeout": "2m",
                    "dataDir": str(work / "members"),
                },
                "members": pool_members,
            }
        ],
        "rules": [
            {"name": n, "match": {"models": [n]}, "route": {"backends": [n]}} for n in members
        ],
    }


async def llama_part(args: argparse.Namespace) -> list[Turn]:
    llama = prepared()
    sentence = "the hot seat model takes turns on one gpu while others wait for it"
    opening = {
        m: " ".join([f"{m} reads this:", *[sentence] * args.llama_sentences])
        for m in ("small", "large")
    }
    print(
        f"== llama-server {llama['version']}: tiny-small and tiny-large, one slot of 4096 "
        f"tokens each, opening prompt of {args.llama_sentences} sentences, "
        f"{args.turns} turns"
    )
    rows: list[Turn] = []
    for mode in ("on", "off", "stay"):
        work = Path(tempfile.mkdtemp(prefix="hotseat-bench-cache-"))
        bench = Bench(work, llama_config(work, mode == "on", llama), sims=False)
        try:
            bench.start()
            rows += await alternate(
                bench,
                mode,
                args.turns,
                opening,
                "tell me more about how the pool swaps its members",
                stay=mode == "stay",
                ignore_eos=True,
            )
        finally:
            bench.stop()
    return rows


# --- summaries -----------------------------------------------------------------------------


def swapped_back(rows: list[Turn], mode: str) -> list[Turn]:
    return [r for r in rows if r.mode == mode and r.turn > 0]


def summary_sim(rows: list[Turn], args: argparse.Namespace) -> None:
    print("\n== sim: after each swap back")
    print(
        "| turn | member | conversation (tokens) | swap back on | swap back off | "
        "TTFT on | TTFT off | TTFT ratio | evaluated on | evaluated off |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    on, off = swapped_back(rows, "on"), swapped_back(rows, "off")
    for a, b in zip(on, off, strict=True):
        print(
            f"| {a.turn} | {a.member} | {a.prompt_n + a.cache_n:,} | {a.swap_s:.2f} s | "
            f"{b.swap_s:.2f} s | {a.ttft_s:.3f} s | {b.ttft_s:.3f} s | "
            f"{b.ttft_s / a.ttft_s:.0f}x | {a.prompt_n} | {b.prompt_n:,} |"
        )
    last_on, last_off = on[-2:], off[-2:]
    ttft_on = statistics.median(r.ttft_s for r in last_on)
    ttft_off = statistics.median(r.ttft_s for r in last_off)
    e2e_on = statistics.median((r.swap_s or 0) + r.ttft_s for r in last_on)
    e2e_off = statistics.median((r.swap_s or 0) + r.ttft_s for r in last_off)
    size = statistics.median(r.prompt_n + r.cache_n for r in last_on)
    print(
        f"\nlast turn (conversations of about {size:,.0f} tokens): time to first token after "
        f"the swap back {ttft_on:.3f} s with carry-over, {ttft_off:.3f} s without: "
        f"{ttft_off / ttft_on:.0f}x shorter (target: at least 10x)"
    )
    print(
        f"swap back plus time to first token: {e2e_on:.2f} s with, {e2e_off:.2f} s without "
        f"({e2e_off / e2e_on:.1f}x; the load of {args.load_seconds:g} s is in both)"
    )
    saves = [r.save_s for r in on]
    restores = [r.restore_s for r in on]
    print(
        f"save added to an unload: median {statistics.median(saves):.2f} s, max "
        f"{max(saves):.2f} s (saveTimeout 30s); restore added to a load: median "
        f"{statistics.median(restores):.2f} s, max {max(restores):.2f} s"
    )


def summary_llama(rows: list[Turn]) -> None:
    print("\n== llama-server: tokens evaluated per request after a swap back")
    print(
        "| turn | member | prompt (tokens) | new since its last turn | evaluated, carry-over | "
        "evaluated, no carry-over | evaluated, never swapped | save ms | restore ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    on, off = swapped_back(rows, "on"), swapped_back(rows, "off")
    stay = {(r.member, r.turn): r for r in swapped_back(rows, "stay")}
    for a, b in zip(on, off, strict=True):
        c = stay[(a.member, a.turn)]
        print(
            f"| {a.turn} | {a.member} | {a.prompt_n + a.cache_n} | {a.new_tokens} | "
            f"{a.prompt_n} | {b.prompt_n} | {c.prompt_n} | {a.save_s * 1000:.0f} | "
            f"{a.restore_s * 1000:.0f} |"
        )
    beyond_new = max(a.prompt_n - (a.new_tokens or 0) for a in on)
    beyond_stay = max(a.prompt_n - stay[(a.member, a.turn)].prompt_n for a in on)
    print(
        f"\nwith carry-over: evaluated at most {beyond_new} tokens more than the new ones, and "
        f"at most {beyond_stay} more than a member that never left (target: a handful)"
    )
    print(
        f"swap back (admin swap to resident): median "
        f"{statistics.median(r.swap_s or 0 for r in on) * 1000:.0f} ms with carry-over, "
        f"{statistics.median(r.swap_s or 0 for r in off) * 1000:.0f} ms without"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["sim", "llama", "both"], default="both")
    parser.add_argument("--conversation", type=int, default=20000, help="sim: final tokens")
    parser.add_argument("--turns", type=int, default=3, help="swaps back per member")
    parser.add_argument("--turn-tokens", type=int, default=250, help="sim: a user message")
    parser.add_argument("--load-seconds", type=float, default=2.0, help="sim: a member's load")
    parser.add_argument("--io-gbps", type=float, default=2.0, help="sim: slot file speed, GB/s")
    parser.add_argument("--llama-sentences", type=int, default=80, help="llama: opening size")
    parser.add_argument("--quick", action="store_true", help="sim conversations of 4,000 tokens")
    args = parser.parse_args()
    if args.quick:
        args.conversation = 4000
    if args.part in {"sim", "both"}:
        summary_sim(await sim_part(args), args)
    if args.part in {"llama", "both"}:
        summary_llama(await llama_part(args))


if __name__ == "__main__":
    asyncio.run(main())
