"""The in-process activation client: no pool controller, so every pooled backend is
treated as resident and a lease is a no-op (a config without pools)."""

from __future__ import annotations

from hotseat_common.config.model import PoolActivation
from hotseat_common.errors import UnknownPool
from hotseat_router.activation.protocol import GroupAsk, Lease, OnWait, Placed


class DirectActivation:
    """Every pooled backend is treated as resident; the lease is a no-op."""

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
        return Lease(
            pool=pool,
            member=member,
            lease_id=f"direct-{attempt}",
            epoch=0,
            ttl_s=0,
            attempt=attempt,
            request_id=request_id,
        )

    async def place(self, ask: GroupAsk, on_wait: OnWait | None = None) -> Placed:
        """Never asked: a model group's members are pooled, so its router has a controller."""
        raise UnknownPool(f"group {ask.group!r}: no pool controller is configured")

    async def release(self, lease: Lease, *, confirm: bool = False) -> None:
        return None

    async def report_failure(self, lease: Lease, *, request_id: str, reason: str) -> None:
        return None
