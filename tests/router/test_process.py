"""The ``hotseat-router`` entry point as users run it: flags, config errors, SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import subprocess

import httpx
import yaml

from hotseat.launcher import Managed, find_binary, free_port, start_service
from tests.support.waiting import eventually

CHAT = "/v1/chat/completions"


async def _logged(proc: Managed, text: str, *, times: int = 1) -> bool:
    return proc.log_text().count(text) >= times


def write_config(tmp_path, backends, **extra):
    path = tmp_path / "hotseat.yaml"
    path.write_text(yaml.safe_dump({"backends": backends, **extra}))
    return path


def router_args(nats_server, prefix, config, *more):
    return [
        "--config", str(config),
        "--nats-url", nats_server.url,
        "--subject-prefix", prefix,
        "--audit-stream", f"{prefix}_AUDIT",
        "--instance", f"router-{prefix}",
        *more,
    ]  # fmt: skip


async def start_router(tmp_path, nats_server, prefix, upstream_url, *more, **options) -> Managed:
    """The router process with one backend, ``a`` at ``upstream_url``, for every model."""
    config = write_config(
        tmp_path,
        [{"name": "a", "address": upstream_url}],
        defaultRoute="a",
        unknownModels="DefaultRoute",
    )
    return await asyncio.to_thread(
        start_service,
        "router",
        "hotseat-router",
        router_args(nats_server, prefix, config, *more),
        port=free_port(),
        log_dir=tmp_path,
        **options,
    )


def test_invalid_config_exits_2(tmp_path):
    """An invalid config stops the router with exit code 2 and the error's path."""
    path = tmp_path / "bad.yaml"
    path.write_text("rules:\n  - name: r\n    route: {backends: [nope]}\n")
    done = subprocess.run(
        [find_binary("hotseat-router"), "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert "rules[0].route.backends[0]" in done.stderr


def test_a_body_budget_below_the_body_limit_exits_2(tmp_path):
    """A body budget smaller than router.maxBodyBytes (a body the config allows could
    never be buffered) stops the router with exit code 2, naming both."""
    path = write_config(
        tmp_path,
        [{"name": "a", "address": "http://127.0.0.1:9"}],
        defaultRoute="a",
        unknownModels="DefaultRoute",
    )
    done = subprocess.run(
        [find_binary("hotseat-router"), "--config", str(path), "--body-budget-bytes", "1000"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "--body-budget-bytes (1000)" in done.stderr
    assert "router.maxBodyBytes (33554432)" in done.stderr


async def test_sigterm_lets_streams_finish(upstream, nats_server, prefix, tmp_path, audit):
    """On SIGTERM the router stops accepting, finishes the in-flight stream, flushes audit
    events and exits."""
    a = await upstream("a")
    a.mode = "stream"
    proc = await start_router(tmp_path, nats_server, prefix, a.url, "--shutdown-grace", "20")
    try:
        async with (
            httpx.AsyncClient(timeout=10) as http,
            http.stream(
                "POST",
                f"{proc.url}{CHAT}",
                json={"model": "m", "stream": True},
                headers={"x-hotseat-request-id": "in-flight"},
            ) as response,
        ):
            chunks = response.aiter_raw()
            assert b"from a" in await anext(chunks)
            proc.popen.send_signal(signal.SIGTERM)
            # uvicorn's log line is the only sign that it stopped accepting.
            await eventually(lambda: _logged(proc, "Shutting down"), timeout=30)
            try:
                async with httpx.AsyncClient(timeout=2) as fresh:
                    await fresh.get(f"{proc.url}/healthz")
                accepting = True
            except httpx.ConnectError:
                accepting = False
            assert not accepting
            a.gate.set()
            rest = b"".join([c async for c in chunks])
        assert rest.endswith(b"data: [DONE]\n\n")
        code = await asyncio.to_thread(proc.popen.wait, 20)
        # uvicorn re-raises the signal it handled once shutdown is complete.
        assert code in {0, -signal.SIGTERM}
        event = await audit.request_event("in-flight")
        assert event["outcome"] == "served"
        assert "router_stopping" in proc.log_text()
    finally:
        proc.stop()


async def test_two_workers_serve(upstream, nats_server, prefix, tmp_path):
    """--workers 2 starts two processes that both serve from the same port."""
    a = await upstream("a")
    # timeout: two workers importing the app on a loaded host
    proc = await start_router(tmp_path, nats_server, prefix, a.url, "--workers", "2", timeout=120)
    try:
        # Each worker logs once its lifespan is up; there is no other signal to await.
        await eventually(lambda: _logged(proc, "router_started", times=2), timeout=120)
        async with httpx.AsyncClient(timeout=10) as http:
            for _ in range(4):
                response = await http.post(f"{proc.url}{CHAT}", json={"model": "m"})
                assert response.status_code == 200
                assert response.headers["x-hotseat-backend"] == "a"
                assert "server" not in response.headers, response.headers
    finally:
        proc.stop()


async def test_no_answer_names_the_server_software(upstream, nats_server, prefix, tmp_path):
    """No response of the router process carries a ``server`` header: not the upstream's
    (a hop the router strips) and not one naming the HTTP server the router runs on."""
    a = await upstream("a")
    proc = await start_router(tmp_path, nats_server, prefix, a.url)
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            answers = [
                await http.post(f"{proc.url}{CHAT}", json={"model": "m"}),
                await http.post(f"{proc.url}{CHAT}", content=b"{not json"),
                await http.get(f"{proc.url}/healthz"),
                await http.get(f"{proc.url}/metrics"),
            ]
        assert [r.status_code for r in answers] == [200, 400, 200, 200]
        assert [r.headers.get("server") for r in answers] == [None] * 4
    finally:
        proc.stop()


def _served(metrics: str) -> float:
    """The served requests a scrape counts, all rules and backends together."""
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith("hotseat_router_requests_total{") and 'outcome="served"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_two_workers_count_every_request_whichever_answers_the_scrape(
    upstream, nats_server, prefix, tmp_path
):
    """--workers 2 with prometheus-client's multiprocess mode: each worker writes its
    samples to the shared directory, and a scrape, whichever worker answers it, counts
    the requests both served (no in-flight request is left counted)."""
    a = await upstream("a")
    shared = tmp_path / "metrics"
    shared.mkdir()
    (shared / "counter_1.db").write_bytes(b"stale")  # a previous run's: removed at start
    proc = await start_router(
        tmp_path,
        nats_server,
        prefix,
        a.url,
        "--workers",
        "2",
        env={"PROMETHEUS_MULTIPROC_DIR": str(shared)},
        timeout=120,
    )
    try:
        await eventually(lambda: _logged(proc, "router_started", times=2), timeout=120)
        sent = 0

        async def both_served() -> bool:
            nonlocal sent
            # A new connection each time: the kernel hands it to either worker.
            async with httpx.AsyncClient(timeout=10) as http:
                response = await http.post(f"{proc.url}{CHAT}", json={"model": "m"})
            assert response.status_code == 200
            sent += 1
            return len(list(shared.glob("counter_*.db"))) >= 2

        await eventually(both_served, timeout=120)
        for _ in range(6):
            async with httpx.AsyncClient(timeout=10) as http:
                metrics = (await http.get(f"{proc.url}/metrics")).text
            assert _served(metrics) == sent
            assert "hotseat_router_in_flight_requests" in metrics
            in_flight = [
                line for line in metrics.splitlines()
                if line.startswith("hotseat_router_in_flight_requests{")
            ]  # fmt: skip
            assert all(float(line.rsplit(" ", 1)[1]) == 0 for line in in_flight), in_flight
    finally:
        proc.stop()
