"""Security fixtures: a router process with client API keys in front of a header-echoing
upstream, and the secrets the tests then look for in every log."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from hotseat.launcher import Managed, free_port, start_service
from tests.router.conftest import client, running, start_router, upstream
from tests.router.upstreams import FakeUpstream
from tests.security.recording import RecordingUpstream
from tests.support.stack import Stack, pool_stack_config

# The in-process router harness of tests/router, for tests that script the activation
# client or need the router's own objects.
__all__ = ["client", "running", "start_router", "upstream"]

CLIENT_KEY = "sk-client-7f3a9c1e5b2d4f60"
OTHER_KEY = "sk-client-second-0c9e8d7a"
UPSTREAM_KEY = "sk-upstream-cloud-91b7e2d4"
ADMIN_TOKEN = "admin-token-4e1f8a2b6c9d"
MAX_BODY = 4096


@dataclass
class SecureRouter:
    router: Managed
    echo: FakeUpstream
    cloud: FakeUpstream
    workdir: Path

    @property
    def url(self) -> str:
        return self.router.url


def router_config(echo: FakeUpstream, cloud: FakeUpstream) -> dict[str, object]:
    return {
        "router": {"name": "secure", "maxBodyBytes": MAX_BODY},
        "backends": [
            {"name": "echo", "address": echo.url},
            {
                "name": "cloud",
                "address": cloud.url,
                "tier": "cloud",
                "credentialsEnv": "HOTSEAT_TEST_CLOUD_KEY",
            },
        ],
        "rules": [
            {"name": "m", "match": {"models": ["m"]}, "route": {"backends": ["echo"]}},
            {"name": "c", "match": {"models": ["c"]}, "route": {"backends": ["cloud"]}},
        ],
        "defaultRoute": "echo",
        "unknownModels": "DefaultRoute",
    }


async def secure_router_with(
    tmp_path: Path, prefix: str, nats_server: Managed, extra_env: dict[str, str]
) -> AsyncIterator[SecureRouter]:
    """The secure router process with ``extra_env`` (its limits) added to its settings."""
    echo, cloud = FakeUpstream("echo", mode="echo"), FakeUpstream("cloud", mode="echo")
    await echo.start()
    await cloud.start()
    config = tmp_path / "hotseat.yaml"
    config.write_text(yaml.safe_dump(router_config(echo, cloud)))
    env = {
        "HOTSEAT_CONFIG": str(config),
        "HOTSEAT_NATS_URL": nats_server.url,
        "HOTSEAT_SUBJECT_PREFIX": prefix,
        "HOTSEAT_AUDIT_STREAM": f"AUDIT_{prefix}",
        "HOTSEAT_API_KEYS": f"{CLIENT_KEY},{OTHER_KEY}",
        "HOTSEAT_TEST_CLOUD_KEY": UPSTREAM_KEY,
        "HOTSEAT_LOG_LEVEL": "debug",
        **extra_env,
    }
    router = start_service(
        "router", "hotseat-router", [], port=free_port(), log_dir=tmp_path, env=env
    )
    try:
        yield SecureRouter(router, echo, cloud, tmp_path)
    finally:
        router.stop(5)
        await echo.stop()
        await cloud.stop()


@pytest.fixture
async def secure_router(
    tmp_path: Path, prefix: str, nats_server: Managed
) -> AsyncIterator[SecureRouter]:
    async for router in secure_router_with(tmp_path, prefix, nats_server, {}):
        yield router


LIMITS = {
    "HOTSEAT_MAX_HEADER_BYTES": "4096",
    "HOTSEAT_MAX_HEADERS": "20",
    "HOTSEAT_HEADER_TIMEOUT": "1",
    "HOTSEAT_BODY_TIMEOUT": "1",
    "HOTSEAT_MAX_CONNECTIONS": "8",
    "HOTSEAT_BODY_BUDGET_BYTES": "5000",
}
"""Small limits, so that a test passes each with a few bytes and a second or two."""


@pytest.fixture
async def limited_router(
    tmp_path: Path, prefix: str, nats_server: Managed
) -> AsyncIterator[SecureRouter]:
    """The secure router (maxBodyBytes 4096) with the small :data:`LIMITS`."""
    async for router in secure_router_with(tmp_path, prefix, nats_server, LIMITS):
        yield router


SERVED_AS = "served-m"
RECORDED_LIMITS = {
    "HOTSEAT_MAX_HEADER_BYTES": "4096",
    "HOTSEAT_MAX_HEADERS": "20",
    "HOTSEAT_HEADER_TIMEOUT": "1",
    "HOTSEAT_BODY_TIMEOUT": "1",
    "HOTSEAT_BODY_BUDGET_BYTES": "8192",
    "HOTSEAT_MAX_JSON_DEPTH": "200",
}
"""Small limits, the body budget as small as allowed (the largest body, so that one
request's body always fits), the deepest JSON the router may be set to read."""


@dataclass
class RecordedRouter:
    router: Managed
    upstream: RecordingUpstream

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.router.url.removeprefix("http://").split(":")
        return host, int(port)


@pytest.fixture
def recorded_router(tmp_path: Path, prefix: str, nats_server: Managed) -> Iterator[RecordedRouter]:
    """A router (maxBodyBytes 8192, :data:`RECORDED_LIMITS`) in front of a
    :class:`RecordingUpstream`: model ``m`` goes to a backend that serves it as
    ``served-m`` (the router rewrites the model), ``p*`` to one that takes the body as
    it is; both are the one recorder."""
    upstream = RecordingUpstream()
    upstream.start()
    config = {
        "router": {"name": "recorded", "maxBodyBytes": 8192},
        "backends": [
            {"name": "renames", "address": upstream.url, "model": SERVED_AS},
            {"name": "plain", "address": upstream.url},
        ],
        "rules": [
            {"name": "m", "match": {"models": ["m"]}, "route": {"backends": ["renames"]}},
            {"name": "p", "match": {"models": ["p*"]}, "route": {"backends": ["plain"]}},
        ],
    }
    (tmp_path / "hotseat.yaml").write_text(yaml.safe_dump(config))
    env = {
        "HOTSEAT_CONFIG": str(tmp_path / "hotseat.yaml"),
        "HOTSEAT_NATS_URL": nats_server.url,
        "HOTSEAT_SUBJECT_PREFIX": prefix,
        "HOTSEAT_AUDIT_STREAM": f"AUDIT_{prefix}",
        "HOTSEAT_API_KEYS": CLIENT_KEY,
        **RECORDED_LIMITS,
    }
    router = start_service(
        "router", "hotseat-router", [], port=free_port(), log_dir=tmp_path, env=env
    )
    try:
        yield RecordedRouter(router, upstream)
    finally:
        router.stop(5)
        upstream.stop()


@pytest.fixture
def admin_stack(
    tmp_path: Path, prefix: str, nats_server: Managed, redis_server: Managed
) -> Iterator[Stack]:
    """Sims and a controller with the admin token :data:`ADMIN_TOKEN`; the pool has no
    default member, so nothing is resident until an admin action loads one."""
    config = pool_stack_config(pool={"default": None})
    config["pools"][0].pop("default")
    stack = Stack(tmp_path, prefix, nats_server.url, redis_server.url, config)
    stack.admin_token = ADMIN_TOKEN
    stack.start_sims()
    stack.start_controller("c1")
    try:
        yield stack
    finally:
        stack.stop()
