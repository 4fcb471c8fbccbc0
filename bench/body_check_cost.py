"""What the router's body check (``hotseat_router.body.parse_body``) costs by body shape:
the process's peak memory growth and the time the check holds the event loop, for a
30 MiB body that is one long string and for one of 600,000 small objects. Each shape is
measured in a fresh process that holds only the body's bytes before the check (peak RSS
only grows).

    .venv/bin/python bench/body_check_cost.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


def peak_kib() -> int:
    """This process's peak resident memory (VmHWM: unlike ``ru_maxrss``, it does not
    start from the parent's peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


def measure(path: str) -> None:
    """In a fresh process: read the body (only its bytes, so the peak so far is the body's
    own), then check it."""
    with open(path, "rb") as file:  # noqa: PTH123 - one read
        data = file.read()
    before = peak_kib()
    started = time.perf_counter()
    parse_body(data)
    seconds = time.perf_counter() - started
    grown = (peak_kib() - before) / 1024
    print(f"body {len(data) / MIB:5.1f} MiB  peak growth {grown:6.0f} MiB  "
          f"check {seconds:5.2f} s")  # fmt: skip


def main() -> None:
    if len(sys.argv) == 2:
        measure(sys.argv[1])
        return
    with tempfile.TemporaryDirectory() as tmp:
        for shape in SHAPES:
            path = Path(tmp) / shape
            path.write_bytes(body(shape))
            print(f"{shape:8} ", end="", flush=True)
            subprocess.run([sys.executable, __file__, str(path)], check=True)


if __name__ == "__main__":
    main()
