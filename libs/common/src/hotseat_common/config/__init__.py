"""The Hotseat config file: schema, loader and cross-checks."""

from hotseat_common.config.errors import ConfigError, ConfigIssue
from hotseat_common.config.loader import load_config, parse_config
from hotseat_common.config.model import (
    Backend,
    BusySignal,
    DefaultRouteStrategy,
    HotseatConfig,
    ModelGroup,
    Pool,
    PoolActivation,
    PoolMember,
    RouterPolicy,
    Rule,
    Tier,
    UnknownModels,
)

__all__ = [
    "Backend",
    "BusySignal",
    "ConfigError",
    "ConfigIssue",
    "DefaultRouteStrategy",
    "HotseatConfig",
    "ModelGroup",
    "Pool",
    "PoolActivation",
    "PoolMember",
    "RouterPolicy",
    "Rule",
    "Tier",
    "UnknownModels",
    "load_config",
    "parse_config",
]
