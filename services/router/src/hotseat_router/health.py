"""Passive health: a backend that fails is quarantined, then gets one trial request.

Only failures that say something about the backend count: a refused or broken connection,
a per-attempt timeout, a 5xx. A client leaving or the request's own deadline expiring
says nothing about the backend and leaves its state alone; a pool member that is merely
not resident never reaches this module; a 4xx is the request's own answer, not a failure.

One failure is not enough, so that one client cannot take a backend away from all: a
backend is quarantined once at least ``failures`` requests failed on it within
``window_s`` with no success between them, and, unless every one of them failed to
connect at all (which no request can cause), those requests came from at least
``clients`` different clients (a 5xx or a timeout may be the request's own doing: a
body that crashes the server, a generation longer than the attempt timeout).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum


class Admission(Enum):
    NORMAL = "normal"
    TRIAL = "trial"


class Failure(Enum):
    UNREACHABLE = "unreachable"
    """The connection was refused or broke before an answer: no request causes that."""
    ANSWERED = "answered"
    """A 5xx or a per-attempt timeout: possibly the request's own doing."""


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    quarantine_s: float
    failures: int = 3
    window_s: float = 30.0
    clients: int = 2


@dataclass(slots=True)
class _State:
    quarantined_until: float = 0.0
    trial_in_flight: bool = False
    failed: bool = False
    recent: deque[tuple[float, str, Failure]] = field(default_factory=lambda: deque(maxlen=256))
    """Failures since the last success, oldest first: when, whose request, which kind."""


class PassiveHealth:
    """Per-backend quarantine state of one router process."""

    def __init__(
        self,
        policy: HealthPolicy,
        *,
        on_change: Callable[[str, bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._policy = policy
        self._quarantine_s = policy.quarantine_s
        self._states: dict[str, _State] = {}
        self._on_change = on_change
        self._clock = clock

    def admit(self, backend: str) -> Admission | None:
        """May a request go to ``backend`` now? ``None`` means skip it."""
        state = self._states.get(backend)
        if state is None or not state.failed:
            return Admission.NORMAL
        if self.refuses(backend):
            return None
        state.trial_in_flight = True
        return Admission.TRIAL

    def refuses(self, backend: str) -> bool:
        """Would :meth:`admit` skip ``backend`` now (quarantined, or its one trial out)?"""
        state = self._states.get(backend)
        return (
            state is not None
            and state.failed
            and (state.trial_in_flight or self._clock() < state.quarantined_until)
        )

    def quarantined(self, backend: str) -> bool:
        state = self._states.get(backend)
        return state is not None and state.failed

    def succeeded(self, backend: str) -> None:
        state = self._states.pop(backend, None)
        if state is not None and state.failed and self._on_change is not None:
            self._on_change(backend, True)

    def failed(self, backend: str, *, client: str, kind: Failure) -> None:
        """A request of ``client`` failed on ``backend``. A backend already quarantined
        (its trial failed) is quarantined again at once."""
        state = self._states.setdefault(backend, _State())
        now = self._clock()
        if not state.failed:
            state.recent.append((now, client, kind))
            while state.recent and state.recent[0][0] <= now - self._policy.window_s:
                state.recent.popleft()
            if not self._convincing(state.recent):
                return
        was_failed = state.failed
        state.failed = True
        state.trial_in_flight = False
        state.quarantined_until = now + self._quarantine_s
        if not was_failed and self._on_change is not None:
            self._on_change(backend, False)

    def _convincing(self, recent: deque[tuple[float, str, Failure]]) -> bool:
        policy = self._policy
        if len(recent) < policy.failures:
            return False
        if all(kind is Failure.UNREACHABLE for _, _, kind in recent):
            return True
        return len({client for _, client, _ in recent}) >= policy.clients

    def abandoned(self, backend: str, admission: Admission) -> None:
        """The attempt ended without a verdict (client left, deadline): free the trial slot."""
        if admission is Admission.TRIAL:
            state = self._states.get(backend)
            if state is not None:
                state.trial_in_flight = False
