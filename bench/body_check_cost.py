"""What the router's body check (``hotseat_router.body.parse_body``) costs by body shape:
the process's peak memory growth and the time the check holds the event loop, for a
30 MiB body that is one long string and for one of 600,000 small objects. Each shape is
measured in a fresh process (peak RSS only grows).

    .venv/bin/python bench/body_check_cost.py
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time

import orjson

from hotseat_router.body import parse_body

MIB = 1 << 20
SHAPES = ("string", "objects")


def body(shape: str) -> bytes:
    if shape == "string":
        content = {"role": "user", "content": "x" * (30 * MIB)}
        return orjson.dumps({"model": "bench", "messages": [content]})
    small = [{"role": "user", "content": "hello world"} for _ in range(600_000)]
    return orjson.dumps({"model": "bench", "messages": small})


def measure(shape: str) -> None:
    data = body(shape)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    parse_body(data)
    seconds = time.perf_counter() - started
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    print(f"{shape:8} body {len(data) / MIB:5.1f} MiB  peak growth {grown:6.0f} MiB  "
          f"check {seconds:5.2f} s")  # fmt: skip


def main() -> None:
    if len(sys.argv) == 2 and sys.argv[1] in SHAPES:
        measure(sys.argv[1])
        return
    for shape in SHAPES:
        subprocess.run([sys.executable, __file__, shape], check=True)


if __name__ == "__main__":
    main()
