"""Router CPU per request, before against after, in one run: the router's code at a git
ref (``--baseline``, default ``main``) and at another (``--candidate``, default the
working tree), both serving at once on
the proxy core, measured alternately (A B, then B A, ...) against the fast upstream, and
vllm-router beside them when given. A shared, noisy host moves every figure of a round
alike; the ratio within a round is what a change is judged by.

    .venv/bin/python bench/router_ab.py [--baseline main] [--rounds 4] [--duration 4]
        [--connections 8,64] [--modes plain,stream] [--vllm-router /opt/vr/bin/vllm-router]
        [--profile DIR]   # a py-spy profile of each router (needs py-spy, --py-spy)

Same layout as ``bench/router_bench.py``: the proxies on core 0, the upstream, wrk and
nats-server on core 1. This is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from router_bench import (  # noqa: E402
    PROXY_CORE,
    cpu_seconds,
    fast_stack,
    start_vllm_router,
    stop_all,
    wrk,
)

from hotseat.launcher import (  # noqa: E402
    Managed,
    find_binary,
    free_port,
    spawn,
    wait_for_http,
)

SOURCES = ("services/router/src", "libs/common/src")


def checkout(ref: str, into: Path) -> str:
    """The router's and common library's sources at ``ref``, as a ``PYTHONPATH``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, *SOURCES], capture_output=True, check=True
    ).stdout
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return os.pathsep.join(str(into / s) for s in SOURCES)


def start_router(
    name: str, pythonpath: str | None, config: Path, nats: Managed, workdir: Path
) -> Managed:
    port = free_port()
    argv = [
        "taskset",
        "-c",
        PROXY_CORE,
        find_binary("hotseat-router"),
        "--config",
        str(config),
        "--port",
        str(port),
        "--nats-url",
        nats.url,
        "--log-level",
        "warning",
        "--subject-prefix",
        f"ab{port}",
        "--audit-stream",
        f"AB_{port}",
    ]
    env = {"PYTHONPATH": pythonpath} if pythonpath else None
    proc = spawn(
        name, argv, url=f"http://127.0.0.1:{port}", log_path=workdir / f"{name}.log", env=env
    )
    wait_for_http(proc, proc.url + "/readyz", 60)
    return proc


def writes(pid: int) -> int:
    """Write system calls (write, writev) ``pid`` made so far: a count noise cannot move."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("syscw:"):
            return int(line.split()[1])
    return 0


def point(
    proc: Managed, args: argparse.Namespace, workdir: Path, *, stream: bool, connections: int
) -> tuple[float, float, float, float, float]:
    """CPU µs per request, req/s, p50 and p99 (ms) of one wrk run against ``proc``, and
    its write system calls per request."""
    before, wrote = cpu_seconds(proc.pid), writes(proc.pid)
    result = wrk(
        proc.url + "/v1/chat/completions",
        connections=connections,
        seconds=args.duration,
        stream=stream,
        workdir=workdir,
    )
    if result.errors:
        sys.exit(f"{proc.name}: {result.errors} errors: {proc.log_text()[-2000:]}")
    used, wrote = cpu_seconds(proc.pid) - before, writes(proc.pid) - wrote
    requests = max(result.rps * args.duration, 1)
    return used / requests * 1e6, result.rps, result.p50_ms, result.p99_ms, wrote / requests


def profile(proc: Managed, args: argparse.Namespace, workdir: Path, out: Path) -> None:
    """A py-spy profile (raw collapsed stacks, native frames off) of ``proc`` under
    non-streaming load at 8 connections, then the functions by share of samples."""
    spy = subprocess.Popen(
        [
            args.py_spy,
            "record",
            "--pid",
            str(proc.pid),
            "--rate",
            "400",
            "--format",
            "raw",
            "--duration",
            str(args.duration + 1),
            "--output",
            str(out),
            "--nonblocking",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wrk(
        proc.url + "/v1/chat/completions",
        connections=8,
        seconds=args.duration,
        stream=args.profile_stream,
        workdir=workdir,
    )
    spy.wait(60)
    print(f"\nprofile of {proc.name}: {out}")
    for line in shares(out)[: args.top]:
        print("  " + line)


def shares(collapsed: Path) -> list[str]:
    """Functions by their share of samples (inclusive: on the stack), and the share
    spent in them alone (self)."""
    inclusive: dict[str, int] = defaultdict(int)
    own: dict[str, int] = defaultdict(int)
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        count = int(count_text)
        total += count
        frames = [
            f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].rsplit("/", 1)[-1]
            for f in stack.split(";")
            if f
        ]
        for frame in set(frames):
            inclusive[frame] += count
        if frames:
            own[frames[-1]] += count
    ranked = sorted(inclusive, key=lambda f: -inclusive[f])
    return [f"{inclusive[f] / total:6.1%} incl  {own[f] / total:6.1%} self  {f}" for f in ranked]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="main", help="git ref of the 'before' router")
    parser.add_argument("--candidate", help="git ref of the 'after' router (default: the tree)")
    parser.add_argument(
        "--candidate-path",
        help="a PYTHONPATH for the 'after' router instead of a ref (a build of the sources)",
    )
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--duration", type=int, default=4, help="seconds per point")
    parser.add_argument("--connections", default="8,64")
    parser.add_argument("--modes", default="plain,stream")
    parser.add_argument("--vllm-router", default=shutil.which("vllm-router"))
    parser.add_argument(
        "--together",
        action="store_true",
        help="load A and B at the same time (both see the same noise) instead of in turn",
    )
    parser.add_argument("--profile", type=Path, help="write py-spy profiles here instead")
    parser.add_argument("--profile-stream", action="store_true")
    parser.add_argument("--top", type=int, default=60)
    parser.add_argument("--py-spy", default=shutil.which("py-spy") or "/opt/pyspy/bin/py-spy")
    args = parser.parse_args()
    connections = [int(c) for c in args.connections.split(",")]
    modes = [m == "stream" for m in args.modes.split(",")]

    with tempfile.TemporaryDirectory(prefix="hotseat-ab-") as tmp:
        workdir = Path(tmp)
        baseline = checkout(args.baseline, workdir / "baseline")
        candidate = checkout(args.candidate, workdir / "candidate") if args.candidate else None
        candidate = args.candidate_path or candidate
        procs: list[Managed] = []
        with fast_stack(workdir) as (upstream, nats, config), contextlib.ExitStack() as stack:
            stack.callback(stop_all, procs)
            targets = {
                "A": start_router("A", baseline, config, nats, workdir),
                "B": start_router("B", candidate, config, nats, workdir),
            }
            procs += targets.values()
            if args.vllm_router:
                targets["vllm-router"] = start_vllm_router(args.vllm_router, upstream, workdir)
                procs.append(targets["vllm-router"])
            for name in targets:
                (workdir / name).mkdir()
            for proc in targets.values():  # warm-up: connections, code paths, caches
                for stream in modes:
                    wrk(
                        proc.url + "/v1/chat/completions",
                        connections=8,
                        seconds=1,
                        stream=stream,
                        workdir=workdir,
                    )
            if args.profile:
                args.profile.mkdir(parents=True, exist_ok=True)
                for name in ("A", "B"):
                    profile(targets[name], args, workdir, args.profile / f"{name}.txt")
                return 0
            cpu: dict[tuple[str, bool, int], list[float]] = defaultdict(list)
            syscalls: dict[tuple[str, bool, int], list[float]] = defaultdict(list)
            print(
                f"A = {args.baseline},"
                f" B = {args.candidate_path or args.candidate or 'working tree'};"
                f" {args.duration}s per point"
            )
            for n in range(args.rounds):
                order = list(targets) if n % 2 == 0 else ["B", "A", *list(targets)[2:]]
                for stream in modes:
                    for c in connections:
                        if args.together:
                            with concurrent.futures.ThreadPoolExecutor(len(order)) as pool:
                                at_once = {
                                    name: pool.submit(
                                        point, targets[name], args, workdir / name,
                                        stream=stream, connections=c,
                                    )
                                    for name in order
                                }  # fmt: skip
                        for name in order:
                            if args.together:
                                us, rps, p50, p99, wr = at_once[name].result()
                            else:
                                us, rps, p50, p99, wr = point(
                                    targets[name], args, workdir, stream=stream, connections=c
                                )
                            cpu[name, stream, c].append(us)
                            syscalls[name, stream, c].append(wr)
                            print(
                                f"  round {n + 1} {name:<11} {'stream' if stream else 'plain':<6}"
                                f" c={c:<3} {us:6.0f} us/req {rps:7.0f} req/s"
                                f"  p50 {p50:6.2f} ms  p99 {p99:7.2f} ms"
                                f"  {wr:5.2f} writes/req",
                                flush=True,
                            )
            print("\nmedians (CPU µs per request) and B against A, per round:")
            for stream in modes:
                for c in connections:
                    a, b = cpu["A", stream, c], cpu["B", stream, c]
                    saved = [x - y for x, y in zip(a, b, strict=True)]
                    ratio = [y / x for x, y in zip(a, b, strict=True)]
                    line = (
                        f"  {'stream' if stream else 'plain':<6} c={c:<3}"
                        f" A {statistics.median(a):6.0f}  B {statistics.median(b):6.0f}"
                        f"  B/A {statistics.median(ratio):5.2f}"
                        f" (rounds {', '.join(f'{r:.2f}' for r in ratio)})"
                        f"  saved {statistics.median(saved):5.0f} us/req"
                        f"  writes/req A {statistics.median(syscalls['A', stream, c]):4.2f}"
                        f" B {statistics.median(syscalls['B', stream, c]):4.2f}"
                    )
                    if ("vllm-router", stream, c) in cpu:
                        v = cpu["vllm-router", stream, c]
                        line += (
                            f"  vllm-router {statistics.median(v):5.0f}:"
                            f" A/v {statistics.median(a) / statistics.median(v):4.2f}x"
                            f" B/v {statistics.median(b) / statistics.median(v):4.2f}x"
                        )
                    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
