"""Where the router's p99 goes: event-loop lag and garbage-collector pauses under load.

Runs the real router (``hotseat_router.main``) in this process with two probes added
from outside its code: every garbage collection is timed (``gc.callbacks``, per
generation), and a task on the router's event loop sleeps 1 ms at a time and records
how late it wakes (the loop's lag: the longest stretch something held the loop). wrk
drives it at 8 connections against the fast local upstream while a JetStream takes the
audit events, exactly as ``bench/router_bench.py`` does; then the probes print.

    .venv/bin/python bench/router_stall.py [--duration 10] [--connections 8] [--stream]
        [--gc-freeze]   # what gc.freeze() after startup changes

This is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from hotseat.launcher import free_port  # noqa: E402

SAMPLE_S = 0.001


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def serve(argv: list[str], report: Path, freeze: bool) -> None:
    """The child: the router with the probes, writing ``report`` on SIGTERM."""
    pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
    started: dict[str, float] = {}

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started["t"] = time.perf_counter()
        elif "t" in started:
            pauses[info["generation"]].append(time.perf_counter() - started.pop("t"))

    gc.callbacks.append(on_gc)
    lags: list[float] = []

    async def sample_lag() -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(SAMPLE_S)
            lags.append(time.perf_counter() - before - SAMPLE_S)

    import uvicorn  # noqa: PLC0415 - only the child serves

    original_startup = uvicorn.Server.startup

    async def startup(self: uvicorn.Server, sockets: object = None) -> None:
        await original_startup(self, sockets=sockets)  # type: ignore[arg-type]
        asyncio.get_running_loop().create_task(sample_lag())
        if freeze:
            gc.collect()
            gc.freeze()
        for generation in pauses.values():
            generation.clear()

    uvicorn.Server.startup = startup  # type: ignore[method-assign]

    original_shutdown = uvicorn.Server.shutdown

    async def shutdown(self: uvicorn.Server, sockets: object = None) -> None:
        # Written before the shutdown: uvicorn re-raises SIGTERM once it has served.
        report.write_text(json.dumps({"gc": pauses, "lag": lags}))  # noqa: ASYNC240 - once
        await original_shutdown(self, sockets=sockets)  # type: ignore[arg-type]

    uvicorn.Server.shutdown = shutdown  # type: ignore[method-assign]
    from hotseat_router.main import main  # noqa: PLC0415

    main(argv)


def summarise(data: dict[str, object], seconds: float) -> None:
    gc_pauses: dict[str, list[float]] = data["gc"]  # type: ignore[assignment]
    lags: list[float] = data["lag"]  # type: ignore[assignment]
    print("garbage collections during the run:")
    for generation, pauses in gc_pauses.items():
        total = sum(pauses)
        longest = max(pauses, default=0)
        print(
            f"  gen {generation}: {len(pauses):6d} ({len(pauses) / seconds:7.1f}/s)"
            f"  p50 {percentile(pauses, 0.5) * 1e3:6.2f} ms  max {longest * 1e3:6.2f} ms"
            f"  total {total * 1e3:8.1f} ms"
        )
    print(f"event-loop lag ({len(lags)} samples of a {SAMPLE_S * 1e3:.0f} ms sleep):")
    for q in (0.5, 0.9, 0.99, 0.999):
        print(f"  p{q * 100:g}: {percentile(lags, q) * 1e3:7.2f} ms")
    print(f"  max: {max(lags, default=0) * 1e3:7.2f} ms")
    over = [lag for lag in lags if lag > 0.010]
    print(f"  stalls over 10 ms: {len(over)} ({len(over) / seconds:.2f}/s)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--gc-freeze", action="store_true")
    parser.add_argument("--serve", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        report, freeze, *argv = args.serve
        serve(argv, Path(report), freeze == "1")
        return 0

    from router_bench import PROXY_CORE, fast_stack, wrk  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="hotseat-stall-") as tmp:
        workdir = Path(tmp)
        router = None
        with fast_stack(workdir) as (_upstream, nats, config):
            try:
                port = free_port()
                report = workdir / "report.json"
                router = subprocess.Popen(
                    ["taskset", "-c", PROXY_CORE, sys.executable, __file__, "--serve", str(report),
                     "1" if args.gc_freeze else "0",
                     "--config", str(config), "--port", str(port), "--nats-url", nats.url,
                     "--log-level", "warning", "--subject-prefix", f"stall{port}",
                     "--audit-stream", f"STALL_{port}"],
                )  # fmt: skip
                url = f"http://127.0.0.1:{port}"
                deadline = time.monotonic() + 60
                import httpx  # noqa: PLC0415

                while time.monotonic() < deadline:
                    try:
                        if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                            break
                    except httpx.HTTPError:
                        time.sleep(0.2)
                path = url + "/v1/chat/completions"
                wrk(path, connections=8, seconds=2, stream=args.stream, workdir=workdir)
                result = wrk(
                    path,
                    connections=args.connections,
                    seconds=args.duration,
                    stream=args.stream,
                    workdir=workdir,
                )
                print(
                    f"wrk c={args.connections} {'stream' if args.stream else 'plain'}:"
                    f" {result.rps:.0f} req/s  p50 {result.p50_ms:.2f} ms"
                    f"  p99 {result.p99_ms:.2f} ms"
                    f"  errors {result.errors}"
                )
                router.send_signal(signal.SIGTERM)
                router.wait(30)
                summarise(json.loads(report.read_text()), args.duration + 2)
            finally:
                if router is not None and router.poll() is None:
                    router.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
