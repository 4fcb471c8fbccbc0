"""Residency drivers: what "load" and "unload" mean for a pool's members."""

from __future__ import annotations

from hotseat_common.config.model import HotseatConfig, Pool
from hotseat_pool_controller.drivers.base import DriverError, ResidencyDriver
from hotseat_pool_controller.drivers.http import HttpDriver
from hotseat_pool_controller.drivers.kubernetes import KubernetesDriver
from hotseat_pool_controller.drivers.process import ProcessDriver
from hotseat_pool_controller.drivers.sim import SimDriver

__all__ = ["DriverError", "ResidencyDriver", "build_driver"]


def build_driver(config: HotseatConfig, pool: Pool) -> ResidencyDriver:
    """The driver for ``pool``'s ``driver.kind``."""
    kind = pool.driver.kind
    if kind == "sim":
        return SimDriver(config, pool)
    if kind == "process":
        return ProcessDriver(config, pool)
    if kind == "http":
        return HttpDriver(config, pool)
    if kind == "kubernetes":
        return KubernetesDriver(config, pool)
    raise NotImplementedError(f"pool {pool.name}: driver kind {kind!r} is not available yet")
