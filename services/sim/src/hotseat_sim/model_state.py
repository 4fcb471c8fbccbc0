"""The simulated model's residency: a small state machine driven by the control API.

::

    unloaded --load--> loading --loadSeconds--> ready --unload--> unloading
       ^                  |                                            |
       |                  +--(admission refused: oom)--> failed        | unloadSeconds
       +------------------------------------------------------------- +

    any state --crash--> failed;  failed --unload--> unloaded;  failed --load--> loading

Loading reserves the member's memory on the simulated GPU first (the ledger admits it or
records ``oom``); unloading releases it at the end. Commands carry the controller's epoch:
one lower than the highest this sim has seen is refused (:class:`StaleEpoch`), which fences
a controller that lost its ownership. Every state change happens without an ``await``
between the decision and the ledger append that records it, so the ledger's order is the
state machine's order.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from hotseat_common.logging import get_logger
from hotseat_sim.ledger import Ledger
from hotseat_sim.profile import SimProfile
from hotseat_sim.timeline import LedgerEvent

log = get_logger(__name__)

LOADING_MESSAGE = "Loading model"


class Phase(StrEnum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    READY = "ready"
    UNLOADING = "unloading"
    FAILED = "failed"


class StaleEpoch(Exception):
    """A command from a controller older than one this sim already obeyed."""

    def __init__(self, got: int, seen: int) -> None:
        super().__init__(f"stale epoch {got}: this sim has seen epoch {seen}")
        self.got = got
        self.seen = seen


class NotReady(Exception):
    """A request arrived while the model is not loaded (llama.cpp answers 503)."""


class Halted(Exception):
    """The request was stopped: its client left or the model was unloaded under it."""


@dataclass(eq=False)
class Ticket:
    """One admitted request, from arrival until its response ends."""

    request_id: str
    number: int = 0
    """This sim's own count of admitted requests: unique per process, whatever id the
    client sent (the ledger tells requests apart by it)."""
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str | None = None
    started: bool = False
    prompt_n: int = 0
    """Prompt tokens it evaluated (those its slot had not cached)."""
    cache_n: int = 0
    """Prompt tokens its slot had cached."""
    prompt_ms: float = 0.0

    def halt(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self.stop.set()

    async def sleep_until(self, deadline: float) -> None:
        """Wait until the loop clock reaches ``deadline``; raise :class:`Halted` if stopped."""
        loop = asyncio.get_running_loop()
        if not self.stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(max(loop.time(), deadline)):
                    await self.stop.wait()
        if self.stop.is_set():
            raise Halted(self.reason or "halted")


@dataclass(frozen=True, slots=True)
class ControlResult:
    status: int
    body: dict[str, Any]


class ModelState:
    """The residency of one sim's model and the requests it admitted."""

    def __init__(self, profile: SimProfile, ledger: Ledger | None) -> None:
        self.profile = profile
        self.ledger = ledger
        self._phase = Phase.UNLOADED
        self._changed = asyncio.Event()
        self.error: str | None = None
        self.epoch: int | None = None
        self._lock = asyncio.Lock()
        self._transition: asyncio.Task[None] | None = None
        self._tickets: set[Ticket] = set()
        self._admitted = 0
        self.generation = 0
        """Counts loads: slot caches of an earlier load are gone, as with a new process."""
        self._held: frozenset[Phase] = frozenset()
        self._held_changed = asyncio.Event()

    @property
    def phase(self) -> Phase:
        return self._phase

    @phase.setter
    def phase(self, value: Phase) -> None:
        self._phase = value
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_for(self, states: frozenset[str], timeout: float) -> None:
        """Return once the phase is one of ``states`` or ``timeout`` seconds passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._phase.value not in states:
            changed = self._changed
            left = deadline - loop.time()
            if left <= 0:
                return
            try:
                async with asyncio.timeout(left):
                    await changed.wait()
            except TimeoutError:
                return

    def hold(self, phases: frozenset[Phase]) -> None:
        """Fault injection: a load or unload does not finish while its phase is held (its
        ``loadSeconds`` or ``unloadSeconds`` pass, then it waits), so a test can act in the
        middle of a phase however long it takes to get there; an empty set lets them end."""
        self._held = phases
        self._held_changed.set()
        self._held_changed = asyncio.Event()

    async def _while_held(self, phase: Phase) -> None:
        while phase in self._held:
            await self._held_changed.wait()

    @property
    def in_flight(self) -> int:
        return len(self._tickets)

    def snapshot(self) -> dict[str, Any]:
        """The body of ``GET /control/state``."""
        return {
            "state": self.phase.value,
            "pool": self.profile.pool,
            "member": self.profile.member,
            "error": self.error,
            "in_flight": self.in_flight,
            "epoch": self.epoch,
            "ledger_write_failures": self.ledger.write_failures if self.ledger else 0,
            "held": sorted(phase.value for phase in self._held),
        }

    def _fence(self, epoch: int | None) -> None:
        if epoch is None:
            return
        if self.epoch is not None and epoch < self.epoch:
            raise StaleEpoch(epoch, self.epoch)
        self.epoch = epoch

    def _post(self, event: LedgerEvent, **fields: object) -> None:
        if self.ledger is not None:
            self.ledger.post(event, **fields)

    def _start_transition(self, work: Any) -> None:
        self._transition = asyncio.create_task(work, name=f"sim-{self.phase.value}")

    def _cancel_transition(self) -> None:
        if self._transition is not None and not self._transition.done():
            self._transition.cancel()
        self._transition = None

    def _abort_requests(self, reason: str) -> None:
        for ticket in list(self._tickets):
            ticket.halt(reason)

    # -- control ---------------------------------------------------------------------------

    async def load(self, epoch: int | None = None, *, instant: bool = False) -> ControlResult:
        """Begin loading (202), or report the load already under way or done (200).

        The command runs to completion even if its caller goes away: a load admitted on
        the ledger must also be recorded here, or its memory would never be released.
        """
        return await asyncio.shield(self._load(epoch, instant=instant))

    async def _load(self, epoch: int | None, *, instant: bool) -> ControlResult:
        async with self._lock:
            self._fence(epoch)
            if self.phase is Phase.UNLOADING and self._transition is not None:
                await asyncio.shield(self._transition)  # a real server finishes stopping first
            if self.phase in {Phase.LOADING, Phase.READY}:
                return ControlResult(200, {"state": self.phase.value})
            sim = self.profile.sim
            if self.ledger is not None:
                try:
                    admission = await self.ledger.admit(
                        sim.memory_gi_b, self.profile.capacity_gib, epoch=epoch
                    )
                except Exception as exc:
                    return self._fail(f"ledger unavailable: {exc}", status=503)
                if not admission.admitted:
                    return self._fail(
                        f"out of memory: loading {self.profile.member} needs "
                        f"{sim.memory_gi_b:g} GiB but {admission.used_gib:g} of "
                        f"{self.profile.capacity_gib:g} GiB are in use on {self.profile.gpu}"
                    )
            self.error = None
            self.generation += 1
            if instant or sim.load_seconds <= 0:
                self.phase = Phase.READY
                self._post(LedgerEvent.LOADED, epoch=epoch)
                log.info("sim_loaded", member=self.profile.member, epoch=epoch)
                return ControlResult(202, {"state": self.phase.value})
            self.phase = Phase.LOADING
            self._start_transition(self._finish_load(epoch))
            log.info("sim_loading", member=self.profile.member, epoch=epoch)
            return ControlResult(202, {"state": self.phase.value})

    def _fail(self, error: str, *, status: int = 202) -> ControlResult:
        self.phase = Phase.FAILED
        self.error = error
        log.warning("sim_load_failed", member=self.profile.member, error=error)
        return ControlResult(status, {"state": self.phase.value, "error": error})

    async def _finish_load(self, epoch: int | None) -> None:
        await asyncio.sleep(self.profile.sim.load_seconds)
        await self._while_held(Phase.LOADING)
        if self.phase is Phase.LOADING and self._transition is asyncio.current_task():
            self.phase = Phase.READY
            self._transition = None
            self._post(LedgerEvent.LOADED, epoch=epoch)
            log.info("sim_loaded", member=self.profile.member, epoch=epoch)

    async def unload(self, epoch: int | None = None) -> ControlResult:
        """Stop serving and release the memory after ``unloadSeconds`` (202), or say it is."""
        return await asyncio.shield(self._unload(epoch))

    async def _unload(self, epoch: int | None) -> ControlResult:
        async with self._lock:
            self._fence(epoch)
            if self.phase is Phase.UNLOADING:
                return ControlResult(200, {"state": self.phase.value})
            if self.phase in {Phase.UNLOADED, Phase.FAILED}:
                self.phase = Phase.UNLOADED  # a failed model holds no memory
                self.error = None
                return ControlResult(200, {"state": self.phase.value})
            self._cancel_transition()
            self.phase = Phase.UNLOADING
            self._post(LedgerEvent.UNLOAD_START, epoch=epoch)
            self._abort_requests("aborted")
            self._start_transition(self._finish_unload(epoch))
            log.info("sim_unloading", member=self.profile.member, epoch=epoch)
            return ControlResult(202, {"state": self.phase.value})

    async def _finish_unload(self, epoch: int | None) -> None:
        await asyncio.sleep(self.profile.sim.unload_seconds)
        await self._while_held(Phase.UNLOADING)
        if self.ledger is not None:
            try:
                await self.ledger.release(reason="unload", epoch=epoch)
            except Exception as exc:
                log.warning("sim_release_failed", member=self.profile.member, error=str(exc))
        if self.phase is Phase.UNLOADING and self._transition is asyncio.current_task():
            self.phase = Phase.UNLOADED
            self._transition = None
            log.info("sim_unloaded", member=self.profile.member, epoch=epoch)

    async def fence(self, epoch: int | None) -> ControlResult:
        """Obey ``epoch`` from now on without doing anything (a controller that took the
        pool over without a command to send, e.g. after rebuilding a lost state)."""
        async with self._lock:
            self._fence(epoch)
            return ControlResult(200, {"state": self.phase.value, "epoch": self.epoch})

    async def crash(self, reason: str) -> ControlResult:
        """Die out of band (fault tests): requests dropped, memory freed, state ``failed``."""
        async with self._lock:
            self._cancel_transition()
            self._abort_requests("aborted")
            self.phase = Phase.FAILED
            self.error = reason
            if self.ledger is not None:
                await self.ledger.release(only_if_held=True, reason="crash")
            log.warning("sim_crashed", member=self.profile.member, reason=reason)
            return ControlResult(200, {"state": self.phase.value, "error": reason})

    async def forget_stale_residency(self) -> None:
        """At start-up: a fresh process holds no GPU memory, whatever the ledger remembers."""
        if self.ledger is not None and await self.ledger.release(
            only_if_held=True, reason="restart"
        ):
            log.info("sim_stale_residency_released", member=self.profile.member)

    async def shutdown(self) -> None:
        """Process exit: drop requests and free the memory."""
        async with self._lock:
            self._cancel_transition()
            self._abort_requests("aborted")
            self.phase = Phase.UNLOADED
            if self.ledger is not None:
                with contextlib.suppress(Exception):
                    await self.ledger.release(only_if_held=True, reason="shutdown")

    # -- requests --------------------------------------------------------------------------

    def admit(self, request_id: str) -> Ticket:
        """Register a request, or raise :class:`NotReady` (recorded as ``serve_refused``)."""
        if self.phase is not Phase.READY:
            self._post(LedgerEvent.SERVE_REFUSED, request_id=request_id, state=self.phase.value)
            raise NotReady(self.error if self.phase is Phase.FAILED else LOADING_MESSAGE)
        self._admitted += 1
        ticket = Ticket(request_id, number=self._admitted)
        self._tickets.add(ticket)
        return ticket

    def begin(self, ticket: Ticket) -> None:
        """The request took a slot: record ``serve_start`` unless it was stopped meanwhile."""
        if ticket.stop.is_set() or self.phase is not Phase.READY:
            ticket.halt("aborted")
            raise Halted(ticket.reason or "aborted")
        ticket.started = True
        self._post(LedgerEvent.SERVE_START, request_id=ticket.request_id, ticket=ticket.number)

    def finish(self, ticket: Ticket, outcome: str) -> None:
        """The request ended (``completed``, ``disconnected`` or ``aborted``)."""
        self._tickets.discard(ticket)
        if ticket.started:
            ticket.started = False
            self._post(
                LedgerEvent.SERVE_END,
                request_id=ticket.request_id,
                ticket=ticket.number,
                outcome=outcome,
            )
