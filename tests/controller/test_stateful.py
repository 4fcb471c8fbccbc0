"""Property test of the controller's transitions through the real Redis store.

A hypothesis state machine drives acquires (Wait and IfIdle, client request ids that
collide on purpose), re-asks, renewals, releases, cancels, routers that die (their
leases lapse), time passing, supervisor ticks, swap steps, swap failures, admin swaps
and unloads, a one-round-trip grant on the resident landing between another decision's
snapshot and its write (what the write's zero-lease precondition exists for), and the
faults a fleet meets:
controller deaths, swap owners frozen and thawed after a takeover, the store flushed
(Redis restarted empty) and relearning, residents that stall or die while they serve.
Swaps run in the real :class:`SwapRunner`, each in its own task, against a residency
driver whose every load and unload waits at a gate until the machine opens it (or makes
it fail), so the machine picks every interleaving of runner steps, takeovers and stale
owners that thaw; the commands act on a simulated GPU that refuses commands of an older
epoch, as every driver's backend fence does (docs/drivers.md).

Clocks are short and real, and virtual: the store's scripts read the machine's
milliseconds (a link given ``clock``), and the runners' timers (heartbeats, the swap's
timeout) run on an event loop whose clock is the same (tests/support/virtual_clock.py).
Only the ``time_passes`` rule moves it, by varied amounts, a tenth of a second at a
time: at each step the timers due run, the routers still alive renew their leases (every
third of the lease TTL), and requests whose hold budget ran out leave (their router
answers them; the cancel is lost, so the store must let the waiter go by its deadline).
So leases of dead routers expire and are reaped, waiters time out, backoffs lapse, dead
owners' heartbeats lapse, swaps time out and ``maxWait`` closes a busy resident inside a
run, the same at every replay.

Invariants:

- never two members loaded;
- **never unload a member with a live lease** (a lease a router holds and keeps
  renewing), whatever the faults; under ``busySignal: leasesAndSlots`` never unload a
  member that serves traffic bypassing the router unless the swap read its ``/slots``
  idle before that traffic began (traffic that starts after the read is not the
  controller's to see): a swap reads every member it unloads, the state's resident and
  any a failed unload left loaded alike;
- every grant is for the member the GPU holds (loaded, not crashed) and that the store
  calls resident and healthy; and a member the store calls resident while idle is the
  one the GPU holds (both ways);
- a renewal of a lease a router holds is refused only after its member was confirmed
  gone (revoked);
- the live leases the store counts are the routers' (once relearned), those of dead
  routers until their expiry; **an expired lease is reaped** by the first reap after its
  expiry, and no live one is;
- the waiters never exceed the cap, and **no waiter is held past its budget**: the store
  counts no waiter whose router's hold budget ran out;
- a failed swap's member is refused (``swap_failed``) only while its backoff runs;
- with ``maxWait``, **a busy resident is closed by the first tick once another member's
  waiter has waited ``maxWait``** (and the resident stayed ``minResidency``);
- at the end every waiting request is answered: granted, skipped (IfIdle), or refused
  with an error the contract allows for what happened (a failed swap; a full queue, only
  when the decision saw the queue at its cap);
- **every state-change notification names the state the store holds when it goes out**
  (epoch, phase, resident, target, closed and closing members, swap id): the
  notifications of the runners' steps and of the machine's own decisions go through the
  real :class:`Outcomes`, and the store is read, without yielding to the loop, at each.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import ClassVar

import pytest
import redis
import redis.asyncio as aioredis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture import providers
from hypothesis.internal.constants_ast import Constants
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hotseat.launcher import Managed
from hotseat_common.config.model import BusySignal, PoolActivation
from hotseat_common.keys import Keys
from hotseat_common.messages import (
    SWAP_ENDINGS,
    AcquireRequest,
    ErrorReply,
    Granted,
    IncumbentBusyReply,
    PoolOutcome,
    PoolStateChanged,
    WaitReply,
)
from hotseat_common.settings import RedisSettings
from hotseat_pool_controller.decisions.acquire import decide_acquire
from hotseat_pool_controller.decisions.admin import decide_admin_swap, decide_admin_unload
from hotseat_pool_controller.decisions.busy import SlotsRead
from hotseat_pool_controller.decisions.recovery import (
    decide_rebuild,
    decide_resident_health,
    decide_resident_lost,
)
from hotseat_pool_controller.decisions.schedule import eta_s
from hotseat_pool_controller.decisions.start import next_epoch
from hotseat_pool_controller.decisions.tick import decide_tick
from hotseat_pool_controller.drivers.base import DriverError, Fenced
from hotseat_pool_controller.model import (
    IN_FLIGHT,
    AcquireAsk,
    AuditIntent,
    Decision,
    Phase,
    PoolPolicy,
    PoolSnapshot,
    SwapOrder,
)
from hotseat_pool_controller.runtime.announcer import Announcer, state_message
from hotseat_pool_controller.runtime.outcomes import Outcomes
from hotseat_pool_controller.runtime.swaps import SwapRunner
from hotseat_pool_controller.store.codec import decode_snapshot
from hotseat_pool_controller.store.link import RedisLink
from hotseat_pool_controller.store.pool import PoolStore, Renewal
from tests.support.virtual_clock import VirtualClock, VirtualLoop, until_parked

pytestmark = pytest.mark.timeout(600)
"""Hundreds of generated runs, each through real Redis and real swap runners: on a loaded
machine they take minutes, and a timeout that interrupts hypothesis mid-run is reported
as a flaky test rather than as what it is."""

MEMBERS = ("a", "b", "c")
CLIENT_IDS = ("client-1", "client-2")
"""Client request ids: few, so requests share them (they must never share a lease)."""
POLICY = PoolPolicy(
    name="gpu",
    members=MEMBERS,
    max_waiters=4,
    lease_ttl_ms=3000,
    swap_timeout_ms=10_000,
    failure_backoff_ms=5000,
    busy_signal=BusySignal.LEASES,
    default="a",
    heartbeat_ttl_ms=3000,
    waiter_grace_ms=2000,
)
"""Short clocks, as a pool in service may have them (all on the machine's virtual time)."""
RELEARN_MS = POLICY.lease_ttl_ms
"""A rebuilt resident counts as busy for one lease TTL (as the controller's recovery)."""
HOLD_MS = 12_000
"""A router's hold budget for a Wait request (it sends what is left of it at each ask)."""
RENEW_EVERY_MS = POLICY.lease_ttl_ms // 3
TIME_STEP_MS = 100
"""Virtual time passes by this much at a time: timers, renewals and budgets are checked
at every step."""
PASSES_MS = (200, 700, 1500, 3500, 9000)
"""How much time the ``time_passes`` rule lets pass: below and above every TTL."""
RESTART_MS = 1000
"""How long Redis takes to restart (empty)."""
HEARTBEAT_LAPSES_MS = POLICY.heartbeat_ttl_ms + TIME_STEP_MS
"""Time enough for a silent owner's heartbeat to lapse (it lives up to its expiry)."""
STORE_TIMEOUT_S = 600.0
ALLOWED_ERRORS = frozenset({"swap_failed", "pool_queue_full"})
"""Error answers the contract allows a waiting request: its swap failed, or the queue
was full when it asked again."""


class SimGpu:
    """One GPU: at most what is loaded; commands of an older epoch are refused (the
    backend fence); a member may stall (alive, not answering) or crash (gone)."""

    def __init__(self) -> None:
        self.loaded: set[str] = set()
        self.stalled: set[str] = set()
        self.highest_epoch = 0
        self.serving: set[str] = set()
        """Members with a lease some router holds: set by the machine before a command."""
        self.bypassed: dict[str, int] = {}
        """Members serving traffic that bypassed the router (their /slots are busy), each
        with the number of its stretch of traffic (one per start)."""
        self.stretches = 0
        self.reads: dict[tuple[int, str], int | None] = {}
        """(swap, member) -> the stretch of bypass traffic that swap's last /slots read of
        the member saw, ``None`` when it read the member idle."""
        self.swap = 0
        """The swap whose command acts now (set by the driver before a command)."""

    def bypass(self, member: str) -> None:
        """Traffic that bypasses the router begins on ``member`` (one that is loaded and
        answers: a stalled member serves nothing)."""
        if member in self.loaded and member not in self.stalled and member not in self.bypassed:
            self.stretches += 1
            self.bypassed[member] = self.stretches

    def read_slots(self, member: str, swap: int) -> bool:
        """A /slots read of ``member`` on behalf of ``swap``: idle unless bypassed."""
        self.reads[swap, member] = self.bypassed.get(member)
        return member not in self.bypassed

    def read_stalled(self, member: str, swap: int) -> None:
        """A /slots read of a stalled ``member`` on behalf of ``swap``: no answer, and no
        traffic either (a stalled member serves nothing). Traffic that begins after it,
        before the unload lands, is the race every read leaves, as after an idle read."""
        self.reads[swap, member] = None

    def accept(self, epoch: int) -> bool:
        if epoch < self.highest_epoch:
            return False
        self.highest_epoch = epoch
        return True

    def unload(self, member: str, epoch: int) -> bool:
        if not self.accept(epoch):
            return False
        if member in self.loaded:
            assert member not in self.serving, f"unloaded {member} while it served"
            if member in self.bypassed:
                # Allowed only when this swap read it idle before the traffic began.
                read = self.reads.get((self.swap, member), self.bypassed[member])
                assert read != self.bypassed[member], (
                    f"unloaded {member}, whose /slots were busy "
                    + ("when read" if (self.swap, member) in self.reads else "(never read)")
                )
        self.crash(member)
        return True

    def load(self, target: str, epoch: int) -> bool:
        if not self.accept(epoch):
            return False
        assert not (self.loaded - {target}), f"load of {target} while {self.loaded} loaded"
        self.loaded.add(target)
        # A load returns once the member answers: a driver restarts a member that runs but
        # does not answer (the process driver), or its wait for readiness fails the load.
        self.stalled.discard(target)
        return True

    def stall(self, member: str) -> None:
        """Out of band: the member stops answering (and what it served stalls with it)."""
        self.stalled.add(member)
        self.bypassed.pop(member, None)

    def crash(self, member: str) -> None:
        """Out of band: the member's process dies (nothing the controller did)."""
        self.loaded.discard(member)
        self.stalled.discard(member)
        self.bypassed.pop(member, None)

    def ready(self, member: str) -> bool:
        return member in self.loaded and member not in self.stalled


CURRENT_SWAP: ContextVar[int] = ContextVar("CURRENT_SWAP", default=0)
"""Which swap a driver command belongs to (tasks the runner starts inherit it)."""


@dataclass
class Swap:
    """A swap the real runner runs as ``owner``, in its own task."""

    order: SwapOrder
    owner: str
    task: asyncio.Task[str]
    key: int


@dataclass
class Command:
    """A load or unload a runner sent, held at its gate until the machine opens it."""

    kind: str
    member: str
    epoch: int
    swap: int
    done: asyncio.Future[None]


class GatedDriver:
    """The residency driver of every runner: each command waits at a gate; opened, it acts
    on the simulated GPU (whose fence refuses an older epoch: :class:`Fenced`)."""

    def __init__(self, gpu: SimGpu, serving: Callable[[], set[str]]) -> None:
        self.gpu = gpu
        self._serving = serving
        self.pending: list[Command] = []

    async def _gate(self, kind: str, member: str, epoch: int) -> None:
        command = Command(
            kind, member, epoch, CURRENT_SWAP.get(), asyncio.get_running_loop().create_future()
        )
        self.pending.append(command)
        try:
            await command.done
        finally:
            if command in self.pending:
                self.pending.remove(command)

    def open(self, command: Command, *, fail: bool = False) -> None:
        """Let ``command`` through: it acts on the GPU now (or fails, as a driver may)."""
        self.pending.remove(command)
        if fail:
            command.done.set_exception(DriverError(f"{command.kind} {command.member}: boom"))
            return
        self.gpu.serving = self._serving()
        self.gpu.swap = command.swap
        act = self.gpu.load if command.kind == "load" else self.gpu.unload
        if act(command.member, command.epoch):
            command.done.set_result(None)
        else:
            command.done.set_exception(Fenced(f"epoch {command.epoch} refused"))

    async def load(self, member: str, *, epoch: int) -> None:
        await self._gate("load", member, epoch)

    async def unload(self, member: str, *, epoch: int) -> None:
        await self._gate("unload", member, epoch)

    async def is_ready(self, member: str) -> bool:
        return self.gpu.ready(member)

    async def is_idle(self, member: str) -> bool:
        """The member's /slots (a member that stalls does not answer them)."""
        if member in self.gpu.stalled:
            self.gpu.read_stalled(member, CURRENT_SWAP.get())
        if member in self.gpu.stalled or member not in self.gpu.loaded:
            raise DriverError(f"{member}: /slots do not answer")
        return self.gpu.read_slots(member, CURRENT_SWAP.get())

    async def confirm_gone(self, member: str) -> bool:
        return member not in self.gpu.loaded

    async def fence(self, epoch: int) -> None:
        self.gpu.accept(epoch)

    async def residency(self) -> dict[str, bool]:
        return {m: m in self.gpu.loaded for m in MEMBERS}

    async def aclose(self) -> None:
        return None


class CheckedAnnouncer(Announcer):
    """What :class:`Outcomes` tells the world: each state-change notification, as the
    controller would publish it, is handed to ``check`` in the moment it goes out, and each
    audited transition to ``audited``; metrics are not under test."""

    def __init__(
        self,
        check: Callable[[PoolStateChanged], None],
        audited: Callable[[AuditIntent], None],
    ) -> None:
        self._check = check
        self._audited = audited

    async def state_changed(self, pool: str, snap: PoolSnapshot, reason: str) -> None:
        self._check(state_message(pool, snap, reason))

    def transition(self, pool: str, intent: AuditIntent) -> None:
        self._audited(intent)


class SwapBook:
    """The swaps' audit events as the controllers sent them: each swap started must end
    once (one of ``swap_completed``, ``swap_failed``, ``swap_cancelled``; an end several
    owners send under one event id is one event, as JetStream and the audit store keep
    it)."""

    def __init__(self) -> None:
        self.started: set[str] = set()
        self.also: dict[str, frozenset[str]] = {}
        """A capacity pool's plan -> the other members it loads beside its target: one
        that fails alone has a ``swap_failed`` of its own, not the plan's end."""
        self.ends: dict[str, set[str]] = {}
        self.end_intents: dict[str, list[AuditIntent]] = {}
        self._sent = 0

    def audited(self, intent: AuditIntent) -> None:
        if intent.swap_id is None:
            return
        if intent.outcome == PoolOutcome.SWAP_STARTED:
            self.started.add(intent.swap_id)
            self.also[intent.swap_id] = frozenset(intent.also or ())
        elif intent.outcome == PoolOutcome.SWAP_FAILED and intent.to_member in self.also.get(
            intent.swap_id, ()
        ):
            return
        elif intent.outcome in SWAP_ENDINGS:
            self._sent += 1
            event = intent.event_id or f"event-{self._sent}"
            self.ends.setdefault(intent.swap_id, set()).add(event)
            self.end_intents.setdefault(intent.swap_id, []).append(intent)

    def check(self, in_flight: str | None, unowned: set[str]) -> None:
        """Every swap started ended once; ``in_flight`` (the swap the store holds in
        flight) has not ended yet, and a swap in ``unowned`` (its last owner was killed or
        frozen, nobody took it over) may not have (a store flushed after that forgot it)."""
        assert set(self.ends) <= self.started, ("ended, never started", self.ends)
        for swap_id in sorted(self.started):
            ends = self.ends.get(swap_id, set())
            if swap_id == in_flight:
                assert not ends, ("in flight, but ended", swap_id, ends)
            elif swap_id in unowned:
                assert len(ends) <= 1, ("ended twice", swap_id, ends)
            else:
                assert len(ends) == 1, ("started, ended " + str(len(ends)) + " times", swap_id)
        ControllerMachine.events["swap ended once"] += len(self.started)


@dataclass
class Held:
    """A lease a router holds (it keeps renewing it while its stream runs, and while the
    router lives)."""

    member: str
    attempt: str
    client: str
    epoch: int
    expiry_ms: int
    """When the lease runs out unless renewed (the store's clock, as its last grant or
    renewal set it)."""
    renewed_ms: int
    forgotten: bool = False
    """The store lost it (flushed) and no renewal has written it back yet."""
    alive: bool = True
    """Its router lives and renews it; a dead router's lease lapses at ``expiry_ms``."""


@dataclass
class Waiting:
    member: str
    mode: PoolActivation
    attempt: str
    client: str
    may_fail: set[str] = field(default_factory=set)
    """Error codes the contract allows this request (besides a full queue)."""
    priority: int = 0
    """A higher one may turn a swap still unloading toward its member (docs/adr/0006)."""
    deadline_ms: int = 0
    """When its router's hold budget runs out (set at its first ask)."""
    since_ms: int | None = None
    """When the store first counted it waiting (its arrival, kept through re-asks;
    ``None`` while the store does not count it: before its first hold, after a flush)."""


class ControllerMachine(RuleBasedStateMachine):
    redis_url = ""
    policy = POLICY
    events: ClassVar[Counter[str]] = Counter()
    """What the runs of this class reached (leases reaped, waiters timed out, backoffs
    lapsed, swaps timed out, ``maxWait`` closes): a test on examples that are the same at
    every run asserts them."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = VirtualClock()
        self.loop = VirtualLoop(self.clock)
        self.redis: aioredis.Redis = aioredis.from_url(self.redis_url, decode_responses=True)
        # The link's own 2 s command timeout is a wall clock: a command that a loaded host
        # delays past it would end a run differently from its replay (hypothesis reports
        # that as flaky). What the store does when Redis is slow is not this machine's.
        self.link = RedisLink(
            RedisSettings(redis_url=self.redis_url), timeout=STORE_TIMEOUT_S, clock=self.clock
        )
        self.store = PoolStore(self.link, Keys("p" + uuid.uuid4().hex[:10]), self.policy)
        self.book = SwapBook()
        self.endings: list[asyncio.Task[None]] = []
        """Owners reading the pool again after losing a swap while their claim held."""
        self.unowned: set[str] = set()
        """Swaps whose last owner was killed or frozen (its claim lapses) and that nobody
        took over since: a store flushed meanwhile forgets them, and nobody can tell that
        no other owner ended them (docs/adr/0005, point 9)."""
        self.outcomes = Outcomes(self.store, CheckedAnnouncer(self.notified, self.book.audited))
        # The store as it is in the moment of a notification: read blocking the loop, so
        # that no runner, controller or router moves it meanwhile.
        self.blocking = redis.Redis.from_url(self.redis_url, decode_responses=True)
        self.gpu = SimGpu()
        self.driver = GatedDriver(self.gpu, self.serving)
        self.leases: dict[str, Held] = {}
        self.waiting: dict[str, Waiting] = {}  # attempt -> waiter
        self.swaps: list[Swap] = []
        self.n = 0
        self.revoked: set[str] = set()
        self.closed = False
        self.ran_for: dict[int, str] = {}
        """swap -> the member it ran for, once it ended."""
        self.broken: set[int] = set()
        """Swaps a driver command of which the machine made fail."""
        self.zombies: set[str] = set()
        """Members taken for lost while still on the GPU (until a swap unloads them)."""
        self.failed: dict[str, int] = {}
        """member -> when its last swap failed (its backoff runs from then)."""

    def run(self, coro):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        async def stop_swaps() -> None:
            # Every runner, and any driver command a runner left running (a gather whose
            # first command failed does not stop its others).
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        self.run(stop_swaps())
        self.run(self.store.reset())
        self.run(self.redis.aclose())
        self.blocking.close()
        self.run(self.link.aclose())
        self.loop.close()

    def snapshot(self, attempt: str = "") -> PoolSnapshot:
        return self.run(self.store.snapshot(attempt))

    def notified(self, message: PoolStateChanged) -> None:
        """A state-change notification goes out: it names the state stored now."""
        state = self.blocking.hgetall(self.store.keys.pool_state(self.policy.name))
        stored = decode_snapshot(
            {
                "now": self.clock.ms,
                "state": [x for field in state.items() for x in field],
                "stale": bool(state) and state.get("store") != self.link.server_id,
            }
        )
        assert message == state_message(self.policy.name, stored, message.reason), (
            message,
            state,
        )
        ControllerMachine.events["state change announced"] += 1

    def decide(self, decide, attempt: str = "") -> Decision:  # type: ignore[no-untyped-def]
        """What Transitions.decide does, its reads of /slots aside (:meth:`decide_busy`):
        decide and apply, then report what the commit did."""

        async def decided() -> Decision:
            decision, after = await self.store.decide(decide, attempt)
            await self.outcomes.report(decision, after, "decision")
            return decision

        asked_at = self.loop.time()
        decision = self.run(decided())
        if decision.swap is not None:
            self.start_swap(decision.swap, self.owner_of(decision), claimed_at=asked_at)
        return decision

    def start_swap(self, order: SwapOrder, owner: str, *, claimed_at: float | None = None) -> None:
        """What PoolRuntime does with a swap order: the real runner, in its own task."""
        runner = SwapRunner(self.store, self.driver, self.policy, owner, self.outcomes)
        self.unowned.discard(order.swap_id)
        self.n += 1
        key = self.n

        async def run() -> str:
            CURRENT_SWAP.set(key)
            ran = await runner.run(order, claimed_at=claimed_at)
            self.ran_for[key] = ran.target  # a swap retargeted ran for its new target
            if ran.claim_held:  # as Swaps does: ended here if the store lost it
                self.endings.append(self.loop.create_task(runner.end_lost(order, ran.target)))
            return ran.result

        self.swaps.append(Swap(order, owner, self.loop.create_task(run()), key))
        self.settle()

    def settle(self) -> None:
        """Run the loop until every task (swaps, their heartbeats, their driver commands)
        waits on a driver gate or on the clock, or has ended; record what the ended swaps
        leave behind."""
        self.run(until_parked(self.loop, lambda: {id(c.done) for c in self.driver.pending}))
        for swap in [s for s in self.swaps if s.task.done()]:
            self.swaps.remove(swap)
            if swap.task.cancelled():
                continue
            result = swap.task.result()
            target = self.ran_for.get(swap.key, swap.order.target)
            if result == "lost" and swap.key in self.broken and target:
                # A command of it failed, then its ownership was found taken: its failure
                # may have been written before the takeover (its backoff may run).
                self.fail(target)
            if result == "failed":
                if target:
                    self.fail(target)
                if swap.key not in self.broken:  # no command of it failed: its timeout
                    ControllerMachine.events["swap timed out"] += 1
                # A failed swap leaves the pool cold; what its unloads did not reach is
                # still on the GPU, unknown to the store, until the next swap unloads it.
                self.zombies |= self.gpu.loaded

    def decide_busy(self, decide, attempt: str = "") -> Decision:  # type: ignore[no-untyped-def]
        """Like Transitions.decide: a decision that needs members' /slots asks the GPU
        (traffic that bypassed the router keeps its slots busy; a member not on the GPU
        has none), then decides again, until it needs no new read."""
        read: dict[str, bool | None] = {}
        decision = self.decide(lambda s: decide(s, dict(read)), attempt)
        while members := [m for m in decision.need_idle_check if m not in read]:
            for member in members:
                read[member] = self.read_slots(member)
            decision = self.decide(lambda s: decide(s, dict(read)), attempt)
        return decision

    def read_slots(self, member: str) -> bool | None:
        """What runtime/slots.py reads: idle when not on the GPU, no answer when stalled."""
        if member not in self.gpu.loaded:
            return False
        if member in self.gpu.stalled:
            return None
        return not self.gpu.read_slots(member, 0)

    def owner_of(self, decision: Decision) -> str:
        fields = next((op.fields for op in decision.ops if hasattr(op, "fields")), {})
        return str(fields.get("owner", "c1"))

    def serving(self) -> set[str]:
        """Members with a lease a live router holds, or one a dead router held that the
        store still counts (busy /slots are the GPU's to check: :meth:`SimGpu.unload`)."""
        return {held.member for held in self.leases.values() if self.lease_live(held)}

    def lease_live(self, held: Held) -> bool:
        return held.alive or (not held.forgotten and held.expiry_ms > self.clock.ms)

    def fail(self, member: str) -> None:
        """``member``'s swap failed: its backoff starts, its waiters are let go."""
        self.failed[member] = self.clock.ms
        for waiter in self.waiting.values():
            if waiter.member == member:
                waiter.since_ms = None

    def in_backoff(self, member: str) -> bool:
        failed = self.failed.get(member)
        return failed is not None and self.clock.ms < failed + self.policy.failure_backoff_ms

    @initialize()
    def start(self) -> None:
        self.rebuild()

    def rebuild(self) -> None:
        """What PoolRuntime.rebuild does: fence the GPU at the new epoch, then take the
        lone member on it as the resident (unhealthy if it does not answer)."""
        snap = self.snapshot()
        if snap.phase != Phase.UNKNOWN:
            return
        self.gpu.accept(next_epoch(snap))
        on_gpu = tuple(sorted(self.gpu.loaded))
        unhealthy = len(on_gpu) == 1 and not self.gpu.ready(on_gpu[0])
        self.decide(lambda s: decide_rebuild(s, on_gpu, unhealthy=unhealthy, relearn_ms=RELEARN_MS))

    # --- requests -----------------------------------------------------------------------

    def _ask(self, waiter: Waiting, controller: str) -> None:
        self.n += 1
        lease_id = f"L{self.n}"
        if not waiter.deadline_ms:
            waiter.deadline_ms = self.clock.ms + HOLD_MS

        request = AcquireRequest(
            pool=POLICY.name,
            member=waiter.member,
            mode=waiter.mode,
            attempt=waiter.attempt,
            request_id=waiter.client,
            router="r",
            hold_s=(waiter.deadline_ms - self.clock.ms) / 1000,
            priority=waiter.priority or None,
        )

        seen: list[tuple[PoolSnapshot, AcquireAsk]] = []

        def decide(s: PoolSnapshot, busy: SlotsRead) -> Decision:
            ask = AcquireAsk.of(request, now_ms=s.now_ms, lease_id=lease_id)
            seen.append((s, ask))
            return decide_acquire(s, ask, self.policy, controller, slots_busy=busy)

        decision = self.decide_busy(decide, waiter.attempt)
        reply = decision.reply
        after = self.snapshot()
        if waiter.member in self.failed and not self.in_backoff(waiter.member):
            # Asked once its backoff ran out: a swap_failed answer is no longer allowed.
            del self.failed[waiter.member]
            refused = isinstance(reply, ErrorReply) and reply.code == "swap_failed"
            ControllerMachine.events["asked after a backoff lapsed"] += not refused
        if isinstance(reply, Granted):
            self.assert_grantable(waiter.member, after)
            assert self.gpu.ready(waiter.member), f"granted {waiter.member}, GPU: {self.gpu.loaded}"
            known = self.leases.get(reply.lease_id)
            assert known is None or known.attempt == waiter.attempt, "an attempt got another's"
            expiry = self.clock.ms + round(reply.ttl_s * 1000)
            self.leases[reply.lease_id] = Held(
                waiter.member, waiter.attempt, waiter.client, reply.epoch, expiry, self.clock.ms
            )
            self.waiting.pop(waiter.attempt, None)
        elif isinstance(reply, WaitReply):
            self.waiting[waiter.attempt] = waiter
            if waiter.since_ms is None and after.live_waiters(waiter.member):
                waiter.since_ms = self.clock.ms
            self.assert_not_dead_on_arrival(waiter)
        elif isinstance(reply, IncumbentBusyReply):
            assert waiter.mode == PoolActivation.IF_IDLE, "a Wait request was skipped"
            self.waiting.pop(waiter.attempt, None)
        else:
            assert isinstance(reply, ErrorReply), reply
            allowed = set(waiter.may_fail)
            snap, ask = seen[-1]
            if snap.total_waiters >= self.policy.max_waiters:
                allowed.add("pool_queue_full")  # only when the queue was full
            if self.in_backoff(waiter.member):  # its swap failed, and the backoff runs
                allowed.add("swap_failed")
            eta, _ = eta_s(snap, ask.member, ask.urgency_ms(self.policy))
            if eta > (ask.deadline_ms - snap.now_ms) / 1000:
                allowed.add("eta_over_budget")  # measured swaps outlast what is left of it
            assert reply.code in allowed, (reply, snap)
            self.waiting.pop(waiter.attempt, None)

    def assert_grantable(self, member: str, after: PoolSnapshot) -> None:
        """A grant is for the store's resident, healthy and serving."""
        assert after.resident == member, "granted a member that is not resident"
        assert after.phase in {Phase.IDLE, Phase.DRAINING}
        assert not after.unhealthy, "granted a member that fails its health checks"

    def assert_not_dead_on_arrival(self, waiter: Waiting) -> None:
        """A waiter's deadline is ahead of the store's clock when it is added (holds travel
        as durations, whatever the asking router's wall clock says)."""
        key = self.store.keys.pool_waiters(POLICY.name, waiter.member)
        deadline = self.run(self.redis.zscore(key, waiter.attempt))
        if deadline is not None:
            assert deadline > self.snapshot().now_ms, f"{waiter} dead on arrival"

    @rule(
        member=st.sampled_from(MEMBERS),
        mode=st.sampled_from(list(PoolActivation)),
        controller=st.sampled_from(["c1", "c2"]),
        client=st.sampled_from(CLIENT_IDS),
        priority=st.sampled_from([0, 0, 5]),
    )
    def acquire(
        self, member: str, mode: PoolActivation, controller: str, client: str, priority: int = 0
    ) -> None:
        """A router asks; its wall clock may be anywhere (nothing of it is sent). A
        priority 5 request may turn a swap still unloading toward its member."""
        self.n += 1
        self._ask(Waiting(member, mode, f"q{self.n}", client, priority=priority), controller)

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def reask(self, data: st.DataObject) -> None:
        attempt = data.draw(st.sampled_from(sorted(self.waiting)))
        self._ask(self.waiting[attempt], "c1")

    def routers(self) -> list[str]:
        """The leases whose router lives (it renews and releases them)."""
        return sorted(k for k, held in self.leases.items() if held.alive)

    @precondition(lambda self: self.routers())
    @rule(data=st.data())
    def renew(self, data: st.DataObject) -> None:
        self.renew_lease(data.draw(st.sampled_from(self.routers())))

    def renew_lease(self, lease_id: str) -> None:
        """A router renews a lease it holds: never refused unless its member was revoked,
        or the store forgot it and its relearning window closed before it came back."""
        held = self.leases[lease_id]
        held.renewed_ms = self.clock.ms
        renewed = self.run(
            self.store.renew(
                held.member,
                lease_id,
                epoch=held.epoch,
                attempt=held.attempt,
                request_id=held.client,
                router="r",
            )
        )
        if renewed.outcome is Renewal.RENEWED:
            held.forgotten = False
            held.expiry_ms = self.clock.ms + self.policy.lease_ttl_ms
        elif renewed.outcome is Renewal.GONE:
            assert held.member in self.revoked or held.forgotten, f"renewal refused: {held}"
            del self.leases[lease_id]  # the router ends the stream with an error

    @precondition(lambda self: self.routers())
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        self.release_lease(data.draw(st.sampled_from(self.routers())))

    def release_lease(self, lease_id: str) -> None:
        held = self.leases.pop(lease_id)
        released = self.run(self.store.release(held.member, lease_id))
        assert released.removed or held.forgotten or held.member in self.revoked

    @precondition(lambda self: self.routers())
    @rule(data=st.data(), ms=st.sampled_from(PASSES_MS))
    def router_dies(self, data: st.DataObject, ms: int) -> None:
        """A router dies: its lease is renewed no more, and lapses at its expiry (until
        then the store counts it, as it must: it cannot tell a dead router from a slow
        one). Then time passes and a supervisor ticks (reaping it if it lapsed)."""
        self.leases[data.draw(st.sampled_from(self.routers()))].alive = False
        self.supervisor_wakes(ms, "c1")

    @rule(ms=st.sampled_from(PASSES_MS))
    def time_passes(self, ms: int) -> None:
        self.advance(ms)

    @rule(ms=st.sampled_from(PASSES_MS), controller=st.sampled_from(["c1", "c2"]))
    def supervisor_wakes(self, ms: int, controller: str) -> None:
        """Time passes, then a supervisor ticks (its timer: it reaps, closes, swaps)."""
        self.advance(ms)
        self.tick(controller)

    @precondition(lambda self: self.policy.max_wait_ms is not None)
    @rule(other=st.sampled_from(MEMBERS), ms=st.sampled_from(PASSES_MS))
    def demand_meets_a_busy_resident(self, other: str, ms: int) -> None:
        """A stream starts on the resident and a request for another member comes, then
        time passes and a supervisor ticks (random steps alone line these up for a
        ``maxWait`` close only now and then)."""
        resident = self.snapshot().resident
        if resident is None or other == resident:
            return
        self.acquire(resident, PoolActivation.WAIT, "c1", "client-1")
        self.acquire(other, PoolActivation.WAIT, "c2", "client-2")
        self.supervisor_wakes(ms, "c1")

    def advance(self, ms: int) -> None:
        """``ms`` of virtual time pass, a step at a time: at each step the timers due run
        (heartbeats, swap timeouts), live routers renew their leases when due, a lease
        that lapsed is reaped (the supervisor's reap runs on its timer), and the requests
        whose hold budget ran out leave the machine (their router answered them: 503; its
        cancel is lost, so the store must let them go by their deadline)."""
        end = self.clock.ms + ms
        while self.clock.ms < end:
            self.clock.ms = min(end, self.clock.ms + TIME_STEP_MS)
            self.settle()
            for lease_id, held in list(self.leases.items()):
                if held.alive and self.clock.ms - held.renewed_ms >= RENEW_EVERY_MS:
                    self.renew_lease(lease_id)
            if any(h.expiry_ms <= self.clock.ms for h in self.leases.values() if not h.alive):
                self.reap()
            for attempt, waiter in list(self.waiting.items()):
                if waiter.deadline_ms <= self.clock.ms:
                    del self.waiting[attempt]
                    ControllerMachine.events["waiter timed out"] += 1

    def reap(self) -> None:
        """The supervisor's reap: every lease of a dead router past its expiry goes at the
        first reap after it, and nothing else does."""
        reaped = {lease.lease_id for lease in self.run(self.store.reap())}
        for lease_id, held in list(self.leases.items()):
            if held.alive or held.expiry_ms > self.clock.ms:
                assert lease_id not in reaped, f"reaped a live lease: {held}"
                continue
            del self.leases[lease_id]
            if not held.forgotten:  # (a revoke drops its leases from the machine at once)
                assert lease_id in reaped, f"an expired lease was not reaped: {held}"
                ControllerMachine.events["expired lease reaped"] += 1

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        attempt = data.draw(st.sampled_from(sorted(self.waiting)))
        waiter = self.waiting.pop(attempt)
        self.run(self.store.cancel(waiter.member, attempt))

    # --- supervision and swaps ---------------------------------------------------------

    @rule(controller=st.sampled_from(["c1", "c2"]))
    def tick(self, controller: str) -> None:
        """The supervisor's tick: the reap, then the decision (PoolRuntime.tick)."""
        self.reap()
        before = self.snapshot()
        if before.phase == Phase.UNKNOWN:
            self.rebuild()
            return
        due = self.close_due(before)
        decision = self.decide_busy(
            lambda s, busy: decide_tick(s, self.policy, controller, slots_busy=busy)
        )
        lost = any(i.outcome == PoolOutcome.RESIDENT_LOST for i in decision.audit)
        if lost and before.resident in self.gpu.loaded:
            # An unhealthy resident whose last lease ended, taken for lost while its
            # process still holds the GPU: the next swap's unloads take it away.
            self.zombies.add(before.resident)
        if due is not None:
            after = self.snapshot()
            assert after.closed or after.phase in IN_FLIGHT, f"maxWait close due: {due}, {after}"
            ControllerMachine.events["maxWait close due, and made"] += after.closed

    def close_due(self, snap: PoolSnapshot) -> Waiting | None:
        """A waiter for another member that has waited ``maxWait`` (by its arrival; the
        resident's expected drain and a priority only make a close come sooner) while the
        resident serves, healthy, has stayed ``minResidency`` and has no waiters of its
        own: the tick must close the resident (or swap, were it idle after all)."""
        max_wait, min_residency = self.policy.max_wait_ms, self.policy.min_residency_ms
        resident = snap.resident
        if max_wait is None or min_residency is None or self.policy.has_capacity:
            return None
        if snap.phase not in {Phase.IDLE, Phase.DRAINING} or snap.closed or snap.unhealthy:
            return None
        if resident is None or self.swaps or not snap.serving(resident):
            return None
        if snap.live_waiters(resident) or snap.now_ms - snap.committed_ms < min_residency:
            return None
        return next(
            (
                w
                for w in self.waiting.values()
                if w.member != resident
                and w.since_ms is not None
                and snap.live_waiters(w.member)
                and snap.now_ms - w.since_ms >= max_wait
            ),
            None,
        )

    @precondition(lambda self: self.driver.pending)
    @rule(data=st.data())
    def step_swap(self, data: st.DataObject) -> None:
        """A driver command ends: the runner that sent it takes its next steps."""
        self.step(data.draw(st.sampled_from(self.driver.pending)))

    def step(self, command: Command) -> None:
        self.driver.open(command)
        self.settle()

    @precondition(lambda self: self.driver.pending)
    @rule()
    def swaps_run_to_end(self) -> None:
        """Every driver command ends, in order, until no swap is left (a swap takes three
        commands here: random steps alone would reach a warm pool only now and then)."""
        while self.driver.pending:
            self.step(self.driver.pending[0])

    @precondition(lambda self: self.driver.pending)
    @rule(data=st.data())
    def fail_swap(self, data: st.DataObject) -> None:
        """A driver command fails (a load that crashes, an unload that cannot confirm)."""
        command = data.draw(st.sampled_from(self.driver.pending))
        self.broken.add(command.swap)
        self.driver.open(command, fail=True)
        self.settle()

    @precondition(lambda self: self.swaps)
    @rule(data=st.data(), frozen=st.booleans())
    def controller_dies(self, data: st.DataObject, frozen: bool) -> None:
        """The owner vanishes mid-swap: its heartbeat stops, and lapses once time passes
        (then a tick takes the swap over). A frozen one keeps its commands held at their
        gates: opened later, they act on its old epoch (as a thawed owner's would, past
        its last ownership check) and meet the GPU's fence."""
        self.controller_dies_now(data.draw(st.sampled_from(self.swaps)).owner, frozen=frozen)

    def controller_dies_now(self, owner: str, *, frozen: bool = False) -> None:
        """``owner`` dies (its swaps stop) or freezes (only its heartbeats stop: the
        runner names each heartbeat's task after its pool and epoch)."""
        mine = [swap for swap in self.swaps if swap.owner == owner]
        beats = {f"swap-heartbeat-{self.policy.name}-{swap.order.epoch}" for swap in mine}
        stop = set() if frozen else {swap.task for swap in mine}
        self.unowned |= {swap.order.swap_id for swap in mine}
        for task in asyncio.all_tasks(self.loop):
            if task in stop or task.get_name() in beats:
                task.cancel()
        self.settle()

    @rule(member=st.sampled_from(MEMBERS), controller=st.sampled_from(["c1", "c2"]))
    def admin_swap(self, member: str, controller: str) -> None:
        seen: list[PoolSnapshot] = []

        def decide(s: PoolSnapshot, busy: SlotsRead) -> Decision:
            seen.append(s)
            return decide_admin_swap(s, member, controller, self.policy, slots_busy=busy)

        decision = self.decide_busy(decide)
        self.check_admin_answer(decision, seen[-1], already=member)

    @rule(controller=st.sampled_from(["c1", "c2"]))
    def admin_unload(self, controller: str) -> None:
        seen: list[PoolSnapshot] = []

        def decide(s: PoolSnapshot, busy: SlotsRead) -> Decision:
            seen.append(s)
            return decide_admin_unload(s, controller, self.policy, slots_busy=busy)

        decision = self.decide_busy(decide)
        self.check_admin_answer(decision, seen[-1], already=None)

    def check_admin_answer(
        self, decision: Decision, snap: PoolSnapshot, already: str | None
    ) -> None:
        """An operator's swap or unload is refused only for what the contract names: a
        swap in flight (or a pool not known yet), or an incumbent that serves (its leases,
        or busy /slots); else it starts, unless what it asks for is already so."""
        reply = decision.reply
        if isinstance(reply, ErrorReply):
            if reply.code == "swap_in_flight":
                assert snap.phase == Phase.UNKNOWN or snap.phase in IN_FLIGHT, (reply, snap)
            else:
                assert reply.code == "incumbent_busy", reply
                # At work: leases, traffic past the router, or /slots that do not answer
                # (a stalled resident: fail closed).
                at_work = self.gpu.bypassed.keys() | self.gpu.stalled
                assert snap.serving(snap.resident) or snap.resident in at_work, (reply, snap)
            return
        if already is not None and snap.resident == already:
            return  # the member asked for is resident already: nothing to do
        assert decision.swap is not None, (decision, snap)

    @rule(
        action=st.sampled_from(["acquire", "tick", "admin_swap", "admin_unload"]),
        member=st.sampled_from(MEMBERS),
        client=st.sampled_from(CLIENT_IDS),
    )
    def grant_lands_before_a_decision_applies(self, action: str, member: str, client: str) -> None:
        """Another handler grants a lease on the resident (the one-round-trip grant)
        between a decision's snapshot and its write, as concurrent controllers do: a
        decision made on the snapshot without that lease must not start unloading the
        resident (the write's zero-lease precondition refuses it; decided again, it sees
        the lease)."""
        original = self.store.commit
        raced: list[str] = []

        async def commit(decision: Decision):  # type: ignore[no-untyped-def]
            if not raced:
                raced.append("done")
                await self._grant_resident(client)
            return await original(decision)

        self.store.commit = commit  # type: ignore[method-assign]
        try:
            if action == "acquire":
                self.acquire(member, PoolActivation.WAIT, "c1", client)
            elif action == "tick":
                self.tick("c2")
            elif action == "admin_swap":
                self.admin_swap(member, "c2")
            else:
                self.admin_unload("c2")
        finally:
            del self.store.commit

    async def _grant_resident(self, client: str) -> None:
        snap = await self.store.snapshot()
        resident = snap.resident
        if resident is None:
            return
        self.n += 1
        lease_id, attempt = f"L{self.n}", f"fast{self.n}"
        granted = await self.store.grant_if_resident(
            resident, lease_id, attempt, "r", request_id=client
        )
        if granted is None:
            return
        assert self.gpu.ready(resident), f"granted {resident}, GPU: {self.gpu.loaded}"
        expiry = self.clock.ms + self.policy.lease_ttl_ms
        self.leases[lease_id] = Held(
            resident, attempt, client, granted.epoch, expiry, self.clock.ms
        )

    # --- faults ---------------------------------------------------------------------

    @precondition(lambda self: self.policy.busy_signal == BusySignal.LEASES_AND_SLOTS)
    @rule(member=st.sampled_from(MEMBERS), busy=st.booleans())
    def bypass_traffic(self, member: str, busy: bool) -> None:
        """A client talks to a loaded member directly (no lease): only /slots show it."""
        if busy:
            self.gpu.bypass(member)
        else:
            self.gpu.bypassed.pop(member, None)

    @rule()
    def redis_flushed(self) -> None:
        """Redis restarts empty: every key of the pool is gone (leases, waiters, state).
        Live routers renew their leases back while the rebuilt state relearns (a lease
        TTL); a renewal refused after that ends its stream with an error (nothing cut).
        A restart takes a moment: epochs issued after it (from the store's clock) are
        above those issued before, which a clock that stood still would not give."""
        self.run(self.store.reset())
        for held in self.leases.values():
            held.forgotten = True
        for waiter in self.waiting.values():
            waiter.since_ms = None
        self.advance(RESTART_MS)

    @rule(crash=st.booleans())
    def resident_stops_answering(self, crash: bool) -> None:
        """The resident stalls (alive, silent) or crashes (gone); then a health check."""
        snap = self.snapshot()
        if snap.resident is None or snap.phase not in {Phase.IDLE, Phase.DRAINING}:
            return
        if snap.resident not in self.gpu.loaded:
            return
        if crash:
            self.gpu.crash(snap.resident)
        else:
            self.gpu.stall(snap.resident)
        self.health_check()

    @rule()
    def resident_answers_again(self) -> None:
        self.gpu.stalled.clear()
        self.health_check()

    def health_check(self) -> None:
        """What PoolRuntime.check_resident decides after its threshold of failures."""
        snap = self.snapshot()
        resident = snap.resident
        if resident is None or snap.phase not in {Phase.IDLE, Phase.DRAINING}:
            return
        if self.gpu.ready(resident):
            self.decide(lambda s: decide_resident_health(s, resident, healthy=True))
            return
        if not snap.serving(resident):
            lost = self.decide(lambda s: decide_resident_lost(s, resident, "health"))
            if lost.audit and resident in self.gpu.loaded:
                self.zombies.add(resident)
            return
        if resident not in self.gpu.loaded:  # the driver confirms it gone
            decision = self.decide(lambda s: decide_resident_lost(s, resident, "gone", revoke=True))
            if decision.audit:
                self.revoked.add(resident)
                self.leases = {k: v for k, v in self.leases.items() if v.member != resident}
            return
        self.decide(lambda s: decide_resident_health(s, resident, healthy=False))

    # --- invariants -------------------------------------------------------------------

    @invariant()
    def never_two_residents(self) -> None:
        assert len(self.gpu.loaded) <= 1, self.gpu.loaded

    @invariant()
    def idle_state_matches_the_gpu(self) -> None:
        snap = self.snapshot()
        if snap.phase in {Phase.IDLE, Phase.DRAINING} and not self.swaps:
            expected = {snap.resident} if snap.resident else set()
            # A member taken for lost while alive still holds the GPU until the next swap
            # unloads it (and no load happens beside it: SimGpu.load checks that).
            self.zombies &= self.gpu.loaded
            assert self.gpu.loaded <= expected | self.zombies, (snap, self.gpu.loaded)
            if snap.resident is not None and not snap.unhealthy:
                assert snap.resident in self.gpu.loaded or not self.serving(), (
                    "a serving resident the GPU does not hold"
                )
        assert all(v >= 0 for v in snap.leases.values())

    @invariant()
    def the_store_counts_the_routers_leases(self) -> None:
        snap = self.snapshot()
        if snap.phase == Phase.UNKNOWN:
            return
        for member in MEMBERS:
            held = sum(
                1
                for h in self.leases.values()
                if h.member == member and not h.forgotten and h.expiry_ms > self.clock.ms
            )
            assert snap.live_leases(member) == held, (member, snap.leases, self.leases)

    @invariant()
    def count_closes(self) -> None:
        """Counts the resident's closes (``maxWait``), by a tick or by a request."""
        closed = self.snapshot().closed
        ControllerMachine.events["maxWait close"] += closed and not self.closed
        self.closed = closed

    @invariant()
    def waiters_never_exceed_the_cap(self) -> None:
        assert self.snapshot().total_waiters <= POLICY.max_waiters

    @invariant()
    def no_waiter_is_held_past_its_budget(self) -> None:
        """The store counts no waiter whose router's hold budget ran out (it answered the
        request, its cancel lost): each member's live waiters are among the requests
        still within their budget."""
        snap = self.snapshot()
        for member in MEMBERS:
            within = sum(
                1
                for w in self.waiting.values()
                if w.member == member and w.deadline_ms > self.clock.ms
            )
            assert snap.live_waiters(member) <= within, (member, snap.waiters, self.waiting)

    def every_swap_ended_once(self) -> None:
        """At the end, each swap started has its one end in the audit, unless the store
        still holds it in flight (or its owner was killed or frozen and nobody took it
        over)."""
        if self.snapshot().phase == Phase.UNKNOWN:
            self.rebuild()
        if self.swaps:  # a runner whose swap the store lost finds out at its next heartbeat
            self.advance(HEARTBEAT_LAPSES_MS)
        while not all(task.done() for task in self.endings):
            self.advance(TIME_STEP_MS)
        snap = self.snapshot()
        in_flight = snap.swap_id if snap.phase in IN_FLIGHT else None
        self.book.check(in_flight, self.unowned)

    def quiesce(self) -> None:
        """Thaw, answer the GPU, release every live router's lease, let dead routers'
        leases lapse (and be reaped) and the pool settle: every waiter must then be
        answered."""
        self.gpu.stalled.clear()
        self.gpu.bypassed.clear()
        self.health_check()
        for lease_id, held in list(self.leases.items()):
            if held.alive:
                self.release_lease(lease_id)
        if self.leases:
            self.advance(max(h.expiry_ms for h in self.leases.values()) - self.clock.ms)
            self.reap()
        assert not self.leases, self.leases
        for _ in range(200):
            if self.snapshot().relearning:
                self.advance(RELEARN_MS)
            if not self.waiting:
                return
            self.tick("c1")
            if not self.swaps and self.snapshot().phase in IN_FLIGHT:
                # A dead owner's swap: its heartbeat lapses, the next tick takes it over.
                self.advance(HEARTBEAT_LAPSES_MS)
            while self.driver.pending:
                self.step(self.driver.pending[0])
            for waiter in list(self.waiting.values()):
                self._ask(waiter, "c1")
            for lease_id, held in list(self.leases.items()):
                self.run(self.store.release(held.member, lease_id))
            self.leases.clear()
        raise AssertionError(f"waiters never answered: {self.waiting} {self.snapshot()}")


@pytest.fixture
def machine(redis_server: Managed) -> type[ControllerMachine]:
    ControllerMachine.redis_url = redis_server.url
    return ControllerMachine


def run_to_quiescence(
    machine: type[ControllerMachine], *, examples: int, steps: int, derandomize: bool = False
) -> None:
    """Run ``machine``; every run ends by quiescing the pool, so the invariants also hold
    for the state it settles in. ``derandomize``: the same examples at every run (for a
    test that also asserts what the run reached)."""

    class Checked(machine):  # type: ignore[misc, valid-type]
        def teardown(self) -> None:
            # A takeover after a controller death needs a tick with a lapsed heartbeat.
            self.quiesce()
            self.every_swap_ended_once()
            super().teardown()

    Checked.TestCase.settings = settings(
        derandomize=derandomize,
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    with no_local_constants() if derandomize else contextlib.nullcontext():
        Checked.TestCase().runTest()


@contextlib.contextmanager
def no_local_constants() -> Iterator[None]:
    """Hypothesis now and then draws a literal it found in the project's modules loaded in
    the process, so the same derandomized examples differ between a test run alone and
    in the whole suite (and change with any literal added anywhere): without those, they
    are the same wherever they run. (Hypothesis internals, pinned by the lock file.)"""
    original = providers._get_local_constants
    providers._get_local_constants = Constants
    providers.CONSTANTS_CACHE.cache.clear()  # what earlier runs drew from the loaded modules
    try:
        yield
    finally:
        providers._get_local_constants = original
        providers.CONSTANTS_CACHE.cache.clear()


def test_controller_transitions_keep_the_contract(machine: type[ControllerMachine]) -> None:
    """Random interleavings, faults included, never load two members, never unload one a
    router still holds a lease on, grant only the member the GPU holds, answer all."""
    run_to_quiescence(machine, examples=80, steps=40)


def test_controller_transitions_keep_the_contract_with_slots(
    machine: type[ControllerMachine],
) -> None:
    """The same under busySignal leasesAndSlots, with traffic that bypasses the router:
    a member whose /slots are busy is never unloaded either (no admin force here)."""

    class WithSlots(machine):  # type: ignore[misc, valid-type]
        policy = replace(POLICY, busy_signal=BusySignal.LEASES_AND_SLOTS)

    run_to_quiescence(WithSlots, examples=40, steps=40)


def test_controller_transitions_keep_the_contract_with_max_wait(
    machine: type[ControllerMachine],
) -> None:
    """The same with the scheduler closing a busy resident once another member waited
    ``maxWait`` (2 s, a resident staying at least ``minResidency``, 1 s; docs/adr/0006):
    closing stops new grants, never a lease; it happens at the first tick once due; every
    waiter, the closed resident's own included, is still answered."""
    run_to_quiescence(closing(machine), examples=40, steps=40)


def closing(machine: type[ControllerMachine]) -> type[ControllerMachine]:
    """``machine`` with ``maxWait`` 2 s and ``minResidency`` 1 s."""

    class Closing(machine):  # type: ignore[misc, valid-type]
        policy = replace(machine.policy, max_wait_ms=2000, min_residency_ms=1000)

    return Closing


TIMED_EVENTS = (
    "expired lease reaped",
    "waiter timed out",
    "asked after a backoff lapsed",
    "swap timed out",
)
"""What short clocks make happen inside runs, that the machines count."""


def test_short_clocks_lapse_inside_runs(machine: type[ControllerMachine]) -> None:
    """On examples that are the same at every run, time passing inside the runs makes
    dead routers' leases expire (and be reaped), waiters time out, backoffs lapse, swaps
    time out and ``maxWait`` close busy residents: asserted, not hoped for."""
    ControllerMachine.events.clear()
    run_to_quiescence(closing(machine), examples=100, steps=60, derandomize=True)
    print(dict(ControllerMachine.events))
    for event in (*TIMED_EVENTS, "maxWait close", "state change announced"):
        assert ControllerMachine.events[event] > 0, (event, ControllerMachine.events)


def test_machine_detects_two_residents_and_a_cut() -> None:
    """The simulated GPU's checks can fail: a load beside another member trips one, an
    unload of a member that a router still holds a lease on trips the other."""
    gpu = SimGpu()
    gpu.load("a", 1)
    with pytest.raises(AssertionError):
        gpu.load("b", 2)
    gpu.serving = {"a"}
    with pytest.raises(AssertionError, match="while it served"):
        gpu.unload("a", 3)


def _checked(machine: ControllerMachine) -> None:
    for check in (
        machine.never_two_residents,
        machine.idle_state_matches_the_gpu,
        machine.the_store_counts_the_routers_leases,
        machine.waiters_never_exceed_the_cap,
    ):
        check()


def _settle_swaps(machine: ControllerMachine, *, but: Swap | None = None) -> None:
    """Let every driver command through (but those of ``but``) until no swap is left."""
    while held := [c for c in machine.driver.pending if but is None or c.swap != but.key]:
        machine.step(held[0])
        _checked(machine)


def test_known_fault_sequences_keep_the_contract(machine: type[ControllerMachine]) -> None:
    """The fault paths random search reaches only now and then, spelled out: the store
    flushed under a lease, then demand for another member (the resident must stay busy
    until the lease is renewed back); a resident stalled under a lease when the store is
    flushed (it must be rebuilt as the unhealthy resident, not taken for gone); a swap
    owner frozen past its heartbeat that thaws after another replica finished its swap
    (its stale command must be refused)."""
    wait = PoolActivation.WAIT
    m = machine()
    try:
        m.start()
        m.tick("c1")
        _settle_swaps(m)
        m.acquire("a", wait, "c1", "client-1")  # a stream on a
        m.redis_flushed()
        m.tick("c1")  # rebuilt: a resident, relearning
        m.acquire("b", wait, "c2", "client-2")
        m.tick("c1")
        _settle_swaps(m)  # no swap may unload a while its lease is live
        for lease_id in sorted(m.leases):
            m.renew_lease(lease_id)
        m.quiesce()
    finally:
        m.teardown()
    m = machine()
    try:
        m.start()
        m.tick("c1")
        _settle_swaps(m)
        m.acquire("a", wait, "c1", "client-1")
        m.gpu.stall("a")
        m.redis_flushed()
        m.tick("c2")
        assert m.snapshot().unhealthy, "a stalled member rebuilt as healthy"
        m.acquire("b", wait, "c2", "client-2")
        m.tick("c1")
        _settle_swaps(m)
        _checked(m)
        m.quiesce()
    finally:
        m.teardown()
    m = machine()
    try:
        m.start()
        m.tick("c1")
        _settle_swaps(m)
        m.acquire("b", wait, "c1", "client-1")
        m.tick("c1")
        (stale,) = m.swaps  # held at its first unload: frozen past its ownership check
        m.controller_dies_now(stale.owner, frozen=True)
        m.advance(HEARTBEAT_LAPSES_MS)  # its heartbeat lapses
        m.tick("c2")  # takes the swap over under a newer epoch
        _settle_swaps(m, but=stale)
        _answer_and_release(m)  # b's request is served
        m.acquire("a", wait, "c2", "client-2")
        m.tick("c2")
        _settle_swaps(m, but=stale)
        for waiter in list(m.waiting.values()):
            m._ask(waiter, "c2")  # a is resident now: its waiter gets a lease and streams
        assert {held.member for held in m.leases.values()} == {"a"}
        _settle_swaps(m)  # thaws: its unload of a on the old epoch is refused by the fence
        assert stale.task.done()
        assert stale.task.result() == "lost"
        _checked(m)
        m.quiesce()
    finally:
        m.teardown()


def _answer_and_release(machine: ControllerMachine) -> None:
    """Every waiting request asks again (and is granted, the pool being warm for it), and
    its stream ends."""
    for waiter in list(machine.waiting.values()):
        machine._ask(waiter, "c2")
    for lease_id in sorted(machine.leases):
        machine.release_lease(lease_id)


def with_slots(machine: type[ControllerMachine]) -> type[ControllerMachine]:
    """``machine`` under busySignal leasesAndSlots."""

    class WithSlots(machine):  # type: ignore[misc, valid-type]
        policy = replace(machine.policy, busy_signal=BusySignal.LEASES_AND_SLOTS)

    return WithSlots


@contextlib.contextmanager
def warm(machine: type[ControllerMachine]) -> Iterator[ControllerMachine]:
    """A machine of ``machine`` whose pool warmed its default member, torn down after."""
    m = machine()
    try:
        m.start()
        m.tick("c1")
        _settle_swaps(m)
        yield m
    finally:
        m.teardown()


def test_a_swap_reads_the_slots_of_every_member_it_unloads(
    machine: type[ControllerMachine],
) -> None:
    """Under leasesAndSlots, traffic that bypasses the router on a member a swap is about
    to unload is seen by the swap's own /slots read and not cut: here on the resident
    (its traffic began after the drain check, and the swap's owner died: the replica
    that takes it over reads again) and on a member a failed unload left loaded (no
    longer the state's resident)."""
    wait = PoolActivation.WAIT
    with warm(with_slots(machine)) as m:  # a resident
        m.acquire("b", wait, "c1", "client-1")  # a idle: the swap to b starts
        m.controller_dies_now("c1")
        m.bypass_traffic("a", busy=True)  # a client talks to a directly, meanwhile
        m.advance(HEARTBEAT_LAPSES_MS)  # its heartbeat lapses
        m.tick("c2")  # takes the swap over
        _settle_swaps(m)
        assert "a" in m.gpu.loaded, "a's traffic was cut"
        assert m.snapshot().resident == "a"
        m.quiesce()
    with warm(with_slots(machine)) as m:  # a resident
        m.acquire("b", wait, "c1", "client-1")
        (unload_a,) = [c for c in m.driver.pending if c.member == "a"]
        m.driver.open(unload_a, fail=True)  # the swap fails; a is left loaded
        m.settle()
        _settle_swaps(m)
        assert "a" in m.gpu.loaded
        assert m.snapshot().resident is None
        m.bypass_traffic("a", busy=True)
        m.acquire("c", wait, "c1", "client-2")
        m.tick("c1")
        _settle_swaps(m)
        assert "a" in m.gpu.loaded, "a's traffic was cut"
        m.quiesce()


def test_an_unanswered_slots_read_before_an_unload_is_a_read(
    machine: type[ControllerMachine],
) -> None:
    """A resident that stalls with nothing on it is taken for lost (still loaded), and an
    operator empties the GPU: the swap reads its /slots right before the unload and gets
    no answer (a member out of service that does not answer is unloaded: that is how it
    is recovered, decisions/busy.py ``at_work``). It answers again, and a client talks
    to it directly, before the unload lands: that traffic began after the swap's read,
    as it can after a read that found a member idle, and the GPU must not take the
    unload for one of a member whose /slots were never read."""
    with warm(with_slots(machine)) as m:  # a resident
        m.resident_stops_answering(crash=False)
        assert m.snapshot().resident is None, "a stalled idle resident is lost"
        m.admin_unload("c1")
        assert [c for c in m.driver.pending if c.member == "a" and c.kind == "unload"]
        m.resident_answers_again()
        m.bypass_traffic("a", busy=True)
        _settle_swaps(m)
        assert "a" not in m.gpu.loaded
        m.quiesce()


def test_a_swap_still_unloading_turns_to_a_more_urgent_member(
    machine: type[ControllerMachine],
) -> None:
    """a resident and idle: b's request starts a swap; while it unloads, c's priority 5
    request comes. Right before the load the swap takes c as its target: it unloads b too
    (a member it did not unload as its target may hold memory) and loads c, never b;
    b's request is still held, and served by a later swap."""
    wait = PoolActivation.WAIT
    with warm(machine) as m:  # a resident
        m.acquire("b", wait, "c1", "client-1")
        m.acquire("c", wait, "c1", "client-2", priority=5)
        commands: list[tuple[str, str]] = []
        while m.driver.pending:
            command = m.driver.pending[0]
            commands.append((command.kind, command.member))
            m.step(command)
            _checked(m)
        assert commands[-2:] == [("unload", "b"), ("load", "c")], commands
        assert ("load", "b") not in commands, commands
        assert m.snapshot().resident == "c"
        assert [w.member for w in m.waiting.values()] == ["b", "c"]  # c's asks again now
        m.quiesce()


def test_a_swap_the_store_lost_is_ended_once(machine: type[ControllerMachine]) -> None:
    """Redis restarts empty while a swap unloads: its owner finds its claim gone while the
    claim still held, and once the pool is rebuilt it ends the swap in the audit
    (``swap_cancelled``, ``pool_state_lost``), once. A frozen owner whose swap another
    replica took over and finished before the store lost the state sends no second end
    when it thaws: its claim had lapsed, so the swap may have been ended by another."""
    wait = PoolActivation.WAIT
    with warm(machine) as m:  # a resident
        m.acquire("b", wait, "c1", "client-1")  # the swap to b, held at its first unload
        (swap,) = m.swaps
        m.redis_flushed()  # its heartbeat reads the pool unknown
        m.tick("c2")  # rebuilt from the GPU
        m.advance(TIME_STEP_MS * 10)  # the owner reads the rebuilt pool
        (end,) = m.book.end_intents[swap.order.swap_id]
        assert (end.outcome, end.reason) == (PoolOutcome.SWAP_CANCELLED, "pool_state_lost")
        assert end.event_id, "an end several owners may send has the id they all derive"
        m.quiesce()
        m.every_swap_ended_once()
    with warm(machine) as m:
        m.acquire("b", wait, "c1", "client-1")
        (stale,) = m.swaps
        m.controller_dies_now(stale.owner, frozen=True)
        m.advance(HEARTBEAT_LAPSES_MS)  # its claim lapses
        m.tick("c2")  # taken over under a newer epoch
        _settle_swaps(m, but=stale)  # and finished: swap_completed
        (end,) = m.book.end_intents[stale.order.swap_id]
        assert end.outcome == PoolOutcome.SWAP_COMPLETED
        m.redis_flushed()
        m.tick("c2")
        _settle_swaps(m)  # the frozen owner thaws and finds the pool rebuilt
        assert stale.task.done()
        assert stale.task.result() == "lost"
        m.advance(TIME_STEP_MS * 10)
        assert len(m.book.ends[stale.order.swap_id]) == 1, m.book.end_intents
        m.quiesce()
        m.every_swap_ended_once()
