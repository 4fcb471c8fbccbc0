"""Router benchmark: throughput, latency and CPU per request of direct-to-upstream vs the
Hotseat router vs a minimal FastAPI + httpx proxy (the yardstick) vs the floor (the least
a Python proxy on the router's stack does per request, ``floor_proxy.py``) vs vllm-router
(a compiled OpenAI-compatible load balancer, when installed), non-streaming and
streaming, at several concurrency levels, and the router with one worker vs two.

Needs ``wrk`` (Debian: ``apt-get install -y wrk``), ``node`` and ``taskset``. The proxy
under test runs on core 0; the upstream (Node's http module), the load generator and NATS
run on core 1, so the proxy has one core of its own. vllm-router is a comparison only:
install it in a virtualenv of its own (``python -m venv /opt/vr && /opt/vr/bin/pip
install vllm-router``) and pass ``--vllm-router /opt/vr/bin/vllm-router`` (or have it on
PATH).

    .venv/bin/python bench/router_bench.py [--duration 5] [--connections 1,8,64]

This is a measurement, not a test: run it on a quiet machine and read the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from hotseat.launcher import (  # noqa: E402
    Managed,
    find_binary,
    free_port,
    spawn,
    start_nats,
    wait_for_http,
)

PROXY_CORE = "0"
LOAD_CORE = "1"
BODY = {"model": "bench", "messages": [{"role": "user", "content": "Say hello."}]}
LUA = """
wrk.method = "POST"
wrk.body = [[%s]]
wrk.headers["Content-Type"] = "application/json"
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests":%%d,"duration_us":%%d,"p50_us":%%d,"p99_us":%%d,'
    .. '"non2xx":%%d,"errors":%%d}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.status, e.connect + e.read + e.write + e.timeout))
end
"""


@dataclass
class Result:
    target: str
    mode: str
    connections: int
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    cpu_us: float | None = None
    """CPU time (user + system) the proxy spent per request: robust to a busy machine."""


def cpu_seconds(root: int) -> float:
    """User + system CPU seconds of ``root`` and its descendants so far."""
    ticks = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = (int(fields[11]) + int(fields[12])) / ticks
    wanted = {root}
    grew = True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in wanted and pid not in wanted:
                wanted.add(pid)
                grew = True
    return sum(times.get(pid, 0.0) for pid in wanted)


def need(binary: str, hint: str) -> str:
    path = shutil.which(binary)
    if path is None:
        sys.exit(f"{binary} not found: {hint}")
    return path


def wait_ready(proc: subprocess.Popen[bytes], marker: bytes, timeout: float = 15) -> None:
    if proc.stdout is None:
        sys.exit("no output pipe")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if marker in line:
            return
        if not line and proc.poll() is not None:
            break
    sys.exit(f"process did not print {marker!r}")


def wrk(url: str, *, connections: int, seconds: int, stream: bool, workdir: Path) -> Result:
    body = json.dumps({**BODY, "stream": stream}, separators=(",", ":"))
    script = workdir / ("stream.lua" if stream else "plain.lua")
    script.write_text(LUA % body)
    out = subprocess.run(
        [
            "taskset", "-c", LOAD_CORE, "wrk", "-t1", f"-c{connections}", f"-d{seconds}s",
            "--timeout", "10s", "-s", str(script), url,
        ],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    line = next(x for x in out.stdout.splitlines() if x.startswith("BENCH_JSON "))
    data = json.loads(line.removeprefix("BENCH_JSON "))
    return Result(
        target="",
        mode="stream" if stream else "plain",
        connections=connections,
        rps=data["requests"] / (data["duration_us"] / 1e6),
        p50_ms=data["p50_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        errors=data["non2xx"] + data["errors"],
    )


def stop_all(procs: list[Managed]) -> None:
    """Stop ``procs``, the last started first."""
    for proc in reversed(procs):
        proc.stop()


@contextlib.contextmanager
def fast_stack(workdir: Path) -> Iterator[tuple[str, Managed, Path]]:
    """The fast upstream (``fast_upstream.js``) and nats-server on the load core, and a
    router config sending every model to that upstream: its URL, the NATS, the config."""
    upstream_port = free_port()
    node = subprocess.Popen(
        ["taskset", "-c", LOAD_CORE, "node", str(ROOT / "bench" / "fast_upstream.js"),
         str(upstream_port)],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    nats: Managed | None = None
    try:
        wait_ready(node, b"ready")
        upstream = f"http://127.0.0.1:{upstream_port}"
        nats = start_nats(workdir / "nats", extra_args=())
        subprocess.run(
            ["taskset", "-pc", LOAD_CORE, str(nats.pid)], capture_output=True, check=True
        )
        config = workdir / "hotseat.yaml"
        config.write_text(
            yaml.safe_dump({
                "backends": [{"name": "fast", "address": upstream}],
                "rules": [{"name": "all", "route": {"backends": ["fast"]}}],
            })
        )  # fmt: skip
        yield upstream, nats, config
    finally:
        if nats is not None:
            nats.stop()
        node.terminate()
        node.wait(5)


def start_router(
    config: Path, nats: Managed, workdir: Path, *, workers: int, cores: str
) -> Managed:
    port = free_port()
    argv = [
        "taskset", "-c", cores, find_binary("hotseat-router"),
        "--config", str(config), "--port", str(port), "--nats-url", nats.url,
        "--workers", str(workers), "--log-level", "warning",
        "--subject-prefix", f"bench{port}", "--audit-stream", f"BENCH_{port}",
    ]  # fmt: skip
    proc = spawn(
        f"router-{workers}w", argv, url=f"http://127.0.0.1:{port}", log_path=workdir / "r.log"
    )
    wait_for_http(proc, proc.url + "/readyz", 60)
    if workers > 1:
        deadline = time.monotonic() + 60
        while proc.log_text().count("router_started") < workers and time.monotonic() < deadline:
            time.sleep(0.2)
    return proc


def start_granian(config: Path, nats: Managed, workdir: Path) -> Managed | None:
    """The same router app under granian (one worker, uvloop, one runtime thread) instead
    of uvicorn + httptools; ``None`` when granian is not installed. The router's
    connection limits (``connection.py``, a uvicorn protocol) do not apply under it."""
    binary = shutil.which("granian", path=str(Path(sys.executable).parent)) or shutil.which(
        "granian"
    )
    if binary is None:
        return None
    port = free_port()
    argv = [
        "taskset", "-c", PROXY_CORE, binary, "--interface", "asgi", "--factory",
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1", "--loop", "uvloop",
        "--runtime-mode", "st", "--runtime-threads", "1", "--http", "1", "--no-ws",
        "--log-level", "warning", "--no-access-log", "hotseat_router.app:app_from_env",
    ]  # fmt: skip
    env = {
        "HOTSEAT_CONFIG": str(config), "HOTSEAT_NATS_URL": nats.url,
        "HOTSEAT_LOG_LEVEL": "warning", "HOTSEAT_SUBJECT_PREFIX": f"bench{port}",
        "HOTSEAT_AUDIT_STREAM": f"BENCH_{port}",
    }  # fmt: skip
    proc = spawn(
        "router-granian", argv, url=f"http://127.0.0.1:{port}", log_path=workdir / "g.log",
        env=env,
    )  # fmt: skip
    wait_for_http(proc, proc.url + "/readyz", 60)
    return proc


def start_yardstick(upstream: str, workdir: Path) -> Managed:
    port = free_port()
    argv = [
        "taskset", "-c", PROXY_CORE, sys.executable, "-m", "uvicorn",
        "--app-dir", str(ROOT / "bench"), "yardstick_proxy:app",
        "--port", str(port), "--loop", "uvloop", "--http", "httptools",
        "--no-access-log", "--log-level", "warning",
    ]  # fmt: skip
    proc = spawn(
        "yardstick",
        argv,
        url=f"http://127.0.0.1:{port}",
        log_path=workdir / "y.log",
        env={"YARDSTICK_UPSTREAM": upstream},
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.post(proc.url + "/v1/chat/completions", json=BODY, timeout=2)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    return proc


def start_floor(upstream: str, workdir: Path) -> Managed:
    port = free_port()
    argv = [
        "taskset", "-c", PROXY_CORE, sys.executable, str(ROOT / "bench" / "floor_proxy.py"),
        str(port), upstream.rsplit(":", 1)[1],
    ]  # fmt: skip
    proc = spawn("floor", argv, url=f"http://127.0.0.1:{port}", log_path=workdir / "f.log")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.post(proc.url + "/v1/chat/completions", json=BODY, timeout=2).is_success:
                return proc
        time.sleep(0.1)
    sys.exit(f"the floor proxy did not answer: {proc.log_text()[-2000:]}")


def start_vllm_router(binary: str, upstream: str, workdir: Path) -> Managed:
    port = free_port()
    argv = [
        "taskset", "-c", PROXY_CORE, binary, "--host", "127.0.0.1", "--port", str(port),
        "--worker-urls", upstream, "--policy", "round_robin", "--log-level", "warning",
        "--disable-retries", "--disable-circuit-breaker",
    ]  # fmt: skip
    proc = spawn("vllm-router", argv, url=f"http://127.0.0.1:{port}", log_path=workdir / "v.log")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.post(proc.url + "/v1/chat/completions", json=BODY, timeout=2).is_success:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    else:
        sys.exit(f"vllm-router did not answer: {proc.log_text()[-2000:]}")
    return proc


def measure(
    target: str,
    url: str,
    args: argparse.Namespace,
    workdir: Path,
    modes: list[bool],
    *,
    pid: int | None = None,
) -> list[Result]:
    results = []
    for stream in modes:
        # Warm up connections and code paths before measuring.
        wrk(url, connections=8, seconds=args.warmup, stream=stream, workdir=workdir)
        for connections in args.connections:
            cpu_before = cpu_seconds(pid) if pid else 0.0
            result = wrk(
                url, connections=connections, seconds=args.duration, stream=stream, workdir=workdir
            )
            if pid:
                total = result.rps * args.duration
                result.cpu_us = (cpu_seconds(pid) - cpu_before) / max(total, 1) * 1e6
            result.target = target
            results.append(result)
            print(
                f"  {target:<12} {result.mode:<6} c={connections:<3} {result.rps:9.0f} req/s"
                f"  p50 {result.p50_ms:7.2f} ms  p99 {result.p99_ms:7.2f} ms"
                f"  errors {result.errors}"
                + (f"  cpu {result.cpu_us:6.0f} us/req" if result.cpu_us is not None else ""),
                flush=True,
            )
    return results


def find(results: list[Result], target: str, mode: str, connections: int) -> Result | None:
    return next(
        (r for r in results if (r.target, r.mode, r.connections) == (target, mode, connections)),
        None,
    )


def verdicts(results: list[Result], connections: list[int]) -> list[str]:
    lines = []

    def check(label: str, value: float, target: float, unit: str, *, at_most: bool = False) -> None:
        ok = value <= target if at_most else value >= target
        sign = "<=" if at_most else ">="
        verdict = "PASS" if ok else "MISS"
        lines.append(f"  {verdict}  {label}: {value:.2f}{unit} (target {sign} {target}{unit})")

    for mode in ("plain", "stream"):
        direct, router = find(results, "direct", mode, 1), find(results, "router-1w", mode, 1)
        if direct and router:
            check(
                f"{mode} c=1 router p50 overhead",
                router.p50_ms - direct.p50_ms,
                0.5,
                " ms",
                at_most=True,
            )
        router8 = find(results, "router-1w", mode, 8)
        if router8:
            check(
                f"{mode} c=8 router p99/p50", router8.p99_ms / router8.p50_ms, 5, "x", at_most=True
            )
        for c in (c for c in connections if c >= 8):
            router, vr = find(results, "router-1w", mode, c), find(results, "vllm-router", mode, c)
            if router and vr and router.cpu_us and vr.cpu_us:
                check(
                    f"{mode} c={c} router/vllm-router CPU per request",
                    router.cpu_us / vr.cpu_us,
                    2,
                    "x",
                    at_most=True,
                )
            floor = find(results, "floor", mode, c)
            if router and floor and vr and router.cpu_us and floor.cpu_us and vr.cpu_us:
                lines.append(
                    f"  NOTE  {mode} c={c} CPU per request: the floor"
                    f" {floor.cpu_us / vr.cpu_us:.2f}x vllm-router's,"
                    f" the router {router.cpu_us / floor.cpu_us:.2f}x the floor's"
                )
            router, yard = find(results, "router-1w", mode, c), find(results, "yardstick", mode, c)
            if router and yard:
                check(f"{mode} c={c} router/yardstick throughput", router.rps / yard.rps, 1.5, "x")
        top = max(connections)
        one, two = find(results, "router-1w", mode, top), find(results, "router-2w", mode, top)
        if one and two:
            check(f"{mode} c={top} two workers vs one", two.rps / one.rps, 1.6, "x")
    return lines


def table(results: list[Result]) -> list[str]:
    """The results as a Markdown table (for docs/benchmarks.md)."""
    lines = [
        "| target | mode | c | req/s | p50 ms | p99 ms | CPU µs/req |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        cpu = f"{r.cpu_us:.0f}" if r.cpu_us is not None else ""
        lines.append(
            f"| {r.target} | {r.mode} | {r.connections} | {r.rps:.0f} | {r.p50_ms:.2f}"
            f" | {r.p99_ms:.2f} | {cpu} |"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=5, help="seconds per measurement")
    parser.add_argument("--warmup", type=int, default=1, help="seconds of warm-up per target")
    parser.add_argument("--connections", default="1,8,64", help="concurrency levels")
    parser.add_argument(
        "--targets",
        default="direct,router,granian,yardstick,floor,vllm-router,workers",
        help="what to measure (comma-separated subset of the default)",
    )
    parser.add_argument(
        "--vllm-router",
        default=shutil.which("vllm-router"),
        help="the vllm-router binary (default: on PATH; skipped when absent)",
    )
    args = parser.parse_args()
    args.connections = [int(c) for c in args.connections.split(",")]
    need("wrk", "install it with `apt-get update && apt-get install -y wrk` (Debian/Ubuntu)")
    need("node", "install Node.js (`apt-get install -y nodejs`)")
    need("taskset", "install util-linux")
    if (os.cpu_count() or 1) < 2:
        sys.exit("needs at least 2 cores: the proxy on core 0, load and upstream on core 1")

    with tempfile.TemporaryDirectory(prefix="hotseat-bench-") as tmp:
        workdir = Path(tmp)
        procs: list[Managed] = []
        with fast_stack(workdir) as (upstream, nats, config), contextlib.ExitStack() as stack:
            stack.callback(stop_all, procs)
            path = "/v1/chat/completions"
            modes = [False, True]
            print(f"cores: proxy on {PROXY_CORE}, upstream + wrk + nats on {LOAD_CORE}; "
                  f"{args.duration}s per point", flush=True)  # fmt: skip
            targets = set(args.targets.split(","))
            results: list[Result] = []
            if "direct" in targets:
                results += measure("direct", upstream + path, args, workdir, modes)
            if "router" in targets:
                router = start_router(config, nats, workdir, workers=1, cores=PROXY_CORE)
                procs.append(router)
                results += measure(
                    "router-1w", router.url + path, args, workdir, modes, pid=router.pid
                )
                router.stop()
            if "granian" in targets:
                served = start_granian(config, nats, workdir)
                if served is None:
                    print("granian not installed: skipped", flush=True)
                else:
                    procs.append(served)
                    results += measure(
                        "granian-1w", served.url + path, args, workdir, modes, pid=served.pid
                    )
                    served.stop()
            if "yardstick" in targets:
                yard = start_yardstick(upstream, workdir)
                procs.append(yard)
                results += measure("yardstick", yard.url + path, args, workdir, modes, pid=yard.pid)
                yard.stop()
            if "floor" in targets:
                floor = start_floor(upstream, workdir)
                procs.append(floor)
                results += measure("floor", floor.url + path, args, workdir, modes, pid=floor.pid)
                floor.stop()
            if "vllm-router" in targets and args.vllm_router:
                vr = start_vllm_router(args.vllm_router, upstream, workdir)
                procs.append(vr)
                results += measure("vllm-router", vr.url + path, args, workdir, modes, pid=vr.pid)
                vr.stop()
            elif "vllm-router" in targets:
                print("vllm-router not installed: skipped (see --vllm-router)", flush=True)
            if "workers" in targets:
                router2 = start_router(config, nats, workdir, workers=2, cores="0,1")
                procs.append(router2)
                saved = args.connections
                args.connections = [max(saved)]
                results += measure(
                    "router-2w", router2.url + path, args, workdir, modes, pid=router2.pid
                )
                args.connections = saved
                router2.stop()
    print()
    for line in table(results):
        print(line)
    print("\ntargets:")
    for line in verdicts(results, args.connections):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
