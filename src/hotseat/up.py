"""``hotseat up``: run a whole local stack in the foreground (filled in below)."""

from __future__ import annotations

from pathlib import Path


def run_up(*, config_path: Path, router_port: int) -> int:
    """Start infrastructure, sim backends and services; stop them all on SIGINT/SIGTERM."""
    raise NotImplementedError(f"hotseat up is not built yet ({config_path}, {router_port})")
