"""Passive health: a backend that fails is quarantined, then gets one trial request.

Only failures that say something about the backend count: a refused or broken connection,
a per-attempt timeout, a 5xx. A client leaving or the request's own deadline expiring
says nothing about the backend and leaves its state alone; a pool member that is merely
not resident never reaches this module.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum


class Admission(Enum):
    NORMAL = "normal"
    TRIAL = "trial"


@dataclass(slots=True)
class _State:
    quarantined_until: float = 0.0
    trial_in_flight: bool = False
    failed: bool = False


class PassiveHealth:
    """Per-backend quarantine state of one router process."""

    def __init__(
        self,
        quarantine_s: float,
        *,
        on_change: Callable[[str, bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._quarantine_s = quarantine_s
        self._states: dict[str, _State] = {}
        self._on_change = on_change
        self._clock = clock

    def admit(self, backend: str) -> Admission | None:
        """May a request go to ``backend`` now? ``None`` means skip it."""
        state = self._states.get(backend)
        if state is None or not state.failed:
            return Admission.NORMAL
        if state.trial_in_flight or self._clock() < state.quarantined_until:
            return None
        state.trial_in_flight = True
        return Admission.TRIAL

    def quarantined(self, backend: str) -> bool:
        state = self._states.get(backend)
        return state is not None and state.failed

    def succeeded(self, backend: str) -> None:
        state = self._states.get(backend)
        if state is not None and state.failed:
            del self._states[backend]
            if self._on_change is not None:
                self._on_change(backend, True)

    def failed(self, backend: str) -> None:
        state = self._states.setdefault(backend, _State())
        was_failed = state.failed
        state.failed = True
        state.trial_in_flight = False
        state.quarantined_until = self._clock() + self._quarantine_s
        if not was_failed and self._on_change is not None:
            self._on_change(backend, False)

    def abandoned(self, backend: str, admission: Admission) -> None:
        """The attempt ended without a verdict (client left, deadline): free the trial slot."""
        if admission is Admission.TRIAL:
            state = self._states.get(backend)
            if state is not None:
                state.trial_in_flight = False
