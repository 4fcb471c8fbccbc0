"""Redis key names: the only place they are spelled.

Keys of one pool share a ``{pool}`` hash tag so that a Redis Cluster keeps them in one
slot and the controller's transactions stay atomic there too.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_KEY_PREFIX = "hotseat"


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str = DEFAULT_KEY_PREFIX

    def _pool(self, pool: str) -> str:
        return f"{self.prefix}:pool:{{{pool}}}"

    def pool_state(self, pool: str) -> str:
        """HASH: the pool state (its fields are the controller's store codec's business)."""
        return f"{self._pool(pool)}:state"

    def pool_leases(self, pool: str, member: str) -> str:
        """ZSET lease_id -> expiry (ms, Redis clock)."""
        return f"{self._pool(pool)}:leases:{member}"

    def pool_lease_meta(self, pool: str) -> str:
        """HASH lease_id -> JSON (member, attempt, client request id, router, epoch)."""
        return f"{self._pool(pool)}:lease-meta"

    def pool_attempt_leases(self, pool: str) -> str:
        """HASH attempt -> lease_id, so a re-asked acquire of one attempt gets the same lease."""
        return f"{self._pool(pool)}:attempt-leases"

    def pool_waiters(self, pool: str, member: str) -> str:
        """ZSET attempt -> deadline (ms, Redis clock) of requests held for ``member``."""
        return f"{self._pool(pool)}:waiters:{member}"

    def pool_waiter_urgency(self, pool: str, member: str) -> str:
        """ZSET attempt -> virtual arrival (ms, Redis clock: when the request arrived,
        moved earlier by its priority) of requests held for ``member``; the same attempts
        as :meth:`pool_waiters`, ordered by who goes first."""
        return f"{self._pool(pool)}:urgency:{member}"

    def pool_member_swap_times(self, pool: str, member: str) -> str:
        """LIST of recent durations (seconds) of swaps to ``member``, newest first."""
        return f"{self._pool(pool)}:swap-times:{member}"

    def pool_member_drain_times(self, pool: str, member: str) -> str:
        """LIST of recent drain durations (seconds) of ``member`` closed by ``maxWait``:
        from its close to its last lease's end, newest first."""
        return f"{self._pool(pool)}:drain-times:{member}"

    def pool_member_request_times(self, pool: str, member: str) -> str:
        """LIST of the longest request (seconds) on each recently released lease of
        ``member``, newest first (kept for pools with ``maxWait``)."""
        return f"{self._pool(pool)}:request-times:{member}"

    def pool_swap_times(self, pool: str) -> str:
        """LIST of recent swap durations (seconds), newest first."""
        return f"{self._pool(pool)}:swap-times"

    def _group(self, group: str) -> str:
        return f"{self.prefix}:group:{{{group}}}"

    def group_copies(self, group: str) -> str:
        """HASH pool -> the group member's copy state on that pool (JSON, docs/adr/0012)."""
        return f"{self._group(group)}:copies"

    def group_leases(self, group: str) -> str:
        """ZSET ``<pool> <lease id>`` -> expiry (ms, Redis clock): leases placed by the group."""
        return f"{self._group(group)}:leases"

    def group_busy(self, group: str) -> str:
        """ZSET ``<pool> <lease id>`` -> expiry (ms, Redis clock): leases on another member
        of a one-resident pool, which a load of the group's copy there would evict."""
        return f"{self._group(group)}:busy"

    def group_waiting(self, group: str) -> str:
        """ZSET ``<pool> <attempt>`` -> hold deadline (ms): requests placed and held."""
        return f"{self._group(group)}:waiting"

    def group_claims(self, group: str) -> str:
        """HASH pool -> until when (ms) a load the group started there counts as loading."""
        return f"{self._group(group)}:claims"

    def group_last(self, group: str) -> str:
        """STRING: the group's last placement (JSON: pool, reason, when), for status."""
        return f"{self._group(group)}:last"

    def group_version(self, group: str) -> str:
        """STRING: bumped by every claim (a claim applies only on the version it read)."""
        return f"{self._group(group)}:version"

    def group_session(self, group: str, session: str) -> str:
        """STRING with TTL: the pool that served the session's last turn."""
        return f"{self._group(group)}:session:{session}"

    def sim_ledger(self, gpu: str) -> str:
        """STREAM of sim GPU ledger entries (load/unload/oom/serve) for one simulated GPU."""
        return f"{self.prefix}:sim:{{{gpu}}}:ledger"

    def sim_resident(self, gpu: str) -> str:
        """HASH member -> GiB held on one simulated GPU."""
        return f"{self.prefix}:sim:{{{gpu}}}:resident"
