"""NATS subject and stream names: the only place they are spelled.

Every subject starts with a configurable prefix (default ``hotseat``) so that several
stacks, or several tests, can share one NATS server without hearing each other. Names
that are not valid subject tokens (the dot in ``qwen2.5-3b``) are encoded by
:func:`token`.
"""

from __future__ import annotations

from dataclasses import dataclass

CONTROLLER_QUEUE_GROUP = "hotseat-controller"
DEFAULT_PREFIX = "hotseat"
DEFAULT_AUDIT_STREAM = "HOTSEAT_AUDIT"
AUDIT_DURABLE = "hotseat-audit"


def token(name: str) -> str:
    """Encode ``name`` as one subject token: ``[A-Za-z0-9_-]`` kept, the rest ``%XX``."""
    return "".join(
        ch if (ch.isascii() and ch.isalnum()) or ch in "-_" else f"%{ord(ch):02X}" for ch in name
    )


@dataclass(frozen=True, slots=True)
class Subjects:
    """All subjects of one Hotseat stack."""

    prefix: str = DEFAULT_PREFIX

    @property
    def acquire(self) -> str:
        return f"{self.prefix}.pool.acquire"

    @property
    def release(self) -> str:
        return f"{self.prefix}.pool.release"

    @property
    def renew(self) -> str:
        return f"{self.prefix}.pool.renew"

    @property
    def cancel(self) -> str:
        """A router gives up a held request (budget elapsed, client left)."""
        return f"{self.prefix}.pool.cancel"

    @property
    def report(self) -> str:
        """A router reports that a granted member failed at the connection level."""
        return f"{self.prefix}.pool.report"

    @property
    def place(self) -> str:
        """A router asks for a model group: one placement, and that pool's acquire."""
        return f"{self.prefix}.group.place"

    def pool_events(self, pool: str) -> str:
        return f"{self.prefix}.pool.events.{token(pool)}"

    @property
    def pool_events_all(self) -> str:
        return f"{self.prefix}.pool.events.*"

    def audit(self, kind: str, outcome: str) -> str:
        return f"{self.prefix}.audit.{token(kind)}.{token(outcome)}"

    @property
    def audit_all(self) -> str:
        return f"{self.prefix}.audit.>"

    def audit_filter(self, kind: str | None = None, outcome: str | None = None) -> str:
        """Audit events of one kind and/or outcome (``*`` for the one not given)."""
        if kind is None and outcome is None:
            return self.audit_all
        kind_token = token(kind) if kind is not None else "*"
        outcome_token = token(outcome) if outcome is not None else "*"
        return f"{self.prefix}.audit.{kind_token}.{outcome_token}"
