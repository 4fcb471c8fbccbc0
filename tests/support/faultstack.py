"""A :class:`~tests.support.stack.Stack` whose parts can sit behind fault proxies or on
their own infrastructure.

The sims always write their GPU ledger to the stack's ``redis_url`` (the oracle's view of
the truth must survive whatever the test does to the controllers' Redis), while each
controller and router may get its own NATS or Redis URL (a :class:`FaultProxy`, or a
private server the test restarts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
import redis.asyncio as aioredis

from hotseat.launcher import Managed, free_port, start_service
from hotseat_common.keys import Keys
from tests.support.oracle import Verdict, judge_gpu
from tests.support.stack import Stack


@dataclass
class FaultStack(Stack):
    controller_redis_url: str | None = None
    """Redis of the controllers (default: the stack's)."""
    controller_nats_url: str | None = None
    router_nats_url: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    audits: list[Managed] = field(default_factory=list)
    controller_urls: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    retired: list[Managed] = field(default_factory=list)
    """Controllers that were replaced by a restart under the same name."""
    starts: int = 0

    @property
    def env(self) -> dict[str, str]:
        return {**super().env, **self.extra_env}

    def _role_env(self, nats_url: str | None, redis_url: str | None) -> dict[str, str]:
        env = dict(self.env)
        if nats_url is not None:
            env["HOTSEAT_NATS_URL"] = nats_url
        if redis_url is not None:
            env["HOTSEAT_REDIS_URL"] = redis_url
        return env

    def start_sims(self) -> None:
        """Pooled sims start unloaded; unpooled ones start loaded (nothing would load them)."""
        for backend in self.config["backends"]:
            port = int(backend["address"].rsplit(":", 1)[1])
            args = ["--backend", backend["name"]]
            if "pool" not in backend:
                args += ["--loaded", "true"]
            self.sims[backend["name"]] = start_service(
                f"sim-{backend['name']}",
                "hotseat-sim",
                args,
                port=port,
                log_dir=self.workdir,
                env=self.env,
                ready_path="/control/state",
            )

    def start_controller(
        self, name: str = "c1", *, nats_url: str | None = None, redis_url: str | None = None
    ) -> Managed:
        nats_url = nats_url or self.controller_nats_url
        redis_url = redis_url or self.controller_redis_url
        self.controller_urls[name] = (nats_url, redis_url)
        self.starts += 1
        proc = start_service(
            f"controller-{name}-{self.starts}",
            "hotseat-controller",
            ["--instance", name],
            port=free_port(),
            log_dir=self.workdir,
            env=self._role_env(nats_url, redis_url),
        )
        old = self.controllers.get(name)
        if old is not None:
            self.retired.append(old)
        self.controllers[name] = proc
        return proc

    def restart_controller(self, name: str) -> Managed:
        """Start ``name`` again (after a kill) with the URLs it had."""
        nats_url, redis_url = self.controller_urls.get(name, (None, None))
        return self.start_controller(name, nats_url=nats_url, redis_url=redis_url)

    def start_router(self, *, nats_url: str | None = None, **env: str) -> Managed:
        role = self._role_env(nats_url or self.router_nats_url, None)
        proc = start_service(
            f"router-{len(self.routers)}",
            "hotseat-router",
            [],
            port=free_port(),
            log_dir=self.workdir,
            env={**role, **env},
        )
        self.routers.append(proc)
        return proc

    def start_audit(self, dsn: str, *, nats_url: str | None = None, **env: str) -> Managed:
        role = self._role_env(nats_url, None)
        proc = start_service(
            f"audit-{len(self.audits)}",
            "hotseat-audit",
            ["--dsn", dsn],
            port=free_port(),
            log_dir=self.workdir,
            env={**role, **env},
        )
        self.audits.append(proc)
        return proc

    def all_procs(self) -> list[Managed]:
        return [
            *self.routers,
            *self.controllers.values(),
            *self.retired,
            *self.audits,
            *self.sims.values(),
        ]

    def stop(self) -> None:
        for proc in self.all_procs():
            proc.stop(5)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.log_text()[-4000:]}" for p in self.all_procs())

    # --- observation ------------------------------------------------------------------

    async def state_hash(self, pool: str = "gpu0") -> dict[str, str]:
        url = self.controller_redis_url or self.redis_url
        client: aioredis.Redis = aioredis.from_url(url, decode_responses=True)
        try:
            raw = await client.hgetall(Keys(self.prefix).pool_state(pool))
            return {str(k): str(v) for k, v in raw.items()}
        finally:
            await client.aclose()

    async def verdict(self, gpu: str = "gpu0") -> Verdict:
        return await judge_gpu(self.redis_url, self.prefix, gpu)

    async def assert_invariants(self, gpu: str = "gpu0") -> Verdict:
        verdict = await self.verdict(gpu)
        assert verdict.ok, f"ledger of {gpu} violates the invariants: {verdict}"
        return verdict

    async def pool_via(self, controller: str, name: str = "gpu0") -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=5) as client:
            response = await client.get(f"{self.controllers[controller].url}/v1/pools/{name}")
            response.raise_for_status()
            result: dict[str, Any] = response.json()
            return result


async def metric_total(url: str, name: str) -> float:
    """The sum of every sample of ``name`` on ``url``/metrics (0 when absent)."""
    async with httpx.AsyncClient(timeout=5) as client:
        text = (await client.get(f"{url}/metrics")).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def audit_publishing(procs: list[Managed]) -> dict[str, float]:
    """Audit events published (acknowledged by JetStream), still buffered and dropped,
    summed over ``procs`` (routers and controllers)."""
    totals = {"published": 0.0, "buffered": 0.0, "dropped": 0.0}
    for proc in procs:
        if not proc.alive():
            continue
        totals["published"] += await metric_total(proc.url, "hotseat_audit_events_published_total")
        totals["buffered"] += await metric_total(proc.url, "hotseat_audit_events_buffered")
        totals["dropped"] += await metric_total(proc.url, "hotseat_audit_events_dropped_total")
    return totals
