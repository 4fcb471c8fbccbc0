"""The controller admin API's view of a pool (``GET /v1/pools``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class PoolView(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    resident: str | None
    swapping: str | None
    """The target of a swap in flight (or pending behind a draining incumbent)."""
    phase: str
    epoch: int
    leases: dict[str, int]
    waiters: dict[str, int]
    unhealthy: bool = False
    """The resident failed its health checks while serving: kept until its leases end."""
    relearning: bool = False
    """The store lost its state and routers are renewing their leases back."""


class PoolList(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    pools: list[PoolView]
