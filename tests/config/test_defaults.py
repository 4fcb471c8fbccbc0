"""What a config gets when a field is left out (the defaults PRODUCT.md promises)."""

from __future__ import annotations

from typing import Any

import pytest

from hotseat_common.config import (
    BusySignal,
    DefaultRouteStrategy,
    HotseatConfig,
    PoolActivation,
    Tier,
    load_config,
    parse_config,
)
from hotseat_common.config.model import SimDriver, SwapPolicy
from tests.config.conftest import example_files

MINIMAL: dict[str, Any] = {
    "backends": [
        {"name": "a", "address": "http://127.0.0.1:9101", "pool": {"name": "p", "member": "a"}}
    ],
    "pools": [{"name": "p", "members": [{"name": "a"}]}],
    "rules": [{"name": "r", "route": {"backends": ["a"]}}],
}


@pytest.fixture
def minimal() -> HotseatConfig:
    return parse_config(MINIMAL)


def test_pool_activation_defaults_to_wait(minimal: HotseatConfig):
    """A rule that does not say poolActivation waits for the swap (Wait)."""
    assert minimal.rules[0].route.pool_activation is PoolActivation.WAIT


def test_pool_defaults(minimal: HotseatConfig):
    """A pool holds requests 300s, bounds a swap at 10m, 1000 waiters, sticky, leases, sim."""
    pool = minimal.pools[0]
    assert pool.swap_budget == 300.0
    assert pool.swap_timeout == 600.0
    assert pool.max_waiters == 1000
    assert pool.swap_policy is SwapPolicy.STICKY
    assert pool.busy_signal is BusySignal.LEASES
    assert pool.default is None
    assert pool.lease_ttl == 15.0
    assert pool.swap_failure_backoff == 5.0
    assert pool.driver == SimDriver(kind="sim", gpuMemoryGiB=24.0)


def test_router_defaults(minimal: HotseatConfig):
    """The router streams with a 5m idle gap, bounds requests at 10m and bodies at 32 MiB."""
    router = minimal.router
    assert router.name == "default"
    assert router.stream_idle_timeout == 300.0
    assert router.request_timeout == 600.0
    assert router.max_body_bytes == 32 * 1024 * 1024
    assert router.timeout == 120.0
    assert router.api_keys is None
    assert router.classification.header_key == "x-hotseat-classification"


def test_backend_and_top_level_defaults(minimal: HotseatConfig):
    """A backend is local, keeps the model name, has no credentials; routing is Static."""
    backend = minimal.backends[0]
    assert backend.tier is Tier.LOCAL
    assert backend.model is None
    assert backend.timeout is None
    assert backend.credentials_env == ""
    assert minimal.default_route is None
    assert minimal.default_route_strategy is DefaultRouteStrategy.STATIC


def test_sim_member_defaults():
    """A sim member without settings loads in 2s, holds 6 GiB, 50 tokens/s, 4 slots."""
    raw = {"pools": [{"name": "p", "members": [{"name": "a", "sim": {}}]}]}
    sim = parse_config(raw).pools[0].members[0].sim
    assert sim is not None
    assert (sim.load_seconds, sim.unload_seconds) == (2.0, 0.2)
    assert (sim.memory_gi_b, sim.tokens_per_second, sim.slots) == (6.0, 50.0, 4)


def test_empty_mapping_is_a_valid_empty_config():
    """``{}`` declares nothing and is valid; every section takes its default."""
    config = parse_config({})
    assert (config.backends, config.pools, config.rules) == ((), (), ())


@pytest.mark.parametrize("path", example_files(), ids=lambda p: p.name)
def test_dump_of_a_loaded_config_loads_back_equal(path):
    """A loaded config written back as JSON (durations as strings) validates to the same config."""
    config = load_config(path)
    dumped = config.model_dump(mode="json", by_alias=True)
    assert isinstance(dumped["pools"][0]["swapBudget"], str)
    assert parse_config(dumped) == config
