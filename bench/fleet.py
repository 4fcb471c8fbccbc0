"""The benchmarks' Hotseat stack: a private NATS and Redis, and sim backends, pool
controllers and routers as processes, all reading one config under one prefix.

    infra = start_infra(workdir, monitor=True, sims_redis=True)
    fleet = Fleet(workdir, infra, config, prefix="scale")
    fleet.start_sims(["p0a", "p0b"])
    controller = fleet.start_controller()
    router = fleet.start_router()
    ...
    fleet.stop()
    infra.stop()

A module of the benchmarks, not of Hotseat: ``bench/`` scripts import it as ``fleet``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hotseat import launcher
from hotseat.launcher import Managed, ProcessGroup, free_port

FAST_TIMINGS = {
    "HOTSEAT_TICK_INTERVAL": "0.1",
    "HOTSEAT_RECONCILE_INTERVAL": "0.5",
    "HOTSEAT_HEARTBEAT_TTL": "1.0",
    "HOTSEAT_SHUTDOWN_GRACE": "3",
}
"""Quick supervision, for the traces that replay swaps in seconds."""

START_TIMEOUT_S = 120.0
"""A process is given this long to answer: start-up is slow on a loaded host."""


@dataclass
class Infra:
    """The NATS and Redis the fleets of one run share."""

    nats: Managed
    redis: Managed
    """The controllers' store (the one a bench counts)."""
    sims_redis: Managed | None
    """The sims' ledger, when it must stay out of the controllers' counts."""
    monitor: str | None
    """NATS's monitoring endpoint (``/varz``, ``/subsz``, ``/connz``), when asked for."""

    def stop(self) -> None:
        for proc in (self.sims_redis, self.redis, self.nats):
            if proc is not None:
                proc.stop(5)


def start_infra(workdir: Path, *, monitor: bool = False, sims_redis: bool = False) -> Infra:
    monitor_port = free_port() if monitor else None
    extra = ("-m", str(monitor_port)) if monitor_port else ()
    nats = launcher.start_nats(workdir / "nats", extra_args=extra)
    redis = launcher.start_redis(workdir / "redis")
    ledger = launcher.start_redis(workdir / "redis-sims") if sims_redis else None
    url = f"http://127.0.0.1:{monitor_port}" if monitor_port else None
    return Infra(nats, redis, ledger, url)


def sim_backend(name: str, port: int, pool: str, member: str) -> dict[str, Any]:
    """A backend entry for a sim pool member listening on ``port``."""
    return {
        "name": name,
        "address": f"http://127.0.0.1:{port}",
        "pool": {"name": pool, "member": member},
    }


class Fleet:
    """Processes of one config: sims, controllers and routers, stopped together."""

    def __init__(
        self,
        workdir: Path,
        infra: Infra,
        config: dict[str, Any],
        *,
        prefix: str,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.config = config
        self.group = ProcessGroup()
        path = workdir / f"{prefix}.yaml"
        path.write_text(yaml.safe_dump(config))
        self.env = {
            "HOTSEAT_LOG_LEVEL": "warning",
            "HOTSEAT_NATS_URL": infra.nats.url,
            "HOTSEAT_REDIS_URL": infra.redis.url,
            "HOTSEAT_SUBJECT_PREFIX": prefix,
            "HOTSEAT_KEY_PREFIX": prefix,
            "HOTSEAT_AUDIT_STREAM": f"AUDIT_{prefix}",
            "HOTSEAT_CONFIG": str(path),
            **(env or {}),
        }
        ledger = infra.sims_redis.url if infra.sims_redis else infra.redis.url
        self._sim_env = {**self.env, "HOTSEAT_REDIS_URL": ledger}

    def start_sims(self, names: Iterable[str] | None = None) -> list[Managed]:
        """A sim process for each backend named (every backend when ``None``), on the
        port its address gives."""
        wanted = None if names is None else set(names)
        return [
            self._start(
                f"sim-{b['name']}", "hotseat-sim", ["--backend", b["name"]],
                port=int(b["address"].rsplit(":", 1)[1]), env=self._sim_env,
                ready_path="/control/state",
            )
            for b in self.config["backends"]
            if wanted is None or b["name"] in wanted
        ]  # fmt: skip

    def start_controller(self, name: str = "controller", args: Sequence[str] = ()) -> Managed:
        return self._start(name, "hotseat-controller", args)

    def start_router(self, name: str = "router", args: Sequence[str] = ()) -> Managed:
        return self._start(name, "hotseat-router", args)

    def _start(
        self,
        name: str,
        entry_point: str,
        args: Sequence[str],
        *,
        port: int | None = None,
        env: Mapping[str, str] | None = None,
        ready_path: str = "/readyz",
    ) -> Managed:
        proc = launcher.start_service(
            name, entry_point, list(args), port=port or free_port(), log_dir=self.workdir,
            env=env or self.env, ready_path=ready_path, timeout=START_TIMEOUT_S,
        )  # fmt: skip
        return self.group.add(proc)

    def stop(self) -> None:
        self.group.stop_all(5)
