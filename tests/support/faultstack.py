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

from hotseat.launcher import Managed, free_port, start_service
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

    @property
    def store_url(self) -> str:
        return self.controller_redis_url or self.redis_url

    async def pool_via(self, controller: str, name: str = "gpu0") -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=5) as client:
            response = await client.get(f"{self.controllers[controller].url}/v1/pools/{name}")
            response.raise_for_status()
            result: dict[str, Any] = response.json()
            return result
