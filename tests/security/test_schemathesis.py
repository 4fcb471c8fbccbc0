"""schemathesis over the OpenAPI documents of a live router and a live audit service,
every check enabled: the run must end with zero failures."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import yaml

from hotseat.launcher import Managed, find_binary, free_port, start_service
from tests.audit.support import drop_schema, fill_history, postgres_schema_dsn
from tests.router.upstreams import FakeUpstream
from tests.security.conftest import CLIENT_KEY

CONFIG = Path(__file__).with_name("schemathesis.toml")
EXAMPLES = 30
"""Test cases per operation and phase (a few hundred requests per service)."""


def schemathesis(url: str, workdir: Path, *headers: str) -> subprocess.CompletedProcess[str]:
    argv = [
        find_binary("schemathesis"),
        "--config-file",
        str(CONFIG),
        "run",
        f"{url}/openapi.json",
        "--checks",
        "all",
        "--max-examples",
        str(EXAMPLES),
        "--workers",
        "1",
        "--seed",
        "7",
        "--request-timeout",
        "20",
        "--generation-database",
        "none",
        "--phases",
        "examples,coverage,fuzzing",
        "--suppress-health-check",
        "too_slow",
        *(arg for header in headers for arg in ("-H", header)),
    ]
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=workdir,
        env={"NO_COLOR": "1", "PATH": str(Path(argv[0]).parent)},
    )


@pytest.fixture
async def router(tmp_path: Path, prefix: str, nats_server: Managed) -> AsyncIterator[Managed]:
    """A router with an API key in front of an upstream that accepts anything: what is
    fuzzed is the router's own contract (its document says what the router checks; the
    rest of a body is the upstream's to judge)."""
    echo = FakeUpstream("echo", mode="echo")
    await echo.start()
    config = tmp_path / "hotseat.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "router": {"name": "st", "maxBodyBytes": 65536},
                "backends": [{"name": "echo", "address": echo.url}],
                "rules": [
                    {
                        "name": "m",
                        "match": {"models": ["assistant"]},
                        "route": {"backends": ["echo"]},
                    }
                ],
                "defaultRoute": "echo",
                "unknownModels": "DefaultRoute",
            }
        )
    )
    env = {
        "HOTSEAT_CONFIG": str(config),
        "HOTSEAT_NATS_URL": nats_server.url,
        "HOTSEAT_SUBJECT_PREFIX": prefix,
        "HOTSEAT_AUDIT_STREAM": f"AUDIT_{prefix}",
        "HOTSEAT_API_KEYS": CLIENT_KEY,
    }
    proc = start_service(
        "router", "hotseat-router", [], port=free_port(), log_dir=tmp_path, env=env
    )
    yield proc
    proc.stop(5)
    await echo.stop()


async def test_router_openapi_has_no_failures(router: Managed, tmp_path: Path) -> None:
    """Every schemathesis check passes against the router (authenticated, backed by a
    sim): status codes, content types, headers and bodies as documented, invalid input
    rejected, no server error, and the API key enforced."""
    result = await asyncio.to_thread(
        schemathesis, router.url, tmp_path, f"Authorization: Bearer {CLIENT_KEY}"
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


@pytest.fixture(params=["sqlite", "postgres-with-history"])
async def audit_dsn(
    request: pytest.FixtureRequest, tmp_path: Path, prefix: str
) -> AsyncIterator[str]:
    """An empty SQLite store, or PostgreSQL already holding a week of events (what the
    service runs on in production: every query then answers with real rows)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'audit.db'}"
        return
    base: str = request.getfixturevalue("postgres_dsn")
    dsn = postgres_schema_dsn(base, prefix)
    try:
        await fill_history(dsn)
        yield dsn
    finally:
        drop_schema(base, prefix)


@pytest.fixture
def audit(tmp_path: Path, prefix: str, nats_server: Managed, audit_dsn: str) -> Iterator[Managed]:
    proc = start_service(
        "audit",
        "hotseat-audit",
        [
            "--nats-url",
            nats_server.url,
            "--subject-prefix",
            prefix,
            "--audit-stream",
            f"AUDIT_{prefix}",
            "--dsn",
            audit_dsn,
        ],
        port=free_port(),
        log_dir=tmp_path,
    )
    yield proc
    proc.stop(5)


async def test_audit_openapi_has_no_failures(audit: Managed, tmp_path: Path) -> None:
    """Every schemathesis check passes against the audit service's query API, on an empty
    SQLite store and on PostgreSQL with data."""
    result = await asyncio.to_thread(schemathesis, audit.url, tmp_path)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
