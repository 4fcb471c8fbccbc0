"""The scheduler against recorded-style workloads (docs/adr/0006): each trace replayed
through a real router, controller and sims, once with the pool's defaults (sticky
residency, first come first served) and once with the scheduler's knobs on, printing
swaps per 100 requests, hold times (p50/p99/max, from ``x-hotseat-hold-ms``) per member
or class of request, and what the trace is about.

Traces (sim loads: planner 1 s, coder 2 s, small 0.5 s, large 2 s):

- ``agents``: three agents, each alternating a planner and a coder model every
  ``--turn`` requests (1 and 3), short requests, one at a time per agent. Target: the
  scheduler does not swap more, nor hold longer (p99, mean), than the defaults.
- ``batch``: a batch user keeps three long streams (2 s each) on ``large`` back to back
  while an interactive user sends a short request to ``small`` every 2 s for 40 s (the
  pool's swapBudget is 30 s). Target (issue): with ``maxWait: 5s`` no interactive request
  held longer than ``maxWait`` plus one swap (printed: the measured mean swap to each
  member, unload to ready); the contract's own bound adds the longest batch stream
  running at the close (never cut), which closing early by the measured drain
  (docs/adr/0006) works to remove. The defaults hold it until the batch leaves a gap, or
  answer 503 at the budget.
- ``priority``: bursts of requests for two low priority members and one high priority
  member (priority 5, rule level). Target: the high priority p99 hold at most one swap
  time, and every low priority request completes. One swap time is what PRODUCT.md
  calls a swap in flight, from the start of the incumbent's unload to the target ready
  (a wait for a busy incumbent to drain is not part of it): printed as the mean of
  ``hotseat_pool_swap_duration_seconds`` per member loaded and the longest audited
  swap (``swap_started`` to ``swap_completed``). A swap a low request started is
  retargeted to high while it is still unloading (printed as ``retargeted``); a low
  member found resident serves its own requests of the burst first (never cut).
- ``quiet``: a request now and then, with ``idleUnloadAfter: 3s`` and a default member.
  Target: members are unloaded once idle and the default comes back.

    .venv/bin/python bench/scheduler_trace.py [--trace agents,batch,priority,quiet] [--scale 1]
        [--policies defaults,scheduler]

Where each class's holds went: those whose ``x-hotseat-swap-id`` names a completed swap
that loaded their member are split, by the request's send time, its grant and the audit
trail, into the drain (until the last request of another member granted before that
swap started ended), the swap's start after it, the swap, and the wake (the swap's end
to the grant); and the requests of other members granted after they arrived and before
their swap started are counted (a closed resident admits none). A request that arrived
during its swap counts the swap from its arrival; one whose header names another
member's swap (in its way) is only counted. A request's grant is the controller's
answer that granted its lease, as NATS carried it (:mod:`wire_tap`, a process of its
own beside the controller); a request that asked nothing (its router shared a lease it
held) counts the latest grant on its member that still lived when it ended, or its send
time if that is later. Its hold ends at its dispatch instead, which for a request that
followed another's question comes turns of the router's loop after the grant. The
moments come from four processes (client, tap, router, controller) on one clock: a part
may read a few tens of ms off.

The bursts of the ``priority`` trace are each told apart: the resident when it began,
each member's first question, whether the pool went straight to a swap (which the high
priority question can retarget) or drained the resident's requests first, and why.

A measurement, not a test: counts (swaps, requests) are what noise cannot move; read the
times with the machine's load beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

import fleet as shared  # noqa: E402
import wire_tap  # noqa: E402
from tests.support.audit_trail import event_time, stream_events, urls_flushed  # noqa: E402

from hotseat.launcher import free_port  # noqa: E402
from hotseat_common.subjects import Subjects  # noqa: E402

FAST = shared.FAST_TIMINGS
Wire = wire_tap.Message
RELEASE_SLACK_S = 0.05
"""How much earlier than a client saw its response end the tap may see its lease's
release (the router releases as the body ends, before the client has read it)."""
MEMBERS = {
    "planner": {"loadSeconds": 1.0, "tokensPerSecond": 50, "memoryGiB": 8},
    "coder": {"loadSeconds": 2.0, "tokensPerSecond": 50, "memoryGiB": 20},
    "small": {"loadSeconds": 0.5, "tokensPerSecond": 50, "memoryGiB": 4},
    "large": {"loadSeconds": 2.0, "tokensPerSecond": 50, "memoryGiB": 20},
    "low-a": {"loadSeconds": 1.0, "tokensPerSecond": 50, "memoryGiB": 8},
    "low-b": {"loadSeconds": 1.0, "tokensPerSecond": 50, "memoryGiB": 8},
    "high": {"loadSeconds": 1.0, "tokensPerSecond": 50, "memoryGiB": 8},
}


@dataclass
class Done:
    member: str
    label: str
    status: int
    hold_ms: float
    sent: float
    """Wall clock (Unix seconds), to be read beside the audit trail's times."""
    swap_id: str | None = None
    """The swap it was held for (``x-hotseat-swap-id``), if any."""
    ended: float = 0.0
    """When its response ended (Unix seconds)."""
    request_id: str = ""
    grant: float | None = None
    """When the controller granted the lease it ran on (Unix seconds, :func:`grants`), or
    its arrival for a lease its router held already; ``None``: not seen."""
    lease_granted: float | None = None
    """When the lease it ran on was granted (earlier than :attr:`grant` for a lease its
    router held before it came)."""

    @property
    def granted(self) -> float:
        """Its admission: the controller's grant of its lease, else (not seen) its send time
        and its hold, which also counts its wait for its turn after the grant."""
        return self.grant if self.grant is not None else self.sent + self.hold_ms / 1000


@dataclass
class Run:
    trace: str
    policy: str
    done: list[Done] = field(default_factory=list)
    swaps: int = 0
    swap_reasons: dict[str, int] = field(default_factory=dict)
    retargets: int = 0
    """Swaps that turned to a more urgent member before their load (docs/adr/0006)."""
    swap_s: dict[str, float] = field(default_factory=dict)
    """Mean measured swap (unload to ready) per member loaded, completed swaps only."""
    resident_at_end: str | None = None
    seconds: float = 0.0
    swap_times: dict[str, tuple[float, float, str]] = field(default_factory=dict)
    """swap id -> (started, completed, member loaded), Unix seconds, from the audit
    trail."""
    bursts: list[float] = field(default_factory=list)
    """When each burst of the trace began (Unix seconds), for the traces sent in bursts."""
    wire: list[Wire] = field(default_factory=list)
    """The activation traffic on NATS (:mod:`wire_tap`)."""
    subjects: Subjects = field(default_factory=Subjects)


class Fleet:
    """One pool of sims, a controller and a router on private NATS and Redis."""

    def __init__(self, workdir: Path, infra: shared.Infra) -> None:
        self.workdir, self.infra = workdir, infra
        self.stack: shared.Fleet | None = None
        self.router_url = self.controller_url = self.prefix = ""

    def start(self, members: list[str], pool: dict[str, Any], rules: list[dict[str, Any]]) -> None:
        prefix = "t" + uuid.uuid4().hex[:8]
        ports = {m: free_port() for m in members}
        config = {
            "router": {"name": "bench", "requestTimeout": "120s"},
            "backends": [
                {
                    "name": m,
                    "address": f"http://127.0.0.1:{p}",
                    "pool": {"name": "gpu0", "member": m},
                }
                for m, p in ports.items()
            ],
            "pools": [
                {
                    "name": "gpu0",
                    "swapBudget": "30s",
                    "leaseTtl": "3s",
                    "driver": {"kind": "sim", "gpuMemoryGiB": 24},
                    "members": [
                        {"name": m, "sim": {**MEMBERS[m], "unloadSeconds": 0.1, "slots": 8}}
                        for m in members
                    ],
                    **pool,
                }
            ],
            "rules": rules,
        }
        self.prefix = prefix
        self.stack = shared.Fleet(self.workdir, self.infra, config, prefix=prefix, env=FAST)
        self.stack.start_sims()
        controller = self.stack.start_controller()
        router = self.stack.start_router()
        self.controller_url, self.router_url = controller.url, router.url

    def stop(self) -> None:
        if self.stack is not None:
            self.stack.stop()
            self.stack = None

    async def pool(self) -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=10) as client:
            response = await client.get(f"{self.controller_url}/v1/pools/gpu0")
            result: dict[str, Any] = response.json()
            return result

    async def wait_known(self) -> None:
        while (await self.pool())["phase"] == "unknown":
            await asyncio.sleep(0.1)  # polling a state no event announces

    async def swaps(self) -> tuple[dict[str, int], int, dict[str, float]]:
        """Swaps started, by reason, swaps retargeted before their load, and the mean
        completed swap per member loaded (the controller's metrics)."""
        async with httpx.AsyncClient(timeout=10) as client:
            text = (await client.get(f"{self.controller_url}/metrics")).text
        reasons: dict[str, int] = defaultdict(int)
        retargets = 0
        sums: dict[str, float] = defaultdict(float)
        counts: dict[str, float] = defaultdict(float)
        for line in text.splitlines():
            for suffix, into in (("_sum{", sums), ("_count{", counts)):
                if line.startswith("hotseat_pool_swap_duration_seconds" + suffix) and (
                    'result="completed"' in line
                ):
                    labels, value = line.rsplit(" ", 1)
                    member = labels.split('to_member="', 1)[1].split('"', 1)[0]
                    into[member] += float(value)
            if line.startswith("hotseat_pool_swaps_started_total{"):
                labels, value = line.rsplit(" ", 1)
                reason = labels.split('reason="', 1)[1].split('"', 1)[0]
                reasons[reason] += int(float(value))
            if line.startswith("hotseat_pool_swap_retargets_total{"):
                retargets += int(float(line.rsplit(" ", 1)[1]))
        means = {m: sums[m] / n for m, n in counts.items() if n}
        return dict(reasons), retargets, means

    async def swap_moments(self) -> dict[str, tuple[float, float, str]]:
        """swap id -> (started, completed, member loaded), Unix seconds, of the swaps that
        completed
        (the audit trail, once the controller's and the router's buffers are flushed)."""
        await urls_flushed([self.controller_url, self.router_url])
        events = await stream_events(
            self.infra.nats.url, f"AUDIT_{self.prefix}", f"{self.prefix}.audit.>"
        )
        started = {e["swap_id"]: event_time(e) for e in events if e["outcome"] == "swap_started"}
        return {
            e["swap_id"]: (started[e["swap_id"]], event_time(e), e["to_member"])
            for e in events
            if e["outcome"] == "swap_completed" and e["swap_id"] in started
        }


class Client:
    def __init__(self, url: str, run: Run) -> None:
        self.url = url
        self.run = run
        self.http = httpx.AsyncClient(timeout=120)

    async def request(self, model: str, tokens: int, label: str, **headers: str) -> None:
        request_id = uuid.uuid4().hex
        headers = {**headers, "x-hotseat-request-id": request_id}
        sent = time.time()
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "go"}],
            "max_tokens": tokens,
        }
        response = await self.http.post(
            f"{self.url}/v1/chat/completions", json=body, headers=headers
        )
        hold = float(response.headers.get("x-hotseat-hold-ms", "nan"))
        swap_id = response.headers.get("x-hotseat-swap-id")
        done = Done(
            model, label, response.status_code, hold, sent, swap_id, time.time(), request_id
        )
        self.run.done.append(done)


# --- traces ---------------------------------------------------------------------------


async def agents(client: Client, scale: float, turn: int) -> None:
    async def agent(index: int) -> None:
        await asyncio.sleep(index * 0.3)  # staggered starts, as agents are
        for step in range(round(24 * scale)):
            model = "planner" if (step // turn) % 2 == 0 else "coder"
            await client.request(model, 10, model)

    await asyncio.gather(*(agent(i) for i in range(3)))


async def batch(client: Client, scale: float) -> None:
    stop = asyncio.Event()

    async def batch_worker(offset: float) -> None:
        await asyncio.sleep(offset)
        while not stop.is_set():
            await client.request("large", 100, "batch")  # 2 s at 50 tokens/s

    async def interactive() -> None:
        # A request every 2 s for 40 s of trace, whether or not the last one was served.
        sent: list[asyncio.Task[None]] = []
        for _ in range(round(20 * scale)):
            sent.append(asyncio.create_task(client.request("small", 5, "interactive")))
            await asyncio.sleep(2.0)
        await asyncio.gather(*sent)
        stop.set()

    await asyncio.gather(interactive(), *(batch_worker(i * 0.7) for i in range(3)))


async def priority(client: Client, scale: float) -> None:
    async def burst() -> None:
        low = [client.request(m, 20, "low") for m in ("low-a", "low-b") for _ in range(3)]
        high = [client.request("high", 5, "high") for _ in range(2)]
        await asyncio.gather(*low, *high)

    for _ in range(round(6 * scale)):
        started = time.monotonic()
        client.run.bursts.append(time.time())
        await burst()
        await asyncio.sleep(max(0.0, 3.0 - (time.monotonic() - started)))


async def quiet(client: Client, scale: float) -> None:
    for model, pause in [("coder", 6), ("planner", 2), ("coder", 8), ("coder", 1)] * round(
        2 * scale
    ):
        await client.request(model, 5, model)
        await asyncio.sleep(pause)  # the quiet between requests is the trace itself
    await asyncio.sleep(5)  # the last idle period, long enough for idleUnloadAfter


TRACES: dict[str, dict[str, Any]] = {
    "agents-1": {
        "members": ["planner", "coder"],
        "run": lambda c, s: agents(c, s, 1),
        "scheduler": {"maxWait": "5s"},
    },
    "agents-3": {
        "members": ["planner", "coder"],
        "run": lambda c, s: agents(c, s, 3),
        "scheduler": {"maxWait": "5s"},
    },
    "batch": {"members": ["small", "large"], "run": batch, "scheduler": {"maxWait": "5s"}},
    "priority": {
        "members": ["low-a", "low-b", "high"],
        "run": priority,
        "rules": {"high": 5},
        "scheduler": {"maxWait": "5s"},
    },
    "quiet": {
        "members": ["planner", "coder"],
        "run": quiet,
        "pool": {"default": "planner"},
        "scheduler": {"idleUnloadAfter": "3s"},
    },
}


def rules_for(members: list[str], priorities: dict[str, int]) -> list[dict[str, Any]]:
    return [
        {
            "name": m,
            "match": {"models": [m]},
            "route": {"backends": [m]},
            "priority": priorities.get(m, 0),
        }
        for m in members
    ]


async def replay(fleet: Fleet, name: str, policy: str, scale: float) -> Run:
    trace = TRACES[name]
    pool = dict(trace.get("pool", {}))
    if policy == "scheduler":
        pool.update(trace["scheduler"])
    rules = rules_for(trace["members"], trace.get("rules", {}) if policy == "scheduler" else {})
    fleet.start(trace["members"], pool, rules)
    run = Run(name, policy, subjects=Subjects(fleet.prefix))
    tapped = fleet.workdir / f"wire-{fleet.prefix}.jsonl"
    on = run.subjects
    # The questions, the pool events, and the answers on the routers' inboxes (_INBOX.>).
    wire = [on.acquire, on.release, on.cancel, on.pool_events_all, "_INBOX.>"]
    tap = wire_tap.Tap.start(fleet.infra.nats.url, wire, tapped)
    try:
        await fleet.wait_known()
        client = Client(fleet.router_url, run)
        started = time.monotonic()
        runner: Callable[[Client, float], Awaitable[None]] = trace["run"]
        await runner(client, scale)
        run.seconds = time.monotonic() - started
        await client.http.aclose()
        run.swap_reasons, run.retargets, run.swap_s = await fleet.swaps()
        run.swaps = sum(n for r, n in run.swap_reasons.items() if r != "warm_default")
        run.resident_at_end = (await fleet.pool())["resident"]
        run.swap_times = await fleet.swap_moments()
    finally:
        tap.stop()
        fleet.stop()
    run.wire = tap.read()
    grants(run)
    return run


def grants(run: Run) -> None:
    """Each request's grant (:attr:`Done.grant`) from the tapped traffic: the controller's
    answer that granted its own question; for a request that asked nothing (its router
    shared a lease it held: one granted to another request's question, which it followed,
    or one held before it came), the latest grant on its member that still lived when it
    ended, or its send time if that is later. Its hold (``x-hotseat-hold-ms``) ends at its
    dispatch instead, a few turns of the router's loop after the grant for the requests
    that followed another's question (docs/adr/0004)."""
    acquire, release = run.subjects.acquire, run.subjects.release
    questions = {m.reply: m for m in run.wire if m.subject == acquire and m.reply}
    own: dict[str, float] = {}
    leases: dict[str, list[tuple[float, str]]] = defaultdict(list)  # member -> (t, lease)
    for m in run.wire:
        question = questions.get(m.subject)
        if question is not None and m.data.get("status") == "granted":
            own[question.data["request_id"]] = m.t
            leases[question.data["member"]].append((m.t, m.data["lease_id"]))
    released = {m.data["lease_id"]: m.t for m in run.wire if m.subject == release}
    for d in run.done:
        if d.request_id in own:
            d.grant = d.lease_granted = own[d.request_id]
            continue
        # Released after it ended (the router releases once its last request ends; the
        # tap may see the release a little before the client sees the end).
        live = [
            t
            for t, lease in leases[d.member]
            if t <= d.ended and released.get(lease, math.inf) >= d.ended - RELEASE_SLACK_S
        ]
        if live:
            d.lease_granted = max(live)
            d.grant = max(d.lease_granted, d.sent)


# --- report -----------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def report(run: Run) -> None:
    ok = [d for d in run.done if d.status == 200]
    failed = len(run.done) - len(ok)
    per100 = 100 * run.swaps / max(1, len(run.done))
    reasons = ", ".join(f"{r} {n}" for r, n in sorted(run.swap_reasons.items()))
    print(
        f"  {run.policy:<9} requests {len(run.done):4d} (failed {failed})  swaps {run.swaps:3d}"
        f" = {per100:5.1f}/100 req  [{reasons}]  retargeted {run.retargets}"
        f"  resident at end: {run.resident_at_end}"
        f"  ({run.seconds:.0f} s)"
    )
    if run.swap_s:
        means = ", ".join(f"{m} {1000 * s:.0f}" for m, s in sorted(run.swap_s.items()))
        print(f"      mean swap ms (unload to ready, by member loaded): {means}")
    longest: dict[str, float] = defaultdict(float)
    for started, completed, member in run.swap_times.values():
        longest[member] = max(longest[member], completed - started)
    if longest:
        spans = ", ".join(f"{m} {1000 * s:.0f}" for m, s in sorted(longest.items()))
        print(f"      longest swap ms (audit swap_started to swap_completed): {spans}")
    by_label: dict[str, list[Done]] = defaultdict(list)
    for d in ok:
        by_label[d.label].append(d)
    for label, done in sorted(by_label.items()):
        holds = [d.hold_ms for d in done]
        mean = statistics.mean(holds)
        print(
            f"      {label:<12} n {len(holds):4d}  hold ms p50 {pct(holds, 50):8.0f}"
            f"  p99 {pct(holds, 99):8.0f}  max {max(holds):8.0f}  mean {mean:8.0f}"
        )
        report_parts(run, done)
    report_bursts(run)


@dataclass
class Parts:
    """Where one held request's hold went, in seconds, read from its send time, its
    grant, the swap it was served by (audit ``swap_started``, ``swap_completed``) and the
    other members' requests:"""

    drain: float
    """Arrival to the end of the last request of another member granted before its swap
    started (the resident's requests running, never cut)."""
    start: float
    """That end to the swap's start (0 when nothing was running: then its start is all
    the wait before the swap)."""
    swap: float
    """The swap, ``swap_started`` (or its arrival, if later) to ``swap_completed``."""
    wake: float
    """``swap_completed`` to its grant."""
    admitted: int
    """Requests of other members granted after it arrived and before its swap started."""


def parts(run: Run, d: Done) -> Parts | None:
    """The parts of ``d``'s hold, when it was held for a swap that loaded its member (the
    audit trail shows it); a swap that began before it arrived counts from its arrival."""
    if d.swap_id is None or d.swap_id not in run.swap_times:
        return None
    started, completed, member = run.swap_times[d.swap_id]
    if member != d.member:
        return None  # the header names a swap to another member that was in its way
    began = max(started, d.sent)
    before = [o for o in run.done if o.member != d.member and o.granted < began]
    running = [o.ended for o in before if o.ended > d.sent]
    drained = min(max(running, default=d.sent), began)
    admitted = sum(1 for o in before if o.granted > d.sent)
    return Parts(
        drain=drained - d.sent,
        start=began - drained,
        swap=completed - began,
        wake=d.granted - completed,
        admitted=admitted,
    )


def report_parts(run: Run, held: list[Done]) -> None:
    """The mean parts of ``held`` served by a swap (one label's), and those of the
    longest."""
    found = [(d, p) for d in held if (p := parts(run, d)) is not None]
    if not found:
        return
    across = sum(1 for d in held if d.swap_id is not None) - len(found)
    mean = {
        name: 1000 * statistics.mean(getattr(p, name) for _, p in found)
        for name in ("drain", "start", "swap", "wake")
    }
    worst_d, worst = max(found, key=lambda dp: dp[0].hold_ms)
    admitted = sum(p.admitted for _, p in found)
    print(
        f"      {'':<12} held for a swap {len(found)}: mean drain {mean['drain']:.0f}"
        f" + start {mean['start']:.0f} + swap {mean['swap']:.0f} + wake {mean['wake']:.0f} ms;"
        f" longest {worst_d.hold_ms:.0f} = {1000 * worst.drain:.0f} + {1000 * worst.start:.0f}"
        f" + {1000 * worst.swap:.0f} + {1000 * worst.wake:.0f};"
        f" other members' requests admitted while they waited: {admitted};"
        f" held across another member's swap only: {across}"
    )


def report_bursts(run: Run) -> None:
    """For a trace sent in bursts, how each began, from the tapped traffic (ms from the
    burst's first send): the resident then, each member's first question, how long the
    controller took to answer the first, when the resident's first request of the burst
    was granted (``held``: on a lease its router still held from the burst before),
    whether the pool went straight to a swap (``unloading``, which a high priority
    question can still retarget) or drained the resident first, and the longest high
    hold. Then the bursts after the first counted by how they began: a drain is the
    resident's requests admitted first, because they asked first, because their router
    still held its lease, or because they asked just after another member's question
    and their one-round-trip grant was answered before that question's decision."""
    if not run.bursts:
        return
    events = [m for m in run.wire if m.subject.startswith(run.subjects.pool_events_all[:-1])]
    questions = [m for m in run.wire if m.subject == run.subjects.acquire]
    ends = [*run.bursts[1:], math.inf]
    kinds: dict[str, list[float]] = defaultdict(list)
    for index, (begin, end) in enumerate(zip(run.bursts, ends, strict=True)):
        before = [e for e in events if e.t < begin]
        resident = before[-1].data.get("resident") if before else None
        firsts: dict[str, Wire] = {}
        for q in questions:
            if begin <= q.t < end:
                firsts.setdefault(q.data["member"], q)
        asked = ", ".join(f"{m} {ms(q.t, begin)}" for m, q in firsts.items())
        opening = next(iter(firsts.values()), None)
        answer = next((m for m in run.wire if opening and m.subject == opening.reply), None)
        took = f"{1000 * (answer.t - opening.t):.1f}" if answer and opening else "-"
        own = [d for d in run.done if d.member == resident and begin <= d.sent < end]
        leased = [d for d in own if d.grant is not None]
        earliest = min(leased, key=lambda d: d.grant or 0.0, default=None)
        held = earliest is not None and (earliest.lease_granted or begin) < begin
        granted = "-"
        if earliest is not None and earliest.grant is not None:
            granted = f"{ms(earliest.grant, begin)}{' held' if held else ''}"
        first = next((e for e in events if begin <= e.t < end and e.data["phase"] != "idle"), None)
        way = f"{first.data['phase']}>{first.data.get('target')}" if first else "-"
        holds = [d.hold_ms for d in run.done if d.label == "high" and begin <= d.sent < end]
        print(
            f"      burst {index + 1}: {resident} resident; asked {asked} (first answered in"
            f" {took} ms); {resident} granted {granted}; then {way};"
            f" high hold max {max(holds, default=0):.0f}"
        )
        if index == 0:
            continue
        if first is not None and first.data["phase"] == "unloading":
            kinds["straight to a swap"].append(0.0)
        elif held:
            kinds["drained: the resident's lease still held"].append(0.0)
        elif opening is None or resident not in firsts or opening.data["member"] == resident:
            kinds["drained: the resident asked first"].append(0.0)
        else:
            gap = 1000 * (firsts[resident].t - opening.t)
            kinds["drained: the resident asked after another member, granted first"].append(gap)
    summary = "; ".join(
        f"{k} {len(v)}" + (f" (asked {max(v):.1f} ms after it at most)" if max(v) else "")
        for k, v in sorted(kinds.items())
    )
    print(f"      bursts 2 to {len(run.bursts)}: {summary}")


def ms(t: float, begin: float) -> str:
    return f"{1000 * (t - begin):+.0f}"


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="hotseat-trace-") as tmp:
        workdir = Path(tmp)
        infra = shared.start_infra(workdir)
        try:
            for name in args.trace.split(","):
                print(f"\ntrace {name}:", flush=True)
                for policy in args.policies.split(","):
                    fleet = Fleet(workdir, infra)
                    report(await replay(fleet, name, policy, args.scale))
        finally:
            infra.stop()


def main() -> None:
    # A SIGTERM unwinds like Ctrl-C, so every fleet's processes are stopped on the way out.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default=",".join(TRACES))
    parser.add_argument("--scale", type=float, default=1.0, help="length of each trace")
    parser.add_argument(
        "--policies", default="defaults,scheduler", help="defaults, scheduler, or both"
    )
    args = parser.parse_args()
    print(f"load average at the start {os.getloadavg()[0]:.1f}")
    asyncio.run(main_async(args))
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
