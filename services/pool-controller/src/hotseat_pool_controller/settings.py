"""Controller settings (``HOTSEAT_*``; every field is also a flag)."""

from __future__ import annotations

import os
import socket

from pydantic import Field, SecretStr

from hotseat_common.settings import RedisSettings, ServiceSettings


class ControllerSettings(ServiceSettings, RedisSettings):
    port: int = Field(default=8090, ge=0, le=65535, description="Admin API port")
    admin_token: SecretStr | None = Field(
        default=None, description="Bearer token for POST /v1/pools/{name}/swap and /unload"
    )
    tick_interval: float = Field(
        default=0.5,
        gt=0,
        description="Seconds between supervisor ticks of a pool in transition (a decision"
        " taken, a lease reaped, /slots to read, maxWait pending), and the least a pool rests",
    )
    idle_tick_interval: float = Field(
        default=5.0,
        gt=0,
        description="Seconds a pool's supervisor rests at most: it reads the pool at its next"
        " deadline (a lease expiring, a waiter giving up...) or when something wakes it",
    )
    reconcile_interval: float = Field(
        default=2.0, gt=0, description="Seconds between resident health checks"
    )
    heartbeat_ttl: float = Field(
        default=3.0, gt=0, description="A swap owner silent this long is taken over"
    )
    store_probe_interval: float = Field(
        default=0.25, gt=0, description="Seconds between probes of the pool store (Redis)"
    )
    store_probe_timeout: float = Field(
        default=0.5,
        gt=0,
        description="A store probe slower than this marks the store down (requests fail fast)",
    )
    max_concurrent_requests: int = Field(
        default=256, ge=1, description="NATS requests handled at once by this replica"
    )

    audit_url: str | None = Field(
        default=None,
        description="The audit service's URL: the web console's timeline and outcomes read it",
    )
    pool_updates_interval: float = Field(
        default=1.0,
        gt=0,
        description="Seconds between reads of the pools while someone watches them (/ui,"
        " /v1/pool-updates); an announced change is read at once",
    )

    def instance_name(self) -> str:
        return self.instance or f"controller-{socket.gethostname()}-{os.getpid()}"
