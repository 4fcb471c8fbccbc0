"""A real Hotseat stack for end-to-end tests: sim backends, controllers and routers as
subprocesses on free ports, sharing the session's NATS and Redis under a unique prefix."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import redis.asyncio as aioredis
import yaml

from hotseat.launcher import Managed, free_port, start_service
from hotseat_common.keys import Keys
from hotseat_sim.timeline import LedgerEntry, read_timeline
from tests.support.audit_trail import publishers_flushed, stream_events
from tests.support.oracle import Verdict, judge_gpu
from tests.support.waiting import eventually

FAST_TIMINGS = {
    "HOTSEAT_LOG_LEVEL": "info",
    "HOTSEAT_TICK_INTERVAL": "0.1",
    "HOTSEAT_RECONCILE_INTERVAL": "0.3",
    "HOTSEAT_HEARTBEAT_TTL": "1.0",
    "HOTSEAT_SHUTDOWN_GRACE": "3",
}


@dataclass
class Stack:
    workdir: Path
    prefix: str
    nats_url: str
    redis_url: str
    config: dict[str, Any]
    config_path: Path = field(init=False)
    sims: dict[str, Managed] = field(default_factory=dict)
    controllers: dict[str, Managed] = field(default_factory=dict)
    routers: list[Managed] = field(default_factory=list)
    admin_token: str = "test-admin-token"
    extra_env: dict[str, str] = field(default_factory=dict)
    """More variables for every process the stack starts (tracing, for one)."""

    def __post_init__(self) -> None:
        self.config_path = self.workdir / "hotseat.yaml"
        self.config_path.write_text(yaml.safe_dump(self.config))

    @property
    def env(self) -> dict[str, str]:
        return {
            **FAST_TIMINGS,
            "HOTSEAT_NATS_URL": self.nats_url,
            "HOTSEAT_REDIS_URL": self.redis_url,
            "HOTSEAT_SUBJECT_PREFIX": self.prefix,
            "HOTSEAT_KEY_PREFIX": self.prefix,
            "HOTSEAT_AUDIT_STREAM": f"AUDIT_{self.prefix}",
            "HOTSEAT_ADMIN_TOKEN": self.admin_token,
            "HOTSEAT_CONFIG": str(self.config_path),
            **self.extra_env,
        }

    # --- processes --------------------------------------------------------------------

    def start_sims(self) -> None:
        for backend in self.config["backends"]:
            port = int(backend["address"].rsplit(":", 1)[1])
            self.sims[backend["name"]] = start_service(
                f"sim-{backend['name']}",
                "hotseat-sim",
                ["--backend", backend["name"]],
                port=port,
                log_dir=self.workdir,
                env=self.env,
                ready_path="/control/state",
            )

    def restart_sim(self, name: str) -> Managed:
        backend = next(b for b in self.config["backends"] if b["name"] == name)
        port = int(backend["address"].rsplit(":", 1)[1])
        self.sims[name] = start_service(
            f"sim-{name}-again",
            "hotseat-sim",
            ["--backend", name],
            port=port,
            log_dir=self.workdir,
            env=self.env,
            ready_path="/control/state",
        )
        return self.sims[name]

    def start_controller(self, name: str = "c1") -> Managed:
        proc = start_service(
            f"controller-{name}",
            "hotseat-controller",
            ["--instance", name],
            port=free_port(),
            log_dir=self.workdir,
            env=self.env,
        )
        self.controllers[name] = proc
        return proc

    def start_router(self) -> Managed:
        proc = start_service(
            f"router-{len(self.routers)}",
            "hotseat-router",
            [],
            port=free_port(),
            log_dir=self.workdir,
            env=self.env,
        )
        self.routers.append(proc)
        return proc

    def stop(self) -> None:
        for proc in [*self.routers, *self.controllers.values(), *self.sims.values()]:
            proc.stop(5)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.log_text()[-4000:]}"
            for p in [*self.routers, *self.controllers.values(), *self.sims.values()]
        )

    async def hold_sim(self, member: str, *phases: str) -> None:
        """``member``'s loads or unloads do not finish while their phase is among ``phases``
        (the sim's ``/control/hold``); none: they end."""
        async with httpx.AsyncClient(timeout=10) as client:
            response = await client.post(
                f"{self.sims[member].url}/control/hold", json={"phases": list(phases)}
            )
            response.raise_for_status()

    # --- observation ------------------------------------------------------------------

    @property
    def controller_url(self) -> str:
        return next(p.url for p in self.controllers.values() if p.alive())

    async def pool(self, name: str = "gpu0") -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=5) as client:
            response = await client.get(f"{self.controller_url}/v1/pools/{name}")
            response.raise_for_status()
            result: dict[str, Any] = response.json()
            return result

    async def wait_resident(
        self, member: str | None, pool: str = "gpu0", timeout: float = 15
    ) -> None:
        """Until ``member`` is resident (``None``: nothing) and no swap is in flight or due."""

        async def resident() -> bool:
            state = await self.pool(pool)
            return bool(
                state["phase"] == "idle"
                and state["resident"] == member
                and state["swapping"] is None
            )

        await eventually(resident, timeout=timeout)

    async def wait_pool_known(self, pool: str = "gpu0", timeout: float = 15) -> dict[str, Any]:
        """Until a live controller has derived ``pool``'s state (phase no longer
        ``unknown``): before that it refuses admin actions (409) and holds acquires. A
        controller's /readyz covers NATS and its store, not this."""

        async def known() -> dict[str, Any] | None:
            state = await self.pool(pool)
            return state if state["phase"] != "unknown" else None

        result: dict[str, Any] = await eventually(known, timeout=timeout)
        return result

    async def state_hash(self, pool: str = "gpu0") -> dict[str, str]:
        client: aioredis.Redis = aioredis.from_url(self.store_url, decode_responses=True)
        try:
            result: dict[str, str] = await client.hgetall(Keys(self.prefix).pool_state(pool))
            return result
        finally:
            await client.aclose()

    @property
    def store_url(self) -> str:
        """The Redis the controllers keep the pool state in."""
        return self.redis_url

    async def _scores(self, key: str) -> dict[str, float]:
        client: aioredis.Redis = aioredis.from_url(self.store_url, decode_responses=True)
        try:
            pairs = await client.zrange(key, 0, -1, withscores=True)
        finally:
            await client.aclose()
        return {str(name): float(score) for name, score in pairs}

    async def drain_times(self, member: str, pool: str = "gpu0") -> list[float]:
        """The recent measured drains (seconds) of ``member`` closed by maxWait, newest
        first."""
        return await self._floats(Keys(self.prefix).pool_member_drain_times(pool, member))

    async def request_times(self, member: str, pool: str = "gpu0") -> list[float]:
        """The longest request (seconds) of each recently released lease of ``member``
        (kept with maxWait), newest first."""
        return await self._floats(Keys(self.prefix).pool_member_request_times(pool, member))

    async def _floats(self, key: str) -> list[float]:
        client: aioredis.Redis = aioredis.from_url(self.store_url, decode_responses=True)
        try:
            values = await client.lrange(key, 0, -1)
        finally:
            await client.aclose()
        return [float(v) for v in values]

    async def lease_expiries(self, member: str, pool: str = "gpu0") -> dict[str, float]:
        """The live leases on ``member``: lease id -> expiry (ms, store clock). A renewal
        moves a lease's expiry forward; the reaper removes it once the expiry passes."""
        return await self._scores(Keys(self.prefix).pool_leases(pool, member))

    async def waiter_deadlines(self, member: str, pool: str = "gpu0") -> dict[str, float]:
        """Requests held for ``member``: request id -> hold deadline (ms, store clock)."""
        return await self._scores(Keys(self.prefix).pool_waiters(pool, member))

    async def store_now_ms(self) -> float:
        """The store's clock, the one lease expiries and hold deadlines are on."""
        client: aioredis.Redis = aioredis.from_url(self.store_url, decode_responses=True)
        try:
            seconds, micros = await client.time()
        finally:
            await client.aclose()
        return float(seconds) * 1000 + float(micros) / 1000

    async def wait_leases_gone(
        self, member: str, *, seen: dict[str, float], pool: str = "gpu0", timeout: float = 30
    ) -> tuple[float, float]:
        """Until ``member`` has no live lease: (the latest expiry a lease of it had, among
        ``seen`` (read while they were live) and those read meanwhile; the store's clock
        once they were gone). Gone at or after that expiry: reaped; before it: released."""
        assert seen, "no live lease to watch"
        latest = max(seen.values())

        async def gone() -> bool:
            nonlocal latest
            live = await self.lease_expiries(member, pool)
            latest = max([latest, *live.values()])
            return not live

        await eventually(gone, timeout=timeout, interval=0.02)
        return latest, await self.store_now_ms()

    async def wait_slots_idle(self, backend: str, timeout: float = 15) -> None:
        """Until ``backend``'s sim reports no slot processing: a response can reach its
        client a moment before the sim frees the slot behind it."""
        url = self.sims[backend].url

        async def idle() -> bool:
            async with httpx.AsyncClient(timeout=5) as client:
                slots = (await client.get(f"{url}/slots")).json()
            return not any(slot["is_processing"] for slot in slots)

        await eventually(idle, timeout=timeout)

    async def ledger(self, gpu: str = "gpu0") -> list[LedgerEntry]:
        client: aioredis.Redis = aioredis.from_url(self.redis_url, decode_responses=True)
        try:
            return await read_timeline(client, Keys(self.prefix), gpu)
        finally:
            await client.aclose()

    async def upstream_ended(self, request_id: str, outcome: str, gpu: str = "gpu0") -> bool:
        """The sim that served ``request_id`` recorded its end with ``outcome`` (for
        example ``disconnected``: the router cut the upstream request)."""
        return any(
            e.event == "serve_end"
            and e.fields.get("request_id") == request_id
            and e.fields.get("outcome") == outcome
            for e in await self.ledger(gpu)
        )

    def capacity_gib(self, gpu: str = "gpu0") -> float | None:
        """The capacity of the pool ``gpu`` is (docs/adr/0008); ``None``: one resident."""
        pool = next((p for p in self.config.get("pools", []) if p["name"] == gpu), {})
        capacity = pool.get("capacity")
        if not capacity:
            return None
        if "gpuMemoryGiB" in capacity:
            return float(capacity["gpuMemoryGiB"])
        return float(sum(d["memoryGiB"] for d in capacity["devices"]))

    async def verdict(self, gpu: str = "gpu0", *, excused: Collection[str] = ()) -> Verdict:
        """The oracle's judgement of ``gpu``'s ledger (:mod:`tests.support.oracle`), with
        the ledger writes its live sims counted as failed; a capacity pool's is judged
        against its capacity."""
        verdict = await judge_gpu(
            self.redis_url,
            self.prefix,
            gpu,
            excused=excused,
            capacity_gib=self.capacity_gib(gpu),
        )
        return replace(verdict, write_failures=await self.ledger_write_failures(gpu))

    async def ledger_write_failures(self, gpu: str = "gpu0") -> int:
        """Ledger writes the live sims of ``gpu``'s members failed (a failed last write
        leaves no gap in the sequence for the verdict to see; the sim counts it)."""
        members = {
            backend["name"]
            for backend in self.config["backends"]
            if backend.get("pool", {}).get("name") == gpu
        }
        failures = 0
        async with httpx.AsyncClient(timeout=5) as client:
            for name, sim in self.sims.items():
                if name in members and sim.alive():
                    state = (await client.get(f"{sim.url}/control/state")).json()
                    failures += int(state["ledger_write_failures"])
        return failures

    async def assert_invariants(
        self, gpu: str = "gpu0", *, excused: Collection[str] = ()
    ) -> Verdict:
        """The full verdict holds on ``gpu``'s ledger; ``excused``: requests whose router
        died or froze past its lease (their cuts are counted apart, not as violations)."""
        verdict = await self.verdict(gpu, excused=excused)
        assert verdict.ok, (
            f"ledger of {gpu} violates the invariants: {verdict.summary()} {verdict}"
            + self._write_failure_lines()
        )
        return verdict

    def _write_failure_lines(self) -> str:
        """What the sims logged of their failed ledger writes (the error says why)."""
        lines = [
            f"{name}: {line}"
            for name, sim in self.sims.items()
            for line in sim.log_text().splitlines()
            if "sim_ledger_write_failed" in line
        ]
        return "".join(f"\n  {line}" for line in lines)

    async def judged_ledger(self, gpu: str = "gpu0") -> list[LedgerEntry]:
        """``gpu``'s ledger, once the full verdict on it holds (for further checks)."""
        await self.assert_invariants(gpu)
        return await self.ledger(gpu)

    def publishers(self) -> list[Managed]:
        """Every process that publishes audit events (routers and controllers)."""
        return [*self.routers, *self.controllers.values()]

    async def audit(self) -> list[dict[str, Any]]:
        """Every audit event in the stream so far, oldest first (events still in a
        publisher's buffer are not there yet: see :meth:`settled_audit`)."""
        return await stream_events(self.nats_url, f"AUDIT_{self.prefix}", f"{self.prefix}.audit.>")

    async def settled_audit(self) -> list[dict[str, Any]]:
        """The whole audit trail once every live publisher has flushed its buffer: what an
        absence check must read (an event emitted before this call cannot be missing)."""
        await publishers_flushed(self.publishers())
        return await self.audit()

    async def wait_audit(
        self, predicate: Callable[[dict[str, Any]], bool], *, count: int = 1, timeout: float = 10
    ) -> list[dict[str, Any]]:
        async def matching() -> list[dict[str, Any]]:
            found = [e for e in await self.audit() if predicate(e)]
            return found if len(found) >= count else []

        result: list[dict[str, Any]] = await eventually(matching, timeout=timeout, interval=0.2)
        return result

    async def metric(self, router: int, name: str, labels: Mapping[str, str]) -> float:
        async with httpx.AsyncClient(timeout=5) as client:
            text = (await client.get(f"{self.routers[router].url}/metrics")).text
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name + "{"):
                continue
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total


def pool_stack_config(
    *,
    judge: Mapping[str, Any] | None = None,
    coder: Mapping[str, Any] | None = None,
    pool: Mapping[str, Any] | None = None,
    rules: list[dict[str, Any]] | None = None,
    extra_backends: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A 24 GiB sim GPU shared by ``judge`` (6 GiB, slow tokens) and ``coder`` (20 GiB, slow
    load): two residents would not fit, so an overlap is also an out-of-memory failure."""
    ports = {name: free_port() for name in ("judge", "coder")}
    return {
        "router": {"name": "r", "requestTimeout": "60s"},
        "backends": [
            {
                "name": name,
                "address": f"http://127.0.0.1:{port}",
                "pool": {"name": "gpu0", "member": name},
            }
            for name, port in ports.items()
        ]
        + list(extra_backends or []),
        "pools": [
            {
                "name": "gpu0",
                "swapBudget": "30s",
                "leaseTtl": "2s",
                "default": "judge",
                "driver": {"kind": "sim", "gpuMemoryGiB": 24},
                "members": [
                    {
                        "name": "judge",
                        "sim": {
                            "loadSeconds": 0.3,
                            "unloadSeconds": 0.1,
                            "memoryGiB": 6,
                            "tokensPerSecond": 20,
                            "slots": 4,
                            **(judge or {}),
                        },
                    },
                    {
                        "name": "coder",
                        "sim": {
                            "loadSeconds": 1.5,
                            "unloadSeconds": 0.1,
                            "memoryGiB": 20,
                            "tokensPerSecond": 200,
                            "slots": 4,
                            **(coder or {}),
                        },
                    },
                ],
                **(pool or {}),
            }
        ],
        "rules": rules
        or [
            {
                "name": "prefer-coder-ifidle",
                "match": {"models": ["either"]},
                "route": {"backends": ["coder", "judge"], "poolActivation": "IfIdle"},
            },
            {
                "name": "prefer-coder-wait",
                "match": {"models": ["either-wait"]},
                "route": {"backends": ["coder", "judge"], "poolActivation": "Wait"},
            },
            {
                "name": "coder-only-ifidle",
                "match": {"models": ["coder-ifidle"]},
                "route": {"backends": ["coder"], "poolActivation": "IfIdle"},
            },
            {"name": "judge", "match": {"models": ["judge"]}, "route": {"backends": ["judge"]}},
            {"name": "coder", "match": {"models": ["coder"]}, "route": {"backends": ["coder"]}},
        ],
    }
