"""Credentials and TLS to NATS and Redis from settings, and secrets kept out of logs: a
whole stack runs against an authenticated TLS nats-server and a password-protected Redis,
then every log it wrote is searched for every secret it was given."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hotseat.launcher import (
    LaunchError,
    Managed,
    free_port,
    spawn,
    start_nats,
    start_redis,
    start_service,
    wait_for_marker,
)
from tests.audit.support import raw_rows
from tests.security.conftest import ADMIN_TOKEN, CLIENT_KEY, UPSTREAM_KEY
from tests.support.audit_trail import publishers_flushed
from tests.support.clients import chat_body
from tests.support.faultstack import FaultStack
from tests.support.stack import pool_stack_config
from tests.support.tls import TlsFiles, make_tls
from tests.support.waiting import eventually

NATS_USER = "hotseat"
NATS_PASSWORD = "nats-pw-5d2c7e91b0"
REDIS_PASSWORD = "redis-pw-a83f0b6e44"
NEAR_MISS_KEY = CLIENT_KEY[:-1] + "Z"
NEAR_MISS_TOKEN = ADMIN_TOKEN[:-1] + "Z"
SECRETS = [CLIENT_KEY, UPSTREAM_KEY, ADMIN_TOKEN, NATS_PASSWORD, REDIS_PASSWORD]


def secure_nats(workdir: Path, tls: TlsFiles) -> Managed:
    conf = workdir / "nats.conf"
    workdir.mkdir(parents=True, exist_ok=True)
    conf.write_text(
        f'authorization {{ user: "{NATS_USER}", password: "{NATS_PASSWORD}" }}\n'
        f'tls {{ cert_file: "{tls.cert}", key_file: "{tls.key}", timeout: 5 }}\n'
    )
    return start_nats(workdir, extra_args=["-c", str(conf)])


@pytest.fixture
def tls(tmp_path: Path) -> TlsFiles:
    return make_tls(tmp_path / "tls")


@pytest.fixture
def infra(tmp_path: Path, tls: TlsFiles) -> Iterator[tuple[Managed, Managed]]:
    nats = secure_nats(tmp_path / "nats", tls)
    redis = start_redis(tmp_path / "redis", extra_args=["--requirepass", REDIS_PASSWORD])
    try:
        yield nats, redis
    finally:
        nats.stop()
        redis.stop()


def credentials(tls: TlsFiles) -> dict[str, str]:
    return {
        "HOTSEAT_NATS_USER": NATS_USER,
        "HOTSEAT_NATS_PASSWORD": NATS_PASSWORD,
        "HOTSEAT_NATS_TLS_CA": str(tls.ca),
        "HOTSEAT_REDIS_PASSWORD": REDIS_PASSWORD,
        "HOTSEAT_API_KEYS": CLIENT_KEY,
        "HOTSEAT_TEST_CLOUD_KEY": UPSTREAM_KEY,
        "HOTSEAT_LOG_LEVEL": "debug",
    }


def secure_config() -> dict[str, Any]:
    cloud = {
        "name": "cloud",
        "address": f"http://127.0.0.1:{free_port()}",
        "tier": "cloud",
        "credentialsEnv": "HOTSEAT_TEST_CLOUD_KEY",
    }
    config = pool_stack_config(pool={"leaseTtl": "3s"}, extra_backends=[cloud])
    config["rules"].append(
        {"name": "cloud", "match": {"models": ["cloud"]}, "route": {"backends": ["cloud"]}}
    )
    return config


async def test_full_run_over_tls_nats_and_password_redis_logs_no_secret(
    tmp_path: Path, prefix: str, tls: TlsFiles, infra: tuple[Managed, Managed]
) -> None:
    """Router, two controllers, audit and sims connect to an authenticated TLS NATS and a
    password-protected Redis from settings alone and serve pooled and cloud requests end
    to end; afterwards no log of the run contains any secret (client key, upstream key,
    admin token, NATS and Redis passwords), nor a near miss a client offered."""
    nats, redis = infra
    (tmp_path / "run").mkdir()
    stack = FaultStack(
        tmp_path / "run",
        prefix,
        nats.url.replace("nats://", "tls://"),
        redis.url,
        secure_config(),
        extra_env=credentials(tls),
    )
    stack.admin_token = ADMIN_TOKEN
    dsn = f"sqlite:///{tmp_path / 'audit.db'}"
    try:
        stack.start_sims()
        stack.start_controller("c1")
        stack.start_controller("c2")
        router = stack.start_router()
        stack.start_audit(dsn)
        await eventually(lambda: _resident(stack, "judge"), timeout=20)
        key = {"authorization": f"Bearer {CLIENT_KEY}"}
        async with httpx.AsyncClient(base_url=router.url, timeout=30) as client:
            for model in ("judge", "coder", "cloud"):
                response = await client.post(
                    "/v1/chat/completions", json=chat_body(model), headers=key
                )
                assert response.status_code == 200, response.text
                assert response.headers["x-hotseat-backend"] == model
            refused = await client.post(
                "/v1/chat/completions",
                json=chat_body("judge"),
                headers={"authorization": f"Bearer {NEAR_MISS_KEY}"},
            )
            assert refused.status_code == 401
        async with httpx.AsyncClient(base_url=stack.controllers["c1"].url, timeout=10) as admin:
            wrong = await admin.post(
                "/v1/pools/gpu0/unload", headers={"authorization": f"Bearer {NEAR_MISS_TOKEN}"}
            )
            assert wrong.status_code == 401

        # The audit rows are searched for secrets below: wait for all of them, every
        # event each publisher emitted (its buffer empty) stored, not merely the first few.
        published = (await publishers_flushed(stack.publishers()))["published"]
        assert published >= 4, published  # four requests at least, each with its event

        async def stored() -> bool:
            rows = await raw_rows(dsn, "SELECT count(*) FROM audit_events")
            return int(rows[0][0]) >= published  # type: ignore[call-overload]

        await eventually(stored, timeout=30, interval=0.1)
    finally:
        stack.stop()
    logs = sorted(stack.workdir.glob("*.log"))
    assert len(logs) >= 6, logs
    for log in logs:
        text = log.read_text(errors="replace")
        for secret in [*SECRETS, NEAR_MISS_KEY, NEAR_MISS_TOKEN]:
            assert secret not in text, f"{log.name} contains a secret ({secret[:6]}...)"
    rows = await raw_rows(dsn, "SELECT * FROM audit_events")
    assert not any(secret in str(row) for row in rows for secret in SECRETS)


async def _resident(stack: FaultStack, member: str) -> bool:
    async with httpx.AsyncClient(timeout=5) as client:
        response = await client.get(f"{stack.controllers['c1'].url}/v1/pools/gpu0")
    return bool(response.json()["resident"] == member)


@pytest.mark.parametrize(
    "override",
    [("HOTSEAT_NATS_PASSWORD", "wrong-nats-password-77"), ("HOTSEAT_NATS_TLS_CA", "")],
)
def test_wrong_nats_credentials_or_no_tls_are_refused(
    tmp_path: Path,
    prefix: str,
    tls: TlsFiles,
    infra: tuple[Managed, Managed],
    override: tuple[str, str],
) -> None:
    """A router with a wrong NATS password, or without the CA to verify the server, does
    not start (and does not print the password it was given)."""
    nats, _ = infra
    variable, value = override
    config = tmp_path / "hotseat.yaml"
    config.write_text(
        "backends: [{name: a, address: 'http://127.0.0.1:9'}]\n"
        "defaultRoute: a\nunknownModels: DefaultRoute\n"
    )
    env = {
        **credentials(tls),
        "HOTSEAT_CONFIG": str(config),
        "HOTSEAT_NATS_URL": nats.url.replace("nats://", "tls://"),
        "HOTSEAT_SUBJECT_PREFIX": prefix,
        variable: value,
    }
    if not value:
        env.pop(variable)
    with pytest.raises(LaunchError):
        start_service(
            "router", "hotseat-router", [], port=free_port(), log_dir=tmp_path, env=env, timeout=8
        )
    text = (tmp_path / "router.log").read_text(errors="replace")
    assert value == "" or value not in text
    assert NATS_PASSWORD not in text


def _tls_redis_binary() -> str | None:
    """A redis-server built with TLS (the bundled one is not), if this machine has one."""
    for candidate in (shutil.which("redis-server"), "/usr/bin/redis-server"):
        if candidate and Path(candidate).is_file():
            probe = subprocess.run(
                [candidate, "--port", "0", "--tls-port", "0", "--test-memory", "0"],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
            if "tls-port" not in probe.stderr.lower() + probe.stdout.lower():
                return candidate
    return None


async def test_redis_over_tls_with_a_password(
    tmp_path: Path, prefix: str, tls: TlsFiles, nats_server: Managed
) -> None:
    """The controller and the sims reach a TLS Redis (rediss://, CA from settings) with a
    password, and a pooled request is served end to end."""
    binary = _tls_redis_binary()
    if binary is None:
        pytest.skip("no redis-server with TLS support on this machine")
    port = free_port()
    argv = [
        binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
        "--tls-cert-file", str(tls.cert), "--tls-key-file", str(tls.key),
        "--tls-ca-cert-file", str(tls.ca), "--tls-auth-clients", "no",
        "--requirepass", REDIS_PASSWORD, "--save", "", "--appendonly", "no",
        "--dir", str(tmp_path),
    ]  # fmt: skip
    redis = spawn(
        "redis-tls",
        argv,
        url=f"rediss://127.0.0.1:{port}/0",
        log_path=tmp_path / "redis-tls.log",
        ready_marker="Ready to accept connections",
    )
    wait_for_marker(redis, 15)
    env = {
        "HOTSEAT_REDIS_TLS_CA": str(tls.ca),
        "HOTSEAT_REDIS_PASSWORD": REDIS_PASSWORD,
    }
    (tmp_path / "run").mkdir()
    stack = FaultStack(
        tmp_path / "run",
        prefix,
        nats_server.url,
        redis.url,
        pool_stack_config(),
        extra_env=env,
    )
    try:
        stack.start_sims()
        stack.start_controller("c1")
        router = stack.start_router()
        await eventually(lambda: _resident(stack, "judge"), timeout=20)
        async with httpx.AsyncClient(timeout=30) as client:
            response = await client.post(
                f"{router.url}/v1/chat/completions", json=chat_body("coder")
            )
        assert response.status_code == 200, response.text
        assert response.headers["x-hotseat-backend"] == "coder"
    finally:
        stack.stop()
        redis.stop()
