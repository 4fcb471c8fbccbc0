"""Property test of the controller's transitions through the real Redis store.

A hypothesis state machine drives acquires (Wait and IfIdle), re-asks, releases, cancels,
lease expiries, supervisor ticks, swap steps, swap failures and controller deaths in any
order, against a simulated GPU that refuses commands of an older epoch (like the sim
backend). Invariants: never two members loaded, idle state agrees with the GPU, grants
only for the resident, and at the end every waiting request is answered.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, replace

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hotseat.launcher import Managed
from hotseat_common.config.model import BusySignal, PoolActivation
from hotseat_common.keys import Keys
from hotseat_common.messages import ErrorReply, Granted, IncumbentBusyReply, WaitReply
from hotseat_common.settings import RedisSettings
from hotseat_pool_controller.redis_link import RedisLink
from hotseat_pool_controller.state import (
    NOTHING,
    AcquireAsk,
    Decision,
    Phase,
    PoolPolicy,
    PoolSnapshot,
    SwapOrder,
    decide_acquire,
    decide_begin_load,
    decide_commit,
    decide_fail,
    decide_rebuild,
    decide_tick,
)
from hotseat_pool_controller.store import PoolStore

MEMBERS = ("a", "b", "c")
POLICY = PoolPolicy(
    name="gpu",
    members=MEMBERS,
    max_waiters=4,
    lease_ttl_ms=60_000,
    swap_timeout_ms=600_000,
    failure_backoff_ms=3_600_000,
    busy_signal=BusySignal.LEASES,
    default="a",
    # Wall-clock effects are made explicit rules (controller_dies), never left to timing:
    heartbeat_ttl_ms=3_600_000,
    waiter_grace_ms=3_600_000,
)


class SimGpu:
    """One GPU: at most what is loaded; commands of an older epoch are refused."""

    def __init__(self) -> None:
        self.loaded: set[str] = set()
        self.highest_epoch = 0

    def accept(self, epoch: int) -> bool:
        if epoch < self.highest_epoch:
            return False
        self.highest_epoch = epoch
        return True

    def unload_others(self, target: str, epoch: int) -> bool:
        if not self.accept(epoch):
            return False
        self.loaded &= {target}
        return True

    def load(self, target: str, epoch: int) -> bool:
        if not self.accept(epoch):
            return False
        assert not (self.loaded - {target}), f"load of {target} while {self.loaded} loaded"
        self.loaded.add(target)
        return True


@dataclass
class Swap:
    order: SwapOrder
    owner: str
    stage: int = 0  # 0 unload others, 1 begin load, 2 load, 3 commit


class ControllerMachine(RuleBasedStateMachine):
    redis_url = ""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.redis: aioredis.Redis = aioredis.from_url(self.redis_url, decode_responses=True)
        self.link = RedisLink(RedisSettings(redis_url=self.redis_url))
        self.store = PoolStore(self.link, Keys("p" + uuid.uuid4().hex[:10]), POLICY)
        self.gpu = SimGpu()
        self.leases: dict[str, tuple[str, str]] = {}  # lease id -> (member, request id)
        self.waiting: dict[str, tuple[str, PoolActivation]] = {}  # request id -> (member, mode)
        self.swaps: list[Swap] = []
        self.controllers = ["c1", "c2"]
        self.n = 0

    def run(self, coro):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.run(self.store.reset())
        self.run(self.redis.aclose())
        self.run(self.link.aclose())
        self.loop.close()

    def snapshot(self, request_id: str = "") -> PoolSnapshot:
        return self.run(self.store.snapshot(request_id))

    def decide(self, decide, request_id: str = "") -> Decision:  # type: ignore[no-untyped-def]
        decision, _ = self.run(self.store.decide(decide, request_id))
        if decision.swap is not None:
            self.swaps.append(Swap(decision.swap, owner=self.owner_of(decision)))
        return decision

    def owner_of(self, decision: Decision) -> str:
        fields = next((op.fields for op in decision.ops if hasattr(op, "fields")), {})
        return str(fields.get("owner", "c1"))

    @initialize()
    def start(self) -> None:
        self.decide(lambda s: decide_rebuild(s, ()))

    def _ask(self, member: str, mode: PoolActivation, request_id: str, controller: str) -> None:
        self.n += 1
        lease_id = f"L{self.n}"

        def decide(s: PoolSnapshot) -> Decision:
            ask = AcquireAsk(member, mode, request_id, "client", "r", s.now_ms + 600_000, lease_id)
            return decide_acquire(s, ask, POLICY, controller, slots_busy=None)

        decision = self.decide(decide, request_id)
        reply = decision.reply
        after = self.snapshot()
        if isinstance(reply, Granted):
            assert after.resident == member, "granted a member that is not resident"
            assert after.phase in {Phase.IDLE, Phase.DRAINING}
            self.leases[reply.lease_id] = (member, request_id)
            self.waiting.pop(request_id, None)
        elif isinstance(reply, WaitReply):
            self.waiting[request_id] = (member, mode)
        else:
            assert isinstance(reply, IncumbentBusyReply | ErrorReply)
            if isinstance(reply, IncumbentBusyReply):
                assert mode == PoolActivation.IF_IDLE
            self.waiting.pop(request_id, None)

    @rule(
        member=st.sampled_from(MEMBERS),
        mode=st.sampled_from(list(PoolActivation)),
        controller=st.sampled_from(["c1", "c2"]),
    )
    def acquire(self, member: str, mode: PoolActivation, controller: str) -> None:
        self.n += 1
        self._ask(member, mode, f"q{self.n}", controller)

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def reask(self, data: st.DataObject) -> None:
        request_id = data.draw(st.sampled_from(sorted(self.waiting)))
        member, mode = self.waiting[request_id]
        self._ask(member, mode, request_id, "c1")

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        lease_id = data.draw(st.sampled_from(sorted(self.leases)))
        member, _ = self.leases.pop(lease_id)
        assert self.run(self.store.release(member, lease_id)).removed

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def expire(self, data: st.DataObject) -> None:
        """A router died: its lease stops being renewed and is reaped."""
        lease_id = data.draw(st.sampled_from(sorted(self.leases)))
        member, _ = self.leases.pop(lease_id)
        key = self.store.keys.pool_leases(POLICY.name, member)
        self.run(self.redis.zadd(key, {lease_id: 1}, xx=True))
        reaped = self.run(self.store.reap())
        assert lease_id in {lease.lease_id for lease in reaped}

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        request_id = data.draw(st.sampled_from(sorted(self.waiting)))
        member, _ = self.waiting.pop(request_id)
        self.run(self.store.cancel(member, request_id))

    @rule(controller=st.sampled_from(["c1", "c2"]))
    def tick(self, controller: str) -> None:
        self.decide(lambda s: decide_tick(s, POLICY, controller))

    @precondition(lambda self: self.swaps)
    @rule(data=st.data())
    def step_swap(self, data: st.DataObject) -> None:
        swap = data.draw(st.sampled_from(self.swaps))
        epoch, target = swap.order.epoch, swap.order.target
        if swap.stage == 0:
            if not self.gpu.unload_others(target, epoch):
                self.swaps.remove(swap)
                return
        elif swap.stage == 1:
            snap = self.snapshot()
            if target and not snap.forced and snap.live_waiters(target) == 0:
                # No demand: the runner unloads a possibly half-loaded target first.
                if snap.epoch != epoch or snap.owner != swap.owner:
                    self.swaps.remove(swap)
                    return
                if not self.gpu.unload_others("", epoch):
                    self.swaps.remove(swap)
                    return
            lost = False

            def begin(s: PoolSnapshot) -> Decision:
                nonlocal lost
                d = decide_begin_load(s, epoch, swap.owner)
                lost = d is None
                return d or NOTHING

            decision = self.decide(begin)
            if lost or decision.audit:
                self.swaps.remove(swap)
                return
        elif swap.stage == 2:
            if target and not self.gpu.load(target, epoch):
                self.swaps.remove(swap)
                return
        else:
            self.swaps.remove(swap)
            self.decide(lambda s: decide_commit(s, epoch, swap.owner) or NOTHING)
            return
        swap.stage += 1

    @precondition(lambda self: self.swaps)
    @rule(data=st.data())
    def fail_swap(self, data: st.DataObject) -> None:
        swap = data.draw(st.sampled_from(self.swaps))
        self.swaps.remove(swap)
        snap = self.snapshot()
        if snap.epoch == swap.order.epoch and snap.owner == swap.owner and swap.order.target:
            self.gpu.unload_others("", swap.order.epoch)
        self.decide(
            lambda s: decide_fail(s, POLICY, swap.order.epoch, swap.owner, "boom") or NOTHING
        )

    @precondition(lambda self: self.swaps)
    @rule(data=st.data())
    def controller_dies(self, data: st.DataObject) -> None:
        """The owner vanishes mid-swap; its heartbeat is made to lapse."""
        swap = data.draw(st.sampled_from(self.swaps))
        self.swaps = [s for s in self.swaps if s.owner != swap.owner]
        state = self.store.keys.pool_state(POLICY.name)
        self.run(self.redis.hset(state, "heartbeat", "1"))

    @invariant()
    def never_two_residents(self) -> None:
        assert len(self.gpu.loaded) <= 1, self.gpu.loaded

    @invariant()
    def idle_state_matches_the_gpu(self) -> None:
        snap = self.snapshot()
        if snap.phase in {Phase.IDLE, Phase.DRAINING} and not self.swaps:
            expected = {snap.resident} if snap.resident else set()
            assert self.gpu.loaded <= expected | set(), (snap, self.gpu.loaded)
        assert all(v >= 0 for v in snap.leases.values())
        assert all(v >= 0 for v in snap.waiters.values())

    def quiesce(self) -> None:
        """Release everything and let the pool settle: every waiter must then be answered."""
        for lease_id, (member, _) in list(self.leases.items()):
            self.run(self.store.release(member, lease_id))
        self.leases.clear()
        for _ in range(200):
            if not self.waiting:
                return
            self.tick("c1")
            while self.swaps:
                self.step_swap_first()
            for request_id, (member, mode) in list(self.waiting.items()):
                self._ask(member, mode, request_id, "c1")
            for lease_id, (member, _) in list(self.leases.items()):
                self.run(self.store.release(member, lease_id))
            self.leases.clear()
        raise AssertionError(f"waiters never answered: {self.waiting} {self.snapshot()}")

    def step_swap_first(self) -> None:
        swap = self.swaps[0]
        self.step_swap_with(swap)

    def step_swap_with(self, swap: Swap) -> None:
        class _Data:
            def draw(self, _strategy: object) -> Swap:
                return swap

        self.step_swap(_Data())  # type: ignore[arg-type]


@pytest.fixture
def machine(redis_server: Managed) -> type[ControllerMachine]:
    ControllerMachine.redis_url = redis_server.url
    return ControllerMachine


def run_to_quiescence(machine: type[ControllerMachine], *, examples: int, steps: int) -> None:
    """Run ``machine``; every run ends by quiescing the pool, so the invariants also hold
    for the state it settles in."""

    class Checked(machine):  # type: ignore[misc, valid-type]
        def teardown(self) -> None:
            # A takeover after a controller death needs a tick with a lapsed heartbeat.
            self.quiesce()
            super().teardown()

    Checked.TestCase.settings = settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    Checked.TestCase().runTest()


def test_controller_transitions_keep_the_contract(machine: type[ControllerMachine]) -> None:
    """Random interleavings never load two members, never grant a non-resident, answer all."""
    run_to_quiescence(machine, examples=60, steps=40)


def test_machine_detects_two_residents() -> None:
    """The simulated GPU's check can fail: a load beside another member trips it."""
    gpu = SimGpu()
    gpu.load("a", 1)
    with pytest.raises(AssertionError):
        gpu.load("b", 2)
    assert replace(POLICY, max_waiters=1).max_waiters == 1
