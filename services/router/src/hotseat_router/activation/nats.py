"""The NATS implementation of :class:`~hotseat_router.activation.protocol.ActivationClient`.

Asks the pool controller (queue group) for a lease and, on ``wait``, waits for the pool's
next state-change notification before asking again with the same attempt (a timer
re-asks too, in case a notification was lost). A request that gives up (swap budget
elapsed, client gone) withdraws from the pool's waiters with ``cancel``.

A lease this router already holds on the member is shared instead of asked for, and
renewed from one task (:mod:`.held`). Otherwise the hot path is one NATS request
(acquire) and one publish (release, which needs no answer: a release that is lost leaves
a lease that expires by its TTL, exactly as when its reply would have been lost). A
release the caller must see done before its next acquire (a fallback to another member
of the same pool) is asked as a request instead.

**Identity and time.** A waiter and a lease at the controller belong to one attempt
(:func:`~hotseat_router.activation.protocol.new_attempt`), never to the client's request
id. Each question carries what is left of the hold as a duration on this process's
monotonic clock; the controller anchors it to its store's clock, so this host's wall
clock plays no part.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Self

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from pydantic import ValidationError

from hotseat_common.config.model import PoolActivation
from hotseat_common.errors import (
    ACTIVATION_ERRORS,
    ActivationError,
    ActivationTimeout,
    ControllerUnavailable,
    IncumbentBusy,
)
from hotseat_common.logging import get_logger
from hotseat_common.messages import (
    ACQUIRE_REPLY,
    AcquireRequest,
    CancelRequest,
    DispatchFailureReport,
    ErrorReply,
    Granted,
    IncumbentBusyReply,
    PlacementReason,
    PlaceReply,
    PlaceRequest,
    PoolStateChanged,
    ReleaseRequest,
    RenewReply,
    RenewRequest,
    WaitReply,
    WireModel,
)
from hotseat_common.subjects import Subjects
from hotseat_common.tracing import NO_TRACING, Tracing
from hotseat_router.activation.held import HeldLeases
from hotseat_router.activation.protocol import GroupAsk, Lease, OnWait, Placed
from hotseat_router.activation.turns import FirstThenRest, Turns

log = get_logger(__name__)

REQUEST_TIMEOUT_S = 2.0
"""One acquire round trip; a slower controller is asked again with the same request id."""
REASK_INTERVAL_S = 2.0
"""A held request asks again at least this often, even without a notification."""
SMALL_TIMEOUT_S = 1.0


@dataclass
class _PoolSignal:
    generation: int = 0
    changed: FirstThenRest = field(default_factory=FirstThenRest)
    """Set at the pool's next change. The first request waiting for it wakes alone and
    asks; the others wake together a turn later, behind its question, and find its
    flight and follow it (:mod:`.turns`)."""

    def bump(self) -> None:
        self.generation += 1
        self.changed.set()
        self.changed = FirstThenRest()


@dataclass
class _Flight:
    """One acquire on its way to the controller for a member. The router's other requests
    for that member that would ask now wait for its answer instead: granted, they share
    its lease (:mod:`.held`, under the same rules as any sharing), so that requests held
    through a swap wake with one question at its commit, not one each; told to wait, those
    already waiting go on waiting without asking. Once it landed they resume one per turn
    of the loop (:mod:`.turns`), a turn after the request that asked: its dispatch first."""

    landed: Turns = field(default_factory=Turns)
    waits: bool = False
    """The answer said to wait (the member is not resident, or takes no new request)."""


class NatsActivationClient:
    def __init__(
        self, nc: NatsClient, subjects: Subjects, router: str, *, tracing: Tracing = NO_TRACING
    ) -> None:
        self._nc = nc
        self._tracing = tracing
        self._subjects = subjects
        self._router = router
        self._signals: dict[str, _PoolSignal] = {}
        self._flights: dict[tuple[str, str], _Flight] = {}
        self._leases = HeldLeases(self._renew)
        self._sub: Subscription | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._sub = await self._nc.subscribe(self._subjects.pool_events_all, cb=self._on_event)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        pending = self._tasks | await self._leases.stop()
        if pending:  # cancels and renewals still on their way
            await asyncio.wait(pending, timeout=SMALL_TIMEOUT_S * 2)
        if self._sub is not None:
            with contextlib.suppress(NatsError):
                await self._sub.unsubscribe()

    def _signal(self, pool: str) -> _PoolSignal:
        return self._signals.setdefault(pool, _PoolSignal())

    async def _on_event(self, msg: Msg) -> None:
        try:
            event = PoolStateChanged.from_bytes(msg.data)
        except ValidationError:
            log.warning("pool_event_invalid", subject=msg.subject)
            return
        if event.closed and event.resident is not None:
            # New requests for a closed resident must ask the controller (and be held).
            self._leases.unshare_member(event.pool, event.resident)
        for member in event.closing or ():
            self._leases.unshare_member(event.pool, member)
        self._signal(event.pool).bump()

    async def _request(self, subject: str, message: WireModel, timeout: float) -> bytes:
        # The trace context (when tracing is on) goes with the question: the controller's
        # span of it joins the request's trace (docs/adr/0010).
        headers = self._tracing.headers()
        response = await self._nc.request(
            subject, message.to_bytes(), timeout=timeout, headers=headers
        )
        return bytes(response.data)

    # --- acquire ----------------------------------------------------------------------

    async def acquire(
        self,
        *,
        pool: str,
        member: str,
        mode: PoolActivation,
        attempt: str,
        request_id: str,
        budget_s: float,
        priority: int = 0,
        on_wait: OnWait | None = None,
    ) -> Lease:
        shared = self._leases.share(pool, member)
        if shared is not None:
            return shared
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget_s
        request = AcquireRequest(
            pool=pool,
            member=member,
            mode=mode,
            attempt=attempt,
            request_id=request_id,
            router=self._router,
            hold_s=budget_s,
            priority=priority or None,
        )
        told: WaitReply | None = None  # the last wait answer: this attempt is a waiter
        followed = False
        try:
            while True:
                signal = self._signal(pool)
                generation, changed = signal.generation, signal.changed
                flight = self._flights.get((pool, member))
                if flight is not None and (told is not None or not followed):
                    # Another request of this router is asking for the member: a grant
                    # is shared; an answer to wait keeps a waiter waiting. Anything else
                    # (or a request not yet a waiter, after one flight) asks for itself.
                    followed = True
                    await self._follow(flight, deadline, told)
                    handle = self._leases.share(pool, member, waited=told is not None)
                    if handle is not None:
                        if told is not None:  # no longer waits (nothing awaited here:
                            # the handle must reach the caller, who releases it)
                            self._background(loop.create_task(self._leave(pool, member, attempt)))
                        return handle
                    if told is not None and flight.waits:
                        await self._wait_for_change(signal, generation, changed, deadline, told)
                        continue
                lease = await self._lead(request, deadline, on_wait)
                if isinstance(lease, Lease):
                    return lease
                if lease is not None:
                    told = lease
                    await self._wait_for_change(signal, generation, changed, deadline, told)
        except BaseException:
            # Leave the waiters, and free a lease granted to a reply we never read.
            self._withdraw(pool, member, attempt)
            raise

    async def _lead(
        self, request: AcquireRequest, deadline: float, on_wait: OnWait | None
    ) -> Lease | WaitReply | None:
        """Ask the controller once, as the flight other requests of this router for the
        member follow (when none is on its way already): the lease, the answer to wait,
        or ``None`` for a grant that came too late to prove anything (ask again)."""
        key = (request.pool, request.member)
        flight = None if key in self._flights else self._flights.setdefault(key, _Flight())
        try:
            reply, asked_at = await self._ask(request, deadline)
            if isinstance(reply, Granted):
                if asyncio.get_running_loop().time() < asked_at + reply.ttl_s:
                    return self._granted(request, reply, asked_at)  # shared from now on
                # The grant came too late to prove anything (this loop stalled, or the link
                # was slow): the lease may be gone and the member swapped away. Ask again:
                # the controller answers with the truth for this attempt.
                log.warning("acquire_grant_stale", pool=request.pool, request_id=request.request_id)
                return None
            waiting = _expect_wait(request.pool, reply)
            if flight is not None:
                flight.waits = True
            if on_wait is not None:
                on_wait(waiting)
            return waiting
        finally:
            if flight is not None:
                del self._flights[key]
                flight.landed.open()

    async def _follow(self, flight: _Flight, deadline: float, told: WaitReply | None) -> None:
        """Until ``flight`` has its answer, within this request's hold."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(deadline):
                await flight.landed.wait()
        if flight.landed.opened:
            return
        if told is not None:
            raise _budget_spent(told)
        raise ActivationTimeout("controller did not answer in time")

    async def _ask(
        self, request: AcquireRequest, deadline: float
    ) -> tuple[Granted | IncumbentBusyReply | WaitReply | ErrorReply, float]:
        """One acquire, asked again (same attempt) while the controller is slow; the reply
        and the loop time at which the question it answers was sent."""
        data, asked_at = await self._question(
            self._subjects.acquire, request, request.pool, request.request_id, deadline
        )
        return ACQUIRE_REPLY.validate_json(data), asked_at

    async def _question(
        self,
        subject: str,
        request: AcquireRequest | PlaceRequest,
        what: str,
        request_id: str,
        deadline: float,
    ) -> tuple[bytes, float]:
        """One question with a hold, asked again (same attempt) while the controller is
        slow; the answer and the loop time at which it was sent. Each question says how
        long the hold still runs (``deadline`` is on this loop's clock)."""
        loop = asyncio.get_running_loop()
        while True:
            left = deadline - loop.time()
            if left <= 0:
                raise ActivationTimeout(f"pool {what}: controller did not answer in time")
            asked_at = loop.time()
            question = request.model_copy(update={"hold_s": left})
            try:
                data = await self._request(subject, question, min(REQUEST_TIMEOUT_S, left))
            except NoRespondersError as exc:
                raise ControllerUnavailable(
                    f"pool {what}: no pool controller is running", retry_after=1.0
                ) from exc
            except NatsTimeoutError:
                log.warning("acquire_slow", pool=what, request_id=request_id)
                continue
            except NatsError as exc:
                raise ControllerUnavailable(
                    f"pool {what}: NATS unavailable ({type(exc).__name__})", retry_after=1.0
                ) from exc
            return data, asked_at

    # --- placement (docs/adr/0012) ---------------------------------------------------------

    async def place(self, ask: GroupAsk, on_wait: OnWait | None = None) -> Placed:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ask.budget_s
        group, attempt, request_id = ask.group, ask.attempt, ask.request_id
        request = PlaceRequest(
            group=group,
            mode=ask.mode,
            attempt=attempt,
            request_id=request_id,
            router=self._router,
            hold_s=ask.budget_s,
            priority=ask.priority or None,
            session=ask.session,
            avoid=ask.avoid,
        )
        where: tuple[str, str] | None = None
        reason: PlacementReason | None = None
        """Why the request is where it is (a re-ask that keeps it there says ``kept``)."""
        try:
            while True:
                # The pool's generation before asking: a change while asking is not missed.
                before = self._signal(where[0]) if where is not None else None
                seen = (where, before.generation, before.changed) if before is not None else None
                data, asked_at = await self._question(
                    self._subjects.place, request, f"group {group}", request_id, deadline
                )
                answer = PlaceReply.from_bytes(data)
                where = _placed_on(group, answer)
                if answer.reason != PlacementReason.KEPT or reason is None:
                    reason = answer.reason
                request = request.model_copy(update={"placed": where[0]})
                reply = answer.reply
                if isinstance(reply, Granted):
                    if loop.time() < asked_at + reply.ttl_s:
                        lease = self._lease(where, reply, request, asked_at, group=group)
                        return Placed(lease, answer.backend or "", reason)
                    log.warning("acquire_grant_stale", pool=where[0], request_id=request_id)
                    continue
                waiting = _expect_wait(where[0], reply)
                if on_wait is not None:
                    on_wait(waiting)
                signal = self._signal(where[0])
                generation, changed = signal.generation, signal.changed
                if seen is not None and seen[0] == where:
                    generation, changed = seen[1], seen[2]
                await self._wait_for_change(signal, generation, changed, deadline, waiting)
        except BaseException:
            if where is not None:
                self._withdraw(where[0], where[1], attempt, group=group)
            raise

    async def _wait_for_change(
        self,
        signal: _PoolSignal,
        generation: int,
        changed: FirstThenRest,
        deadline: float,
        reply: WaitReply,
    ) -> None:
        loop = asyncio.get_running_loop()
        left = deadline - loop.time()
        if left <= 0:
            raise _budget_spent(reply)
        if signal.generation != generation:
            return  # the pool changed while we were asking
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(left, REASK_INTERVAL_S)):
                await changed.wait()
        if loop.time() >= deadline:
            raise _budget_spent(reply)

    def _withdraw(self, pool: str, member: str, attempt: str, *, group: str | None = None) -> None:
        """Leave the pool's waiters; runs even when the caller was cancelled."""
        message = CancelRequest(pool=pool, member=member, attempt=attempt, group=group)
        task = asyncio.get_running_loop().create_task(self._fire(self._subjects.cancel, message))
        self._background(task)

    async def _leave(self, pool: str, member: str, attempt: str) -> None:
        """A waiter served by a shared lease leaves the pool's waiters: a publish, as a
        release is (lost, the waiter lapses at the end of its hold; it holds no lease)."""
        message = CancelRequest(pool=pool, member=member, attempt=attempt)
        try:
            await self._nc.publish(self._subjects.cancel, message.to_bytes())
        except NatsError as exc:
            log.warning("pool_message_failed", subject="cancel", error=type(exc).__name__)

    async def _fire(self, subject: str, message: WireModel) -> None:
        try:
            await self._request(subject, message, SMALL_TIMEOUT_S)
        except NatsError as exc:
            log.warning("pool_message_failed", subject=subject, error=type(exc).__name__)

    def _background(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- leases -----------------------------------------------------------------------

    def _granted(self, request: AcquireRequest, reply: Granted, asked_at: float) -> Lease:
        return self._lease((request.pool, request.member), reply, request, asked_at)

    def _lease(
        self,
        where: tuple[str, str],
        reply: Granted,
        request: AcquireRequest | PlaceRequest,
        asked_at: float,
        *,
        group: str | None = None,
    ) -> Lease:
        lease = Lease(
            pool=where[0],
            member=where[1],
            lease_id=reply.lease_id,
            epoch=reply.epoch,
            ttl_s=reply.ttl_s,
            attempt=request.attempt,
            request_id=request.request_id,
            swap_id=reply.swap_id,
            valid_until=asked_at + reply.ttl_s,
            group=group,
        )
        return self._leases.hold(lease)

    async def _renew(self, lease: Lease, longest_s: float | None = None) -> RenewReply | None:
        message = RenewRequest(
            pool=lease.pool,
            member=lease.member,
            lease_id=lease.lease_id,
            epoch=lease.epoch,
            attempt=lease.attempt,
            request_id=lease.request_id,
            router=self._router,
            group=lease.group,
            longest_s=round(longest_s, 3) if longest_s is not None else None,
        )
        try:
            data = await self._request(self._subjects.renew, message, SMALL_TIMEOUT_S)
            return RenewReply.from_bytes(data)
        except (NatsError, ValidationError) as exc:
            log.warning("lease_renew_failed", pool=lease.pool, error=type(exc).__name__)
            return None

    async def release(self, lease: Lease, *, confirm: bool = False) -> None:
        """One request is done with its lease; the last one sharing it tells the controller
        (a publish, so nothing waits for it, unless ``confirm``: then a request, answered
        once the store has it). Releasing twice is harmless."""
        dropped = self._leases.drop(lease)
        if not dropped.requests:
            return
        message = ReleaseRequest(
            pool=lease.pool,
            member=lease.member,
            lease_id=lease.lease_id,
            group=lease.group,
            requests=dropped.requests,
            longest_s=round(dropped.longest_s, 3),
        )
        if confirm:
            await self._fire(self._subjects.release, message)
            return
        try:
            await self._nc.publish(self._subjects.release, message.to_bytes())
        except NatsError as exc:
            log.warning("pool_message_failed", subject="release", error=type(exc).__name__)

    async def report_failure(self, lease: Lease, *, request_id: str, reason: str) -> None:
        self._leases.unshare(lease)  # later requests ask the controller, which checks it
        message = DispatchFailureReport(
            pool=lease.pool, member=lease.member, request_id=request_id, reason=reason
        )
        await self._fire(self._subjects.report, message)


def _budget_spent(reply: WaitReply) -> ActivationTimeout:
    return ActivationTimeout(
        f"pool swap did not complete within the swap budget (target {reply.target})",
        retry_after=reply.retry_after_s,
    )


def _expect_wait(pool: str, reply: IncumbentBusyReply | WaitReply | ErrorReply) -> WaitReply:
    """The reply if it says wait; otherwise the refusal as its exception."""
    if isinstance(reply, WaitReply):
        return reply
    raise _refusal(pool, reply)


def _placed_on(group: str, answer: PlaceReply) -> tuple[str, str]:
    """The pool and member placed on; a group that placed nothing, as its exception."""
    if answer.pool is None or answer.member is None:
        raise _refusal(f"group {group}", answer.reply)
    return answer.pool, answer.member


def _refusal(
    pool: str, reply: Granted | IncumbentBusyReply | WaitReply | ErrorReply
) -> ActivationError:
    """A reply that is neither a grant nor a wait, as its exception."""
    if isinstance(reply, Granted | WaitReply):
        return ActivationError(f"pool {pool}: unexpected {reply.status} without a placement")
    if isinstance(reply, IncumbentBusyReply):
        return IncumbentBusy(
            f"pool {pool}: {reply.resident or 'every pool'} is busy",
            retry_after=reply.retry_after_s,
        )
    return ACTIVATION_ERRORS.get(reply.code, ActivationError)(
        f"pool {pool}: {reply.message}", retry_after=reply.retry_after_s
    )
