"""The controller's state machine (tests/controller/test_stateful.py) on a capacity pool
(docs/adr/0008): the same requests, swap steps and faults, on a simulated GPU of 24 GiB
whose members take 8, 10 and 14 GiB, so any two of them fit together and the third
needs one evicted.

Invariants, besides those the one-resident machine checks that still apply:

- never over capacity: the members the GPU holds never declare more than its memory (a
  load beside too much trips the GPU), and the store never counts more held than that;
- never a busy member evicted: an unload of a member a router holds a lease on trips
  the GPU (as in the one-resident machine);
- every grant is for a member of the residency set that the GPU holds and that answers
  (and that `maxWait` did not close);
- a pinned member, once resident, is never unloaded while the pool is not emptied by an
  admin;
- at the end every waiting request is answered: granted, skipped (IfIdle), or refused
  with an error the contract allows.

A plan may load several members at once (those with waiters that fit together beside
the set less its evicts): the GPU checks their sum at every load, whatever the order in
which the machine lets their loads through, and the machine counts the plans that did
(:attr:`CapacityMachine.several`): a run prints what it reached, and the run on a GPU
where any two members fit asserts it, on examples that are the same at every run.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from hotseat.launcher import Managed
from hotseat_common.config.model import PoolActivation
from hotseat_common.messages import (
    ErrorReply,
    PoolOutcome,
)
from hotseat_pool_controller.decisions.admin import decide_admin_swap, decide_admin_unload
from hotseat_pool_controller.decisions.capacity import (
    decide_member_health,
    decide_member_lost,
)
from hotseat_pool_controller.decisions.recovery import decide_rebuild
from hotseat_pool_controller.decisions.start import next_epoch
from hotseat_pool_controller.model import Phase, PoolPolicy, PoolSnapshot, SwapOrder
from tests.controller.test_stateful import (
    HEARTBEAT_LAPSES_MS,
    MEMBERS,
    POLICY,
    RELEARN_MS,
    TIMED_EVENTS,
    Command,
    ControllerMachine,
    GatedDriver,
    SimGpu,
    _answer_and_release,
    _settle_swaps,
    run_to_quiescence,
    warm,
    with_slots,
)

pytestmark = pytest.mark.timeout(600)

CAPACITY_GIB = 24.0
MEMORY = {"a": 8.0, "b": 10.0, "c": 14.0}
CAPACITY_POLICY = replace(POLICY, capacity_gib=CAPACITY_GIB, memory_gib=MEMORY)
PAIRS = {"a": 6.0, "b": 8.0, "c": 10.0}


class CapacityGpu(SimGpu):
    """A GPU that holds members while their memory fits (never more: a load beside too
    much trips it); an unload of a member a router holds a lease on trips it too."""

    def __init__(self, policy: PoolPolicy = CAPACITY_POLICY) -> None:
        super().__init__()
        self.memory = dict(policy.memory_gib)
        self.capacity = policy.capacity_gib or 0.0
        self.unloads: list[str] = []
        """Members an unload took off the GPU, in order."""

    def unload(self, member: str, epoch: int) -> bool:
        was_loaded = member in self.loaded
        done = super().unload(member, epoch)
        if done and was_loaded:
            self.unloads.append(member)
        return done

    def load(self, target: str, epoch: int) -> bool:
        if not self.accept(epoch):
            return False
        held = sum(self.memory[m] for m in self.loaded | {target})
        assert held <= self.capacity, f"load of {target} beside {self.loaded}: {held} GiB"
        self.loaded.add(target)
        return True


class CapacityMachine(ControllerMachine):
    policy = CAPACITY_POLICY
    several = 0
    """Plans that loaded several members at once, over every run of this class."""
    together = 0
    """Times two loads of one plan were under way on the GPU at the same moment."""

    def __init__(self) -> None:
        super().__init__()
        self.gpu = CapacityGpu(self.policy)
        self.driver = GatedDriver(self.gpu, self.serving)
        self.emptied = False
        """An admin emptied the pool (pinned members go too)."""
        self.lost: set[str] = set()
        """Members taken for lost after their health checks failed."""
        self.also: dict[int, tuple[str, ...]] = {}
        """epoch -> the other members the plan of that epoch loads beside its target."""

    def start_swap(self, order: SwapOrder, owner: str, *, claimed_at: float | None = None) -> None:
        also = self.snapshot().also
        if also and order.epoch not in self.also:
            CapacityMachine.several += 1
        self.also[order.epoch] = also
        super().start_swap(order, owner, claimed_at=claimed_at)

    def settle(self) -> None:
        """As the one-resident machine's, and a plan of several that failed failed for
        each of its members not loaded (their backoff, like its target's)."""
        running = list(self.swaps)
        super().settle()
        for swap in running:
            if swap in self.swaps or swap.task.cancelled():
                continue
            if swap.task.result() == "failed":
                for member in self.also.get(swap.order.epoch, ()):
                    self.fail(member)
        plans = [c.swap for c in self.driver.pending if c.kind == "load"]
        if len(plans) > len(set(plans)):  # two loads of one plan, under way at once
            CapacityMachine.together += 1

    @precondition(lambda self: self.driver.pending)
    @rule(data=st.data())
    def fail_swap(self, data: st.DataObject) -> None:
        """A driver command fails; a load that fails fails its member alone when it is one
        of several its plan loads (the others go on)."""
        command = data.draw(st.sampled_from(self.driver.pending))
        if command.kind == "load":
            self.fail(command.member)
        self.broken.add(command.swap)
        self.driver.open(command, fail=True)
        self.settle()

    def rebuild(self) -> None:
        snap = self.snapshot()
        if snap.phase != Phase.UNKNOWN:
            return
        self.gpu.accept(next_epoch(snap))
        on_gpu = tuple(sorted(self.gpu.loaded))
        unready = frozenset(m for m in on_gpu if not self.gpu.ready(m))
        self.decide(
            lambda s: decide_rebuild(
                s, on_gpu, relearn_ms=RELEARN_MS, capacity=True, unwell=unready
            )
        )

    def assert_grantable(self, member: str, after: PoolSnapshot) -> None:
        assert member in after.residents, "granted a member not in the set"
        assert member not in after.unwell, "granted a member that fails its checks"
        assert member not in after.closing, "granted a member closed by maxWait"

    @rule(member=st.sampled_from(MEMBERS), controller=st.sampled_from(["c1", "c2"]))
    def admin_swap(self, member: str, controller: str) -> None:
        decision = self.decide_busy(
            lambda s, busy: decide_admin_swap(s, member, controller, self.policy, slots_busy=busy)
        )
        if isinstance(decision.reply, ErrorReply) and decision.reply.code == "incumbent_busy":
            snap = self.snapshot()
            at_work = self.gpu.bypassed.keys() | self.gpu.stalled
            assert any(
                snap.serving(m) or snap.live_waiters(m) or m in at_work
                for m in snap.residents | set(snap.evicts)
            )

    @rule(controller=st.sampled_from(["c1", "c2"]))
    def admin_unload(self, controller: str) -> None:
        decision = self.decide_busy(
            lambda s, busy: decide_admin_unload(s, controller, self.policy, slots_busy=busy)
        )
        if decision.swap is not None:
            self.emptied = True

    @rule(crash=st.booleans(), data=st.data())
    def resident_stops_answering(self, crash: bool, data: st.DataObject) -> None:  # type: ignore[override]
        snap = self.snapshot()
        candidates = sorted(m for m in snap.residents if m in self.gpu.loaded)
        if not candidates:
            return
        member = data.draw(st.sampled_from(candidates))
        if crash:
            self.gpu.crash(member)
        else:
            self.gpu.stall(member)
        self.health_check()

    def health_check(self) -> None:
        """What Recovery._check_residents decides after its threshold of failures."""
        snap = self.snapshot()
        for member in sorted(snap.residents):
            if self.gpu.ready(member):
                if member in snap.unwell:
                    self.decide(lambda s, m=member: decide_member_health(s, m, healthy=True))
                continue
            if not snap.serving(member):
                lost = self.decide(lambda s, m=member: decide_member_lost(s, m, "health"))
                if lost.audit:
                    self.lost.add(member)
            elif member not in self.gpu.loaded:  # the driver confirms it gone
                decision = self.decide(
                    lambda s, m=member: decide_member_lost(s, m, "gone", revoke=True)
                )
                if decision.audit:
                    self.lost.add(member)
                    self.revoked.add(member)
                    self.leases = {k: v for k, v in self.leases.items() if v.member != member}
            else:
                self.decide(lambda s, m=member: decide_member_health(s, m, healthy=False))

    @rule(controller=st.sampled_from(["c1", "c2"]))
    def tick(self, controller: str) -> None:
        """The supervisor's tick; a member unwell whose last lease ended is lost by it."""
        before = self.snapshot().unwell
        super().tick(controller)
        self.lost |= before - self.snapshot().residents

    def never_two_residents(self) -> None:
        """Several residents are the point here: :meth:`never_over_capacity` instead."""

    def idle_state_matches_the_gpu(self) -> None:
        """Checked by :meth:`the_set_matches_the_gpu` instead."""

    # Hypothesis collects invariants by the decorator's mark: redefining the methods above
    # without it drops the one-resident checks from this machine.

    @invariant()
    def never_over_capacity(self) -> None:
        memory, capacity = self.policy.memory_gib, self.policy.capacity_gib or 0.0
        assert sum(memory[m] for m in self.gpu.loaded) <= capacity, self.gpu.loaded
        snap = self.snapshot()
        # What the store has committed to hold: the set, and once a plan loads its target
        # (its evicts confirmed gone), the target and any member lost meanwhile. Members
        # left to confirm gone are counted apart: every plan unloads them before it loads.
        committed = set(snap.residents)
        if snap.phase == Phase.LOADING and snap.target:
            committed |= {snap.target, *snap.also, *snap.evicts}
        assert sum(memory[m] for m in committed) <= capacity, snap

    @invariant()
    def the_set_matches_the_gpu(self) -> None:
        """With no plan running, the GPU holds the set and what is still to be confirmed
        gone; a member the set holds and a router leases is on the GPU."""
        snap = self.snapshot()
        if snap.phase in {Phase.IDLE, Phase.DRAINING} and not self.swaps:
            assert self.gpu.loaded <= snap.residents | set(snap.evicts), (snap, self.gpu.loaded)
        for held in self.leases.values():
            if self.lease_live(held) and not held.forgotten and held.member not in self.revoked:
                assert held.member in self.gpu.loaded, (held, self.gpu.loaded)

    @invariant()
    def pinned_members_stay(self) -> None:
        """A pinned member leaves the GPU only when an admin empties the pool or it was
        lost (crashed or stalled, then confirmed gone by an unload)."""
        for member in self.gpu.unloads:
            if member in self.policy.pinned:
                assert self.emptied or member in self.lost, f"pinned {member} evicted"


@pytest.fixture
def machine(redis_server: Managed) -> type[CapacityMachine]:
    CapacityMachine.redis_url = redis_server.url
    return CapacityMachine


def test_capacity_pool_keeps_the_contract(machine: type[CapacityMachine]) -> None:
    """Random interleavings of requests, plans, faults and takeovers on a capacity pool:
    never over capacity, never a busy member evicted, grants only for the set, every
    waiter answered."""
    CapacityMachine.several = CapacityMachine.together = 0
    run_to_quiescence(machine, examples=80, steps=40)
    print(
        f"plans of several members: {CapacityMachine.several}, "
        f"times two loads were under way together: {CapacityMachine.together}"
    )


def test_capacity_pool_where_any_two_fit_together_keeps_the_contract(
    machine: type[CapacityMachine],
) -> None:
    """The same on a 20 GiB GPU whose members take 6, 8 and 10 GiB: any two fit together
    from an empty pool, not all three, so plans of several members (and their loads
    under way together) come often, beside evictions."""

    class Pairs(machine):  # type: ignore[misc, valid-type]
        policy = replace(CAPACITY_POLICY, capacity_gib=20.0, memory_gib=PAIRS)

    CapacityMachine.several = CapacityMachine.together = 0
    ControllerMachine.events.clear()
    # The same examples at every run, so that what it reached is asserted, not hoped for.
    run_to_quiescence(Pairs, examples=150, steps=40, derandomize=True)
    print(
        f"plans of several members: {CapacityMachine.several}, "
        f"times two loads were under way together: {CapacityMachine.together}, "
        f"{dict(ControllerMachine.events)}"
    )
    assert CapacityMachine.several > 0, "no plan loaded several members at once"
    assert CapacityMachine.together > 0, "no two loads of a plan were under way together"
    for event in TIMED_EVENTS:  # short clocks lapse inside its runs too
        assert ControllerMachine.events[event] > 0, (event, ControllerMachine.events)


def test_capacity_pool_with_a_pinned_member_keeps_the_contract(
    machine: type[CapacityMachine],
) -> None:
    """The same with ``a`` pinned: it is never evicted for another member."""

    class Pinned(machine):  # type: ignore[misc, valid-type]
        policy = replace(CAPACITY_POLICY, pinned=frozenset({"a"}))

    run_to_quiescence(Pinned, examples=40, steps=40)


def test_capacity_pool_with_slots_keeps_the_contract(machine: type[CapacityMachine]) -> None:
    """The same under busySignal leasesAndSlots, with traffic that bypasses the router: a
    member at work by its /slots is never evicted either (read by the decision that
    plans its eviction, and again by the swap right before the unload)."""

    run_to_quiescence(with_slots(machine), examples=60, steps=40)


def test_capacity_gpu_trips_on_an_over_capacity_load() -> None:
    """The GPU's check can fail: b and c (24 GiB) fit, a beside them does not."""
    gpu = CapacityGpu()
    gpu.load("b", 1)
    gpu.load("c", 2)
    with pytest.raises(AssertionError, match="beside"):
        gpu.load("a", 3)
    assert PoolOutcome.SWAP_STARTED  # the events the machine's decisions emit exist


def test_a_member_at_work_for_bypassing_traffic_is_not_evicted(
    machine: type[CapacityMachine],
) -> None:
    """Under leasesAndSlots: a (the default) and b resident, b idle by its leases but at
    work for traffic that bypassed the router; c needs b gone. The plan's read finds b
    busy: the request is held, b stays. Once b is idle the plan starts, reading it idle;
    its owner dies, b gets traffic again meanwhile, and the replica that takes the plan
    over reads b again: b is not unloaded, and stays counted until it is idle."""
    wait = PoolActivation.WAIT
    with warm(with_slots(machine)) as m:  # a, the default, resident
        m.acquire("b", wait, "c1", "client-1")
        _settle_swaps(m)
        _answer_and_release(m)
        assert m.snapshot().residents == {"a", "b"}
        m.bypass_traffic("b", busy=True)
        m.acquire("c", wait, "c1", "client-2")
        m.tick("c2")
        assert not m.swaps
        assert "b" in m.snapshot().residents, "a plan started to evict b, at work"
        assert m.waiting
        m.bypass_traffic("b", busy=False)
        m.tick("c1")
        (plan,) = m.swaps
        assert plan.order.evicts == ("b",)
        m.controller_dies_now(plan.owner)
        m.bypass_traffic("b", busy=True)
        m.advance(HEARTBEAT_LAPSES_MS)  # its heartbeat lapses
        m.tick("c2")  # takes the plan over: reads b again
        _settle_swaps(m)
        assert "b" in m.gpu.loaded, "b's traffic was cut"
        snap = m.snapshot()
        assert "b" in snap.evicts, snap
        assert "b" not in snap.residents
        m.quiesce()  # its traffic ends: the next plan unloads it, and c loads


def _loading_a_and_c(m: CapacityMachine) -> Command:
    """An admin empties the pool; while its plan unloads a, requests for a and c come
    (22 GiB together): the next plan loads both at once. Returns c's load, pending."""
    wait = PoolActivation.WAIT
    m.admin_unload("c1")
    assert m.driver.pending
    m.acquire("a", wait, "c1", "client-1")
    m.acquire("c", wait, "c1", "client-2")
    _settle_swaps(m)  # the unload; the tick then plans a and c
    m.tick("c1")
    loads = sorted(c.member for c in m.driver.pending if c.kind == "load")
    assert loads == ["a", "c"], (loads, m.snapshot())
    (load_c,) = [c for c in m.driver.pending if c.kind == "load" and c.member == "c"]
    return load_c


def test_members_waiting_together_load_at_once(machine: type[CapacityMachine]) -> None:
    """An admin empties the pool; while its plan unloads a, requests for a and c come
    (22 GiB together): the next plan loads both at once, their two loads under way on
    the GPU together; each joins the set when its own load ends, and the other waiter
    is granted before the second load ends."""
    with warm(machine) as m:  # a, the default, resident
        m.step(_loading_a_and_c(m))
        snap = m.snapshot()
        assert "c" in snap.residents, snap
        assert "a" not in snap.residents, snap
        waiter_c = next(w for w in m.waiting.values() if w.member == "c")
        m._ask(waiter_c, "c2")
        assert waiter_c.attempt not in m.waiting, "c's waiter was not granted"
        _settle_swaps(m)
        assert m.snapshot().residents == {"a", "c"}
        assert m.gpu.loaded == {"a", "c"}
        m.quiesce()


def test_a_member_that_fails_beside_another_fails_alone(machine: type[CapacityMachine]) -> None:
    """The same two loads; c's fails: a still joins the set, c stays counted (its load
    may have taken memory) until a later plan unloads it, and c's waiter is told."""
    with warm(machine) as m:
        load_c = _loading_a_and_c(m)
        m.fail("c")
        m.driver.open(load_c, fail=True)
        m.settle()
        snap = m.snapshot()
        assert "c" in snap.evicts, snap
        assert "c" not in snap.residents, snap
        assert snap.phase == Phase.LOADING, snap
        _settle_swaps(m)
        snap = m.snapshot()
        assert snap.residents == {"a"}, snap
        assert "c" in snap.evicts, snap
        m.quiesce()


def test_members_waiting_together_load_at_once_only_as_far_as_they_fit(
    machine: type[CapacityMachine],
) -> None:
    """An admin empties the pool; while its plan unloads a, requests for a, b and c come
    (32 GiB together, the GPU has 24): the next plan loads a and b at once (18 GiB, a
    the most urgent), and c, which fits beside neither sum, waits for a later plan that
    evicts for it once they are idle."""
    wait = PoolActivation.WAIT
    with warm(machine) as m:  # a, the default, resident
        m.admin_unload("c1")
        for n, member in enumerate(("a", "b", "c")):
            m.acquire(member, wait, "c1", f"client-{n}")
        _settle_swaps(m)
        m.tick("c1")
        loads = sorted(c.member for c in m.driver.pending if c.kind == "load")
        assert loads == ["a", "b"], (loads, m.snapshot())
        _settle_swaps(m)  # the GPU checks the sum at each load
        assert m.snapshot().residents == {"a", "b"}
        m.quiesce()
        assert "c" in m.gpu.loaded


def test_a_takeover_resumes_only_the_loads_not_yet_committed(
    machine: type[CapacityMachine],
) -> None:
    """The plan loading a and c together: c is loaded and joins the set, then its owner
    dies with a's load under way. The replica that takes the plan over loads a alone (c
    is not loaded again), and the plan ends with both in the set."""
    with warm(machine) as m:
        load_c = _loading_a_and_c(m)
        (plan,) = m.swaps
        m.step(load_c)
        assert "c" in m.snapshot().residents
        m.controller_dies_now(plan.owner)
        m.advance(HEARTBEAT_LAPSES_MS)  # its heartbeat lapses
        m.tick("c2")  # takes the plan over, in loading
        resumed = [(c.kind, c.member) for c in m.driver.pending]
        assert resumed == [("load", "a")], resumed
        _settle_swaps(m)
        snap = m.snapshot()
        assert snap.residents == {"a", "c"}, snap
        assert snap.phase == Phase.IDLE, snap
        m.quiesce()
